"""The model bundle: everything the service needs, as a directory of self-describing parts.

Layout (format version 1)::

    manifest.json           BundleManifest: what, from which corpus, how, and which p per epsilon
    encoder/                the sentence-transformers files of G (the bundle is self-contained)
    recoder.json/.safetensors    H, absent when G' = G
    mechanism.safetensors   candidates F (m, d'), directions V (p_max, d'),
                            candidate_class_probs (m, r): C_dc's output for every candidate
    classifier_dc.*         C_dc, on recoded document means
    classifier_nonpriv.*    C_nonpriv, on plain G document means (a baseline)

Compatibility promise: fields of the manifest are never removed and never change meaning; new
fields are optional. A reader refuses a bundle whose ``format_version`` it does not know.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sentdp.encoders import MLP
from sentdp.errors import InputError
from sentdp.mechanism import DeepCandidate

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MECHANISM_FILE = "mechanism.safetensors"
ENCODER_DIR = "encoder"

FloatArray = npt.NDArray[np.float64]


class PChoice(BaseModel):
    """The number of directions chosen on validation for one grid epsilon."""

    model_config = ConfigDict(frozen=True)

    epsilon: float = Field(gt=0)
    p: int = Field(ge=1)
    validation_macro_f1: float | None = None


class CorpusRecord(BaseModel):
    """Where F, H and V came from. Every candidate is released verbatim when chosen."""

    model_config = ConfigDict(frozen=True)

    name: str
    sha256: str
    source: str
    is_public: bool
    documents: int
    split_seed: int
    splits: dict[str, int]
    labels: list[str]


class BundleManifest(BaseModel):
    """Versioned description of a bundle; see the module docstring for the promise it keeps."""

    model_config = ConfigDict(frozen=True)

    format: Literal["sentdp-bundle"] = "sentdp-bundle"
    format_version: int = FORMAT_VERSION
    name: str
    recipe: str
    created: str
    corpus: CorpusRecord
    encoder: dict[str, Any]
    splitter: dict[str, str]
    recoder: dict[str, Any] | None = None
    candidates: int
    dim: int
    p_max: int
    directions_seed: int
    p_table: list[PChoice]
    scores: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != FORMAT_VERSION:
            raise ValueError(
                f"bundle format version {value} is not supported (this sentdp reads "
                f"{FORMAT_VERSION}); use a matching sentdp release"
            )
        return value

    @field_validator("p_table")
    @classmethod
    def _sorted_grid(cls, value: list[PChoice]) -> list[PChoice]:
        if not value:
            raise ValueError("the p table needs at least one epsilon")
        return sorted(value, key=lambda c: c.epsilon)

    def p_for(self, epsilon: float) -> int:
        """p of the largest grid epsilon <= the request; below the grid, the smallest entry's."""
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise InputError(f"epsilon must be a finite number above 0, got {epsilon!r}")
        chosen = self.p_table[0]
        for entry in self.p_table:
            if entry.epsilon <= epsilon:
                chosen = entry
        return chosen.p


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: arrays in memory, the encoder as a directory path."""

    manifest: BundleManifest
    candidates: FloatArray
    directions: FloatArray
    candidate_class_probs: FloatArray
    recoder: MLP | None
    classifier_dc: MLP | None
    classifier_nonpriv: MLP | None
    encoder_dir: Path

    def __post_init__(self) -> None:
        m, dim = self.candidates.shape
        if self.directions.shape[1] != dim or self.directions.shape[0] != self.manifest.p_max:
            raise InputError(f"directions {self.directions.shape} do not fit candidates {(m, dim)}")
        if self.candidate_class_probs.shape != (m, len(self.manifest.corpus.labels)):
            raise InputError("the candidate class table does not match candidates and labels")
        if self.recoder is not None and self.recoder.output_dim != dim:
            raise InputError("the recoder's output size differs from the candidates'")
        if max(c.p for c in self.manifest.p_table) > self.manifest.p_max:
            raise InputError("the p table asks for more directions than the bundle holds")

    @property
    def labels(self) -> list[str]:
        return self.manifest.corpus.labels

    def mechanism(self, device: Any = None) -> DeepCandidate:
        return DeepCandidate(self.candidates, self.directions, device=device)

    def candidate_labels(self) -> npt.NDArray[np.int64]:
        """The class index C_dc gives each candidate (what /classify returns for it)."""
        labels: npt.NDArray[np.int64] = np.argmax(self.candidate_class_probs, axis=1).astype(
            np.int64
        )
        return labels

    def save(self, directory: Path) -> None:
        """Write the bundle into an empty or new directory (the encoder files are copied)."""
        from safetensors.numpy import save_file

        directory.mkdir(parents=True, exist_ok=True)
        if any(directory.iterdir()):
            raise InputError(f"{directory} is not empty; a bundle is written into a fresh folder")
        shutil.copytree(self.encoder_dir, directory / ENCODER_DIR)
        save_file(
            {
                "candidates": np.ascontiguousarray(self.candidates, dtype=np.float64),
                "directions": np.ascontiguousarray(self.directions, dtype=np.float64),
                "candidate_class_probs": np.ascontiguousarray(
                    self.candidate_class_probs, dtype=np.float64
                ),
            },
            str(directory / MECHANISM_FILE),
        )
        for name, mlp in (
            ("recoder", self.recoder),
            ("classifier_dc", self.classifier_dc),
            ("classifier_nonpriv", self.classifier_nonpriv),
        ):
            if mlp is not None:
                mlp.save(directory, name)
        (directory / MANIFEST).write_text(self.manifest.model_dump_json(indent=2))

    @classmethod
    def load(cls, directory: Path) -> Bundle:
        """Read a bundle written by :meth:`save`, checking its format version and shapes."""
        from safetensors.numpy import load_file

        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise InputError(f"{directory} holds no sentdp bundle (no {MANIFEST})")
        try:
            manifest = BundleManifest.model_validate(json.loads(manifest_path.read_text()))
        except ValueError as error:
            raise InputError(f"cannot read the bundle manifest in {directory}: {error}") from error
        arrays = load_file(str(directory / MECHANISM_FILE))

        def optional(name: str) -> MLP | None:
            return MLP.load(directory, name) if (directory / f"{name}.json").is_file() else None

        return cls(
            manifest=manifest,
            candidates=arrays["candidates"],
            directions=arrays["directions"],
            candidate_class_probs=arrays["candidate_class_probs"],
            recoder=optional("recoder"),
            classifier_dc=optional("classifier_dc"),
            classifier_nonpriv=optional("classifier_nonpriv"),
            encoder_dir=directory / ENCODER_DIR,
        )
