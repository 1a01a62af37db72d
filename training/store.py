"""Bundles in the BentoML model store: written whole or not at all, read back by tag."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from sentdp.bundle import Bundle
from sentdp.errors import InputError

# BentoML reports each model save (and each CLI command) to its makers unless told not to; the
# CLIs that reach the store through this module (sentdp-train, sentdp-eval, evaluation's
# scripts) do not send them unless the caller sets BENTOML_DO_NOT_TRACK=false.
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")


def save_to_store(
    bundle: Bundle,
    name: str,
    metadata: dict[str, Any],
    commit_guard: AbstractContextManager[None] | None = None,
) -> str:
    """Save ``bundle`` as a new version of BentoML model ``name``; return its tag.

    The bundle is written to a scratch folder and loaded back (validating every part) before
    it enters the store, so a failure at any step leaves the store as it was. ``commit_guard``
    is entered around the copy into the store (``sentdp-train`` holds stop signals there).
    """
    import bentoml

    with tempfile.TemporaryDirectory(prefix="sentdp-bundle-") as scratch:
        staged = Path(scratch) / "bundle"
        bundle.save(staged)
        Bundle.load(staged)
        labels = {"recipe": bundle.manifest.recipe, "corpus": bundle.manifest.corpus.name}
        with (
            commit_guard or nullcontext(),
            bentoml.models.create(name, labels=labels, metadata=metadata) as model,
        ):
            shutil.copytree(staged, model.path, dirs_exist_ok=True)
            tag = str(model.tag)
    return tag


def check_store() -> None:
    """Refuse, before any training, a BentoML store that cannot be read (``BENTOML_HOME`` a
    file, or a folder that cannot be made), which would otherwise fail only at the save."""
    import bentoml
    from bentoml.exceptions import NotFound

    try:  # one name's folder, not every model's (a model being saved has no model.yaml yet)
        bentoml.models.get("sentdp-store-check:latest")
    except NotFound:
        pass
    except OSError as error:
        raise _unusable_store(error) from None


def _unusable_store(error: OSError) -> InputError:
    return InputError(
        f"the BentoML model store cannot be used (check BENTOML_HOME): {error.strerror or error}"
    )


def load_from_store(tag: str) -> Bundle:
    """The bundle of a BentoML model tag (``name:version`` or ``name:latest``); a tag that is
    not one, or not in the store, is an :class:`~sentdp.errors.InputError`."""
    import bentoml
    from bentoml.exceptions import BentoMLException, NotFound

    try:
        model = bentoml.models.get(tag)
    except NotFound:
        raise InputError(f"no model {tag!r} in the BentoML store") from None
    except OSError as error:
        raise _unusable_store(error) from None
    except (ValueError, BentoMLException) as error:
        raise InputError(f"{tag!r} is not a BentoML model tag: {error}") from None
    return Bundle.load(Path(model.path))


def check_new_tag(name: str) -> str:
    """``name`` as the store will hold it (BentoML's tags are lower case); refuse, before any
    training, a name the store would refuse only at the end: not a BentoML tag, the version
    ``latest``, or a version already stored."""
    import bentoml
    from bentoml.exceptions import BentoMLException, NotFound

    try:
        tag = bentoml.Tag.from_taglike(name.lower())
    except (ValueError, BentoMLException) as error:
        raise InputError(f"--out {name!r} is not a BentoML model tag: {error}") from None
    if tag.version is None:
        return str(tag)
    if tag.version == "latest":
        raise InputError(f"--out {name!r}: 'latest' names the newest version, not a new one")
    try:
        bentoml.models.get(tag)
    except NotFound:
        return str(tag)
    raise InputError(f"--out {name!r}: the store already holds that version")
