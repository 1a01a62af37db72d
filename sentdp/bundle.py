"""The model bundle: everything the service needs, as a directory of self-describing parts.

A bundle shares one sentence encoder G and holds one or more *variants* of the mechanism,
each with its own recoder H, candidate set F, directions V and candidate labels. The p table
says, for every epsilon of a grid, which variant and how many directions to use (chosen on
validation at training time). The paper's recipe is a single variant; task-tuned bundles add
compact, label-specific variants. Candidate ids are global across variants: variant v owns
ids ``offset_v .. offset_v + m_v - 1``.

Layout (format versions 1 to 7)::

    manifest.json                   BundleManifest
    encoder/                        the sentence-transformers files of G (self-contained)
    classifier_nonpriv.*            C_nonpriv on plain G document means (a baseline)
    variants/<name>/mechanism.safetensors   candidates (m, d'), directions (p_max, d'),
                                            candidate_class_probs (m, r)
    variants/<name>/recoder.*       H (absent when G' = G, or when the variant shares an
                                    earlier variant's H: ``recoder_from``, prototype variants)
    variants/<name>/classifier_dc.* C_dc on recoded means (absent for label-tuned variants)
    label_vote.safetensors          SentenceVote's per-sentence classifiers: vote 0 as weights
                                    (r, d) and bias (r,), vote k > 0 as weights_k and bias_k
                                    (absent in bundles that predate the vote); votes that
                                    read words add word_weights[_k] (r, V) and word_idf (V,)
    label_words.json                the votes' public vocabulary (format version 4 only)

Compatibility promise: manifest fields are never removed and never change meaning; new fields
are optional. A reader refuses a bundle whose ``format_version`` it does not know. Version 2
adds variants that share an earlier variant's H (``recoder_from``): a version-1 reader would
ignore that field and run such a variant without its H, so these bundles say version 2.
Version 3 adds several votes, one chosen per epsilon (``PChoice.vote_index``): an older reader
would serve vote 0 at every epsilon, so bundles that use another vote say version 3.
Version 4 adds votes that read their sentences' words (``vote_words`` names the tokenizer):
an older reader would drop the word logits and serve another classifier than the one trained.
Version 5 adds votes drawn by the sentence-count rule (``vote_by_count``,
:mod:`sentdp.count_calibrated`): an older reader would draw every vote by permute-and-flip,
not the distribution validation scored.
Version 6 adds epsilons whose candidate is drawn by distance to the clipped mean
(``PChoice.selection`` "mean", :mod:`sentdp.mean_selection`): an older reader would draw it
by Tukey depth with a meaningless p.
Version 7 adds votes in the cube (``vote_shapes``, :data:`sentdp.labels.VOTE_SHAPES`): an
older reader would tally them as softmax votes, another classifier than the one validated.
Version 8 adds short documents drawn from the hard-vote table (``PChoice.vote_table``,
:mod:`sentdp.vote_table`): an older reader would draw them by the vote's own rule, not the
distribution validation scored.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sentdp.encoders import MLP, backend_of, encoder_files_sha256, file_sha256
from sentdp.errors import InputError
from sentdp.labels import SentenceVote, VoteShape
from sentdp.mean_selection import RADII, MeanCandidate
from sentdp.mechanism import DeepCandidate
from sentdp.vote_table import LONGEST
from sentdp.words import TOKENIZER, WordFeatures

FORMAT_VERSION = 8
"""The newest format this sentdp reads and writes (a bundle says the lowest version whose
readers run it as trained: 1 by default, 2 with shared H, 3 with more than one vote, 4 with
votes that read words, 5 with votes drawn by the sentence-count rule, 6 with candidates
drawn by distance to the clipped mean, 7 with votes in the cube)."""
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
MANIFEST = "manifest.json"
MECHANISM_FILE = "mechanism.safetensors"
VOTE_FILE = "label_vote.safetensors"
WORDS_FILE = "label_words.json"
ENCODER_DIR = "encoder"
VARIANTS_DIR = "variants"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

FloatArray = npt.NDArray[np.float64]


class PChoice(BaseModel):
    """Which variant, selection rule and its parameter (p directions or a radius) to use for
    one grid epsilon."""

    model_config = ConfigDict(frozen=True)

    epsilon: float = Field(gt=0)
    variant: str
    p: int = Field(ge=1)
    """Tukey-depth directions (``selection`` "depth"); 1, and unused, for "mean"."""
    validation_macro_f1: float | None = None
    label: Literal["candidate", "vote"] = "candidate"
    """Where /classify's label comes from at this epsilon: the released candidate's class
    (post-processing of /privatize), or SentenceVote (its own release)."""
    vote_macro_f1: float | None = None
    """Expected validation macro-F1 of SentenceVote at this epsilon (when the bundle has one)."""
    vote_index: int = Field(default=0, ge=0)
    """Which of the bundle's votes runs at this epsilon (0 unless validation chose another)."""
    selection: Literal["depth", "mean"] = "depth"
    """How the candidate is drawn: DeepCandidate's Tukey depth over p directions, or the
    exponential mechanism on distance to the document's clipped mean (format version 6)."""
    radius: float | None = None
    """The clipping radius R of "mean" (public: a quantile of public training sentences'
    recoded norms); None for "depth"."""
    vote_table: int = Field(default=0, ge=0, le=LONGEST)
    """The vote draws documents of at most this many sentences from the hard-vote table
    (:mod:`sentdp.vote_table`; 0: none; format version 8)."""

    def rule(self) -> str:
        """The entry's rule and its parameter: ``p=10`` or ``mean R=8.357``."""
        return f"p={self.p}" if self.radius is None else f"mean R={self.radius:.4g}"

    def describe(self) -> str:
        """The entry's variant and rule, as training prints and records it."""
        return f"{self.variant} {self.rule()}"

    @model_validator(mode="after")
    def _rule_parameters(self) -> PChoice:
        if self.selection == "depth" and self.radius is not None:
            raise ValueError("a radius belongs to the mean selection rule only")
        if self.selection == "mean":
            if self.radius is None or not RADII[0] <= self.radius <= RADII[1]:
                raise ValueError(
                    f"the mean selection rule needs a radius in [2**-100, 2**100], got "
                    f"{self.radius!r}"
                )
            if self.p != 1:
                raise ValueError("the mean selection rule uses no directions: p must be 1")
        return self


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


class VariantRecord(BaseModel):
    """One mechanism variant: its recipe, sizes and where its candidate ids start."""

    model_config = ConfigDict(frozen=True)

    name: str
    recipe: str
    dim: int = Field(ge=1)
    candidates: int = Field(ge=1)
    offset: int = Field(ge=0)
    p_max: int = Field(ge=1)
    directions_seed: int
    labels_from: str
    """How candidates got their class: "classifier" (C_dc) or "head" (the label-tuned head)."""
    recoder: dict[str, Any] | None = None
    recoder_from: str | None = None
    """The earlier variant whose H this one shares (prototype variants), stored once there."""
    prototypes: dict[str, Any] | None = None
    """For a prototype variant: whose candidates its centres summarise, and how."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"variant names are lowercase letters, digits, - and _: {value!r}")
        return value


class BundleManifest(BaseModel):
    """Versioned description of a bundle; see the module docstring for the promise it keeps."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    """Unknown fields are refused, not dropped: a field this reader does not know changes
    what the bundle serves (a version number stamped too low must not hide it)."""

    format: Literal["sentdp-bundle"] = "sentdp-bundle"
    format_version: int = 1
    name: str
    recipe: str
    created: str
    corpus: CorpusRecord
    encoder: dict[str, Any]
    splitter: dict[str, str]
    variants: list[VariantRecord] = Field(min_length=1)
    p_table: list[PChoice]
    scores: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
    vote_words: str | None = None
    """The tokenizer of the votes' word features (:data:`sentdp.words.TOKENIZER`) when any
    vote reads words; None otherwise."""
    vote_by_count: bool = False
    """Whether the simplex votes' selection uses the document's sentence count
    (:attr:`sentdp.labels.SentenceVote.by_count`; a cube vote never does); format version 5."""
    vote_shapes: list[VoteShape] | None = None
    """Each vote's shape, in the order of the votes (None: every vote is a simplex vote);
    format version 7 when any is ``cube``."""

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value not in READABLE_VERSIONS:
            raise ValueError(
                f"bundle format version {value} is not supported (this sentdp reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}); use a matching sentdp release"
            )
        return value

    @field_validator("p_table")
    @classmethod
    def _sorted_grid(cls, value: list[PChoice]) -> list[PChoice]:
        if not value:
            raise ValueError("the p table needs at least one epsilon")
        return sorted(value, key=lambda c: c.epsilon)

    @model_validator(mode="after")
    def _words_known(self) -> BundleManifest:
        if self.format_version < 4 and self.vote_words is not None:
            raise ValueError("votes that read words need bundle format version 4")
        if self.format_version < 5 and self.vote_by_count:
            raise ValueError("votes drawn by the sentence-count rule need bundle format version 5")
        if self.format_version < 7 and "cube" in (self.vote_shapes or ()):
            raise ValueError("votes in the cube need bundle format version 7")
        if self.format_version < 8 and any(c.vote_table for c in self.p_table):
            raise ValueError("short documents drawn from the vote table need format version 8")
        if self.vote_words not in (None, TOKENIZER):
            raise ValueError(
                f"the votes' tokenizer {self.vote_words!r} is not this sentdp's ({TOKENIZER!r})"
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> BundleManifest:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variant names must be unique")
        offset = 0
        for variant in self.variants:
            if variant.offset != offset:
                raise ValueError(f"variant {variant.name} should start at candidate id {offset}")
            offset += variant.candidates
        by_name = {v.name: v for v in self.variants}
        if self.format_version < 2 and any(v.recoder_from for v in self.variants):
            raise ValueError("variants that share an H need bundle format version 2")
        if self.format_version < 3 and any(c.vote_index for c in self.p_table):
            raise ValueError("a p table with more than one vote needs bundle format version 3")
        if self.format_version < 6 and any(c.selection != "depth" for c in self.p_table):
            raise ValueError("the mean selection rule needs bundle format version 6")
        for index, variant in enumerate(self.variants):
            if variant.recoder_from is None:
                continue
            earlier = {v.name: v for v in self.variants[:index]}
            base = earlier.get(variant.recoder_from)
            if base is None or base.recoder_from is not None or base.dim != variant.dim:
                raise ValueError(
                    f"variant {variant.name} shares H with {variant.recoder_from!r}, which must "
                    "be an earlier variant of the same dimension with an H of its own"
                )
        for choice in self.p_table:
            if choice.variant not in by_name:
                raise ValueError(f"the p table names an unknown variant {choice.variant!r}")
            if choice.p > by_name[choice.variant].p_max:
                raise ValueError("the p table asks for more directions than a variant holds")
        return self

    @property
    def candidates(self) -> int:
        """Candidates of all variants together (the range of candidate ids)."""
        return sum(v.candidates for v in self.variants)

    def choice_for(self, epsilon: float) -> PChoice:
        """The grid entry of the largest grid epsilon <= the request; below the grid, the
        smallest entry."""
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise InputError(f"epsilon must be a finite number above 0, got {epsilon!r}")
        chosen = self.p_table[0]
        for entry in self.p_table:
            if entry.epsilon <= epsilon:
                chosen = entry
        return chosen

    def p_for(self, epsilon: float) -> int:
        return self.choice_for(epsilon).p


@dataclass(frozen=True)
class Variant:
    """One mechanism variant in memory."""

    record: VariantRecord
    candidates: FloatArray
    directions: FloatArray
    candidate_class_probs: FloatArray
    recoder: MLP | None
    classifier_dc: MLP | None = None

    def __post_init__(self) -> None:
        m, dim = self.candidates.shape
        if (m, dim) != (self.record.candidates, self.record.dim):
            raise InputError(f"variant {self.record.name}: candidates do not match its record")
        if self.directions.shape != (self.record.p_max, dim):
            raise InputError(f"variant {self.record.name}: directions do not fit its candidates")
        if self.candidate_class_probs.shape[0] != m:
            raise InputError(f"variant {self.record.name}: the class table has the wrong size")
        if self.recoder is not None and self.recoder.output_dim != dim:
            raise InputError(f"variant {self.record.name}: the recoder's output size differs")

    def mechanism(self, device: Any = None) -> DeepCandidate:
        return DeepCandidate(self.candidates, self.directions, device=device)

    def mean_mechanism(self, radius: float) -> MeanCandidate:
        """The clipped-mean rule over this variant's candidates at radius R."""
        return MeanCandidate(self.candidates, radius)

    def candidate_labels(self) -> npt.NDArray[np.int64]:
        """The class index each candidate stands for (what /classify returns for it)."""
        labels: npt.NDArray[np.int64] = np.argmax(self.candidate_class_probs, axis=1).astype(
            np.int64
        )
        return labels

    def save(self, directory: Path) -> None:
        from safetensors.numpy import save_file

        directory.mkdir(parents=True, exist_ok=False)
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
        own_recoder = self.recoder if self.record.recoder_from is None else None
        for name, mlp in (("recoder", own_recoder), ("classifier_dc", self.classifier_dc)):
            if mlp is not None:
                mlp.save(directory, name)

    @classmethod
    def load(cls, directory: Path, record: VariantRecord, shared: MLP | None = None) -> Variant:
        """Read a variant; ``shared`` is the H of ``record.recoder_from`` when it has one."""
        from safetensors.numpy import load_file

        arrays = load_file(str(directory / MECHANISM_FILE))
        return cls(
            record=record,
            candidates=arrays["candidates"],
            directions=arrays["directions"],
            candidate_class_probs=arrays["candidate_class_probs"],
            recoder=shared if record.recoder_from else _optional_mlp(directory, "recoder"),
            classifier_dc=_optional_mlp(directory, "classifier_dc"),
        )


def _optional_mlp(directory: Path, name: str) -> MLP | None:
    return MLP.load(directory, name) if (directory / f"{name}.json").is_file() else None


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: variants in memory, the encoder as a directory path."""

    manifest: BundleManifest
    variants: tuple[Variant, ...]
    classifier_nonpriv: MLP | None
    encoder_dir: Path
    votes: tuple[SentenceVote, ...] = ()
    """The label mechanism's per-sentence classifiers, the p table saying which runs at which
    epsilon (none in bundles that predate the vote)."""

    def __post_init__(self) -> None:
        if [v.record for v in self.variants] != list(self.manifest.variants):
            raise InputError("the bundle's variants do not match its manifest")
        r = len(self.manifest.corpus.labels)
        if any(v.candidate_class_probs.shape[1] != r for v in self.variants):
            raise InputError("a variant's class table does not match the bundle's labels")
        if any(vote.classes != r for vote in self.votes):
            raise InputError("a vote classifier does not match the bundle's labels")
        self._check_votes()
        by_name = {v.record.name: v for v in self.variants}
        for choice in self.manifest.p_table:
            if choice.radius is not None:  # refuses candidates too far out for this radius
                by_name[choice.variant].mean_mechanism(choice.radius)
        for variant in self.variants:
            source = variant.record.recoder_from
            if source is not None and variant.recoder is not by_name[source].recoder:
                raise InputError(f"variant {variant.record.name} must share {source}'s H")

    def _check_votes(self) -> None:
        """The votes are the ones the manifest describes (shape, rule, words) and the p table
        names none they lack."""
        shapes = self.manifest.vote_shapes
        if shapes is not None and len(shapes) != len(self.votes):
            raise InputError(
                f"the manifest gives {len(shapes)} vote shapes for {len(self.votes)} votes"
            )
        if [vote.shape for vote in self.votes] != (shapes or ["simplex"] * len(self.votes)):
            raise InputError("the manifest's vote_shapes must be the votes' shapes")
        counted = [self.manifest.vote_by_count and v.shape == "simplex" for v in self.votes]
        if [vote.by_count for vote in self.votes] != counted:
            raise InputError("the manifest's vote_by_count must be every simplex vote's rule")
        reading = [vote.words for vote in self.votes if vote.words is not None]
        if bool(reading) != (self.manifest.vote_words is not None):
            raise InputError("the manifest's vote_words must say whether any vote reads words")
        if any(not words.same_as(reading[0]) for words in reading):
            raise InputError("the votes that read words must share one vocabulary")
        for choice in self.manifest.p_table:
            needed = choice.label == "vote" or choice.vote_index > 0
            if needed and choice.vote_index >= len(self.votes):
                raise InputError(
                    f"the p table asks for vote {choice.vote_index} at epsilon "
                    f"{choice.epsilon:g}, but the bundle has {len(self.votes)} votes"
                )

    @property
    def labels(self) -> list[str]:
        return self.manifest.corpus.labels

    @property
    def vote(self) -> SentenceVote | None:
        """Vote 0 (None in bundles without a vote): every vote has the same classes."""
        return self.votes[0] if self.votes else None

    def vote_for(self, epsilon: float) -> SentenceVote:
        """The vote that runs at ``epsilon`` (the p table's choice for it)."""
        index = self.manifest.choice_for(epsilon).vote_index
        if index >= len(self.votes):
            raise InputError(f"the bundle has no vote {index} (it has {len(self.votes)})")
        return self.votes[index]

    @property
    def encoder_backend(self) -> str:
        """How G runs for this bundle: the backend it was trained with, and must serve with."""
        return backend_of(self.manifest.encoder)

    def check_encoder(self, expected_backend: str | None = None) -> None:
        """Refuse a bundle whose encoder is not the one it was trained with: another backend
        than ``expected_backend`` (when given), or an ONNX graph other than the recorded one."""
        backend = self.encoder_backend
        if expected_backend is not None and expected_backend != backend:
            raise InputError(
                f"the bundle was trained with the {backend} encoder backend and cannot serve "
                f"with {expected_backend}: a different backend computes different embeddings "
                "than the ones H, the candidates and the p table were made from; train a "
                f"bundle with --encoder-backend {expected_backend}"
            )
        recorded = self.manifest.encoder.get("files_sha256")
        if recorded is not None and encoder_files_sha256(self.encoder_dir) != recorded:
            raise InputError(
                f"the bundle's encoder files in {self.encoder_dir} are not the ones it was "
                "trained with (their digest differs from the manifest's)"
            )
        if backend == "torch":
            return
        if recorded is None:  # the configs outside the graph decide its pooling: pin them
            raise InputError(
                f"the bundle's {backend} encoder records no digest of its files, so its "
                "tokenizer and pooling configs cannot be checked; retrain the bundle"
            )
        from sentdp.onnx_encoder import ONNX_FILES

        if backend not in ONNX_FILES:
            raise InputError(f"the bundle names an unknown encoder backend {backend!r}")
        graph = self.encoder_dir / ONNX_FILES[backend]
        if not graph.is_file():
            raise InputError(f"the bundle's {backend} encoder has no graph at {graph}")
        if file_sha256(graph) != self.manifest.encoder.get("onnx_sha256"):
            raise InputError(f"the bundle's {backend} graph {graph} is not the one it recorded")

    def check_opened_encoder(self, encoder: Any) -> None:
        """Refuse an encoder, opened from this bundle's files, that computes embeddings
        another way than the manifest recorded at training (what its ``describe()`` said):
        the same pinned files read by a different version of sentdp's pooling rules, say.
        Reads the encoder's attributes, so the graph is not hashed a second time."""
        opened = {
            "dim": encoder.dim,
            "max_tokens": encoder.max_tokens,
            "pooling": getattr(encoder, "pooling_record", None),
        }
        for key, value in opened.items():
            recorded = self.manifest.encoder.get(key)
            if recorded is not None and value != recorded:
                raise InputError(
                    f"the bundle's encoder was trained with {key} {recorded!r} but opens "
                    f"with {value!r}; retrain the bundle with this sentdp"
                )

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.record.name == name:
                return variant
        raise InputError(f"the bundle has no variant {name!r}")

    def locate(self, candidate: int) -> tuple[Variant, int]:
        """The variant owning a global candidate id, and the id inside that variant."""
        for variant in self.variants:
            local = candidate - variant.record.offset
            if 0 <= local < variant.record.candidates:
                return variant, local
        raise InputError(
            f"candidate {candidate} is not in this bundle (0 to {self.manifest.candidates - 1})"
        )

    def save(self, directory: Path) -> None:
        """Write the bundle into an empty or new directory (the encoder files are copied)."""
        directory.mkdir(parents=True, exist_ok=True)
        if any(directory.iterdir()):
            raise InputError(f"{directory} is not empty; a bundle is written into a fresh folder")
        shutil.copytree(self.encoder_dir, directory / ENCODER_DIR)
        for variant in self.variants:
            variant.save(directory / VARIANTS_DIR / variant.record.name)
        if self.classifier_nonpriv is not None:
            self.classifier_nonpriv.save(directory, "classifier_nonpriv")
        if self.votes:
            from safetensors.numpy import save_file

            arrays = {}
            words = None  # the votes that read words share it (checked on construction)
            for index, vote in enumerate(self.votes):
                suffix = f"_{index}" if index else ""
                arrays[f"weights{suffix}"], arrays[f"bias{suffix}"] = vote.weights, vote.bias
                if vote.words is not None and vote.word_weights is not None:
                    arrays[f"word_weights{suffix}"] = vote.word_weights
                    words = vote.words
            if words is not None:
                arrays["word_idf"] = words.idf
                vocabulary = {"tokenizer": TOKENIZER, "vocabulary": list(words.vocabulary)}
                (directory / WORDS_FILE).write_text(json.dumps(vocabulary))
            save_file(
                {k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / VOTE_FILE)
            )
        (directory / MANIFEST).write_text(self.manifest.model_dump_json(indent=2))

    @classmethod
    def load(cls, directory: Path) -> Bundle:
        """Read a bundle written by :meth:`save`, checking its format version and shapes."""
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise InputError(f"{directory} holds no sentdp bundle (no {MANIFEST})")
        try:
            manifest = BundleManifest.model_validate(json.loads(manifest_path.read_text()))
        except ValueError as error:
            raise InputError(f"cannot read the bundle manifest in {directory}: {error}") from error
        loaded: dict[str, Variant] = {}
        for record in manifest.variants:
            shared = loaded[record.recoder_from].recoder if record.recoder_from else None
            loaded[record.name] = Variant.load(
                directory / VARIANTS_DIR / record.name, record, shared
            )
        variants = tuple(loaded.values())
        return cls(
            manifest=manifest,
            variants=variants,
            classifier_nonpriv=_optional_mlp(directory, "classifier_nonpriv"),
            encoder_dir=directory / ENCODER_DIR,
            votes=_votes(directory, manifest.vote_by_count, manifest.vote_shapes),
        )


def _votes(
    directory: Path, by_count: bool, shapes: list[VoteShape] | None
) -> tuple[SentenceVote, ...]:
    if not (directory / VOTE_FILE).is_file():
        return ()
    from safetensors.numpy import load_file

    arrays = load_file(str(directory / VOTE_FILE))
    count = sum(1 for key in arrays if key.startswith("weights"))
    suffixes = [f"_{index}" if index else "" for index in range(count)]
    expected = {f"{part}{suffix}" for suffix in suffixes for part in ("weights", "bias")}
    reading = {f"word_weights{x}" for x in suffixes if f"word_weights{x}" in arrays}
    if not reading and (directory / WORDS_FILE).exists():
        raise InputError(f"{directory / WORDS_FILE} holds a vocabulary no vote reads")
    words = _words(directory, arrays) if reading else None
    expected |= reading | ({"word_idf"} if reading else set())
    if set(arrays) != expected:
        raise InputError(
            f"{directory / VOTE_FILE} should hold {sorted(expected)}, it holds {sorted(arrays)}"
        )
    shapes = shapes or ["simplex"] * count
    if len(shapes) != count:
        raise InputError(f"the manifest gives {len(shapes)} vote shapes, {VOTE_FILE} {count} votes")
    return tuple(
        SentenceVote(
            arrays[f"weights{x}"],
            arrays[f"bias{x}"],
            arrays.get(f"word_weights{x}"),
            words if f"word_weights{x}" in arrays else None,
            by_count and shape == "simplex",
            shape,
        )
        for x, shape in zip(suffixes, shapes, strict=True)
    )


def _words(directory: Path, arrays: dict[str, npt.NDArray[Any]]) -> WordFeatures:
    """The votes' shared vocabulary (``label_words.json``) and idf (``word_idf``)."""
    path = directory / WORDS_FILE
    try:
        stored = json.loads(path.read_text())
        tokenizer, vocabulary = stored["tokenizer"], stored["vocabulary"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"cannot read the votes' vocabulary {path}: {error}") from error
    if tokenizer != TOKENIZER:
        raise InputError(f"{path} uses tokenizer {tokenizer!r}, this sentdp has {TOKENIZER!r}")
    if "word_idf" not in arrays or not isinstance(vocabulary, list):
        raise InputError(f"{path} and {directory / VOTE_FILE} do not hold a vocabulary")
    try:
        return WordFeatures(tuple(vocabulary), arrays["word_idf"])
    except InputError as error:
        raise InputError(f"the votes' vocabulary in {path} is damaged: {error}") from error
