"""Bundles that name a selection rule per epsilon (format version 6): what the manifest
accepts, what it refuses, and that a saved bundle loads back drawing the same rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sentdp.bundle import Bundle, BundleManifest, PChoice
from sentdp.errors import InputError
from sentdp.mean_selection import MeanCandidate
from tests.service.fakes import RADIUS, embed, tiny_bundle


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"selection": "mean", "p": 1}, "needs a radius"),
        ({"selection": "mean", "p": 1, "radius": 0.0}, "needs a radius"),
        ({"selection": "mean", "p": 1, "radius": float("inf")}, "needs a radius"),
        ({"selection": "mean", "p": 1, "radius": 2.0**101}, "needs a radius"),
        ({"selection": "mean", "p": 4, "radius": 1.0}, "p must be 1"),
        ({"selection": "depth", "p": 4, "radius": 1.0}, "radius belongs to the mean"),
        ({"selection": "median", "p": 4}, "selection"),
    ],
)
def test_a_choice_s_rule_and_its_parameter_must_agree(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PChoice.model_validate({"epsilon": 1.0, "variant": "paper", **fields})


def test_a_choice_without_a_rule_is_tukey_depth() -> None:
    """Manifests written before version 6 have no ``selection``: they keep the paper's rule."""
    choice = PChoice.model_validate({"epsilon": 1.0, "variant": "paper", "p": 4})
    assert (choice.selection, choice.radius) == ("depth", None)


def test_a_bundle_keeps_its_mean_rule_and_says_version_6(tmp_path: Path) -> None:
    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", mean=True)
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    choice = loaded.manifest.choice_for(7.0)
    assert (choice.selection, choice.radius, choice.variant) == ("mean", RADIUS, "paper")
    assert loaded.manifest.choice_for(1.0).selection == "depth"
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["format_version"] == 6
    # a version-5 reader would draw that epsilon by Tukey depth: such a manifest is refused
    with pytest.raises(ValueError, match="mean selection rule needs bundle format version 6"):
        BundleManifest.model_validate({**manifest, "format_version": 5})
    # the loaded rule draws what the saved one drew: the same exact probabilities
    rows = np.stack([embed(s) for s in ("One.", "Two.", "Three.")])
    variant = loaded.variant("paper")
    expected = MeanCandidate(bundle.variant("paper").candidates, RADIUS).log_probs(rows, 5.0)
    np.testing.assert_array_equal(variant.mean_mechanism(RADIUS).log_probs(rows, 5.0), expected)


def test_a_radius_too_small_for_the_candidates_is_refused_on_load(tmp_path: Path) -> None:
    """Candidates 2**100 radii from the origin leave no document length whose deviations stay
    exact: the bundle is refused when it is built, not when a request arrives."""
    bundle = tiny_bundle(mean=True)
    table = [
        c.model_copy(update={"radius": 2.0**-100}) if c.selection == "mean" else c
        for c in bundle.manifest.p_table
    ]
    manifest = bundle.manifest.model_copy(update={"p_table": table})
    with pytest.raises(InputError, match="too far from the origin"):
        Bundle(manifest, bundle.variants, None, bundle.encoder_dir)


def test_a_choice_describes_its_variant_and_rule() -> None:
    depth = PChoice(epsilon=1.0, variant="paper", p=10)
    mean = PChoice(epsilon=1.0, variant="vote-4d", p=1, selection="mean", radius=8.3567)
    assert (depth.describe(), mean.describe()) == ("paper p=10", "vote-4d mean R=8.357")
