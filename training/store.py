"""Bundles in the BentoML model store: written whole or not at all, read back by tag."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from sentdp.bundle import Bundle


def save_to_store(bundle: Bundle, name: str, metadata: dict[str, Any]) -> str:
    """Save ``bundle`` as a new version of BentoML model ``name``; return its tag.

    The bundle is written to a scratch folder and loaded back (validating every part) before
    it enters the store, so a failure at any step leaves the store as it was.
    """
    import bentoml

    with tempfile.TemporaryDirectory(prefix="sentdp-bundle-") as scratch:
        staged = Path(scratch) / "bundle"
        bundle.save(staged)
        Bundle.load(staged)
        labels = {"recipe": bundle.manifest.recipe, "corpus": bundle.manifest.corpus.name}
        with bentoml.models.create(name, labels=labels, metadata=metadata) as model:
            shutil.copytree(staged, model.path, dirs_exist_ok=True)
            tag = str(model.tag)
    return tag


def load_from_store(tag: str) -> Bundle:
    """The bundle of a BentoML model tag (``name:version`` or ``name:latest``)."""
    import bentoml

    return Bundle.load(Path(bentoml.models.get(tag).path))
