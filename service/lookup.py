"""Free label lookups: (model version, candidate ids already released) -> class labels.

A candidate is a public vector, so its label is post-processing and costs no budget. Bundles
of other versions of the served model are loaded from the BentoML store on first use.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

from sentdp.bundle import Bundle
from sentdp.errors import InputError
from service.errors import ApiError, Code
from service.schemas import CandidateLabel, ClassifyResponse
from service.views import label_of

_VERSION = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
"""A version (or an alias such as ``latest``) as the model store writes it: lowercase."""

StoreLoader = Callable[[str], tuple[str, str | None, Path]]
"""A tag -> (model name, version or None, folder) from the model store; raises when absent."""


def bentoml_store(tag: str) -> tuple[str, str | None, Path]:
    import bentoml

    found = bentoml.models.get(tag)
    return found.tag.name, found.tag.version, Path(found.path)


class Lookups:
    """Labels of released candidates of any stored version of the served model. A version is
    loaded once, under a lock of its own: a lookup in a version already here never waits
    for another version's load."""

    def __init__(self, bundle: Bundle, version: str, load: StoreLoader = bentoml_store) -> None:
        self.name = version.split(":", 1)[0]
        self._bundles: dict[str, Bundle] = {version: bundle}
        self._load = load
        self._lock = threading.Lock()
        """Guards ``_bundles`` and ``_loading``; never held while the store or a file is read."""
        self._loading: dict[str, threading.Lock] = {}

    def labels(self, model: str, candidates: list[int]) -> ClassifyResponse:
        """The labels of ``candidates`` in ``model`` (blocking: call off the event loop), under
        the version ``model`` names (an alias such as ``:latest`` answers with the version it
        stands for now)."""
        version, bundle = self.version(model)
        labels: list[CandidateLabel] = []
        for candidate in candidates:
            try:
                labels.append(label_of(bundle, candidate))
            except InputError as error:
                raise ApiError(Code.INVALID_CANDIDATE, f"model {version}: {error}") from None
        return ClassifyResponse(model=version, labels=labels)

    def bundle(self, model: str) -> Bundle:
        """The bundle of a stored version of the served model; 404 for anything else."""
        return self.version(model)[1]

    def version(self, model: str) -> tuple[str, Bundle]:
        """``(name:version, bundle)`` of a stored version of the served model (an alias
        resolved); 404 for anything else."""
        with self._lock:
            if model in self._bundles:
                return model, self._bundles[model]
        unknown = ApiError(
            Code.UNKNOWN_MODEL,
            "no such model version here: send the 'model' of a response of this server",
        )
        name, _, version_asked = model.partition(":")
        if name != self.name or not _VERSION.fullmatch(version_asked):
            raise unknown  # never hand the store a caller's string it would log
        try:
            name, version, path = self._load(model)
        except Exception:
            raise unknown from None
        if name != self.name or version is None:
            raise unknown
        resolved = f"{name}:{version}"  # an alias such as ':latest' resolves each time
        with self._lock:
            if resolved in self._bundles:
                return resolved, self._bundles[resolved]
            loading = self._loading.setdefault(resolved, threading.Lock())
        with loading:  # one load per version; lookups of other versions go on meanwhile
            with self._lock:
                if resolved in self._bundles:
                    return resolved, self._bundles[resolved]
            bundle = Bundle.load(path)
            with self._lock:
                self._bundles[resolved] = bundle
                self._loading.pop(resolved, None)
            return resolved, bundle
