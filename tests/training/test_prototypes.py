"""Prototype candidate sets: how they are made, stored, chosen, and that they stay private."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.bundle import MANIFEST, VARIANTS_DIR, Bundle
from sentdp.encoders import recode
from sentdp.errors import InputError
from sentdp.sampling import draw_many, draw_words
from sentdp.text import TextLimits
from training.datasets import REGISTRY
from training.pipeline import TrainConfig, run_training
from training.prototypes import class_prototypes, prototype_variants
from training.settings import load_settings


def test_one_prototype_per_class_is_the_class_mean_and_k_means_is_reproducible() -> None:
    rng = np.random.default_rng(1)
    points = np.concatenate([rng.normal(0, 1, (30, 4)), rng.normal(5, 1, (20, 4))])
    classes = np.array([0] * 30 + [1] * 20)
    means, owners = class_prototypes(points, classes, 1, seed=0)
    np.testing.assert_array_equal(means[0], points[:30].mean(axis=0))
    np.testing.assert_array_equal(means[1], points[30:].mean(axis=0))
    np.testing.assert_array_equal(owners, [0, 1])
    four, owners = class_prototypes(points, classes, 4, seed=0)
    assert four.shape == (8, 4)
    np.testing.assert_array_equal(owners, [0] * 4 + [1] * 4)
    assert np.all(four[:4].mean(axis=1) < 2.5)
    assert np.all(four[4:].mean(axis=1) > 2.5)
    np.testing.assert_array_equal(four, class_prototypes(points, classes, 4, seed=0)[0])
    # A class with fewer points than k gives as many centres as it has points.
    assert class_prototypes(points[:33], classes[:33], 4, seed=0)[0].shape == (7, 4)


@pytest.fixture(scope="module")
def prototype_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """A real quick label-recipe bundle on a BBC News slice, with prototypes of 1 and 4 per
    class, saved and loaded back as the service would."""
    config = dataclasses.replace(
        TrainConfig(dataset="bbc-news", name="sentdp-proto", recipe="label", label_dims=(2,)),
        prototypes=(1, 4),
    ).quick()
    report = run_training(config, load_settings())
    folder = tmp_path_factory.mktemp("bundle") / "b"
    report.bundle.save(folder)
    return Bundle.load(folder)


def test_prototype_variants_share_their_base_h_and_are_stored_once(
    prototype_bundle: Bundle,
) -> None:
    names = [v.record.name for v in prototype_bundle.variants]
    assert names == ["label-2d", "label-2d-k1", "label-2d-k4"]
    base, k1, k4 = prototype_bundle.variants
    r = len(prototype_bundle.labels)
    assert (k1.record.candidates, k4.record.candidates) == (r, 4 * r)
    assert k1.record.offset == base.record.candidates
    assert k4.record.offset == base.record.candidates + r
    assert k1.recoder is base.recoder
    assert k4.recoder is base.recoder
    np.testing.assert_array_equal(k1.directions, base.directions)
    assert k1.record.recoder_from == "label-2d"
    assert k1.record.prototypes is not None
    assert k1.record.prototypes["per_class"] == 1
    # Each centre stands for the class it summarises.
    assert k1.candidate_labels().tolist() == list(range(r))
    assert k4.candidate_labels().tolist() == [c for c in range(r) for _ in range(4)]
    # Grid choices may name prototypes; global ids resolve to them.
    variant, local = prototype_bundle.locate(k4.record.offset + 3)
    assert variant.record.name == "label-2d-k4"
    assert local == 3


def test_a_manifest_sharing_h_with_a_later_or_unknown_variant_is_refused(
    prototype_bundle: Bundle, tmp_path: Path
) -> None:
    folder = tmp_path / "b"
    prototype_bundle.save(folder)
    assert not (folder / VARIANTS_DIR / "label-2d-k1" / "recoder.json").exists()
    manifest = json.loads((folder / MANIFEST).read_text())
    written = manifest["format_version"]
    # a version-1 reader must not run it without H (3 where it also holds a vote per epsilon,
    # 4 where a vote reads words, 5 where votes are drawn by the sentence-count rule, 7 where
    # a vote is in the cube, 8 where short documents are drawn from the hard-vote table)
    several = any(c["vote_index"] for c in manifest["p_table"])
    words = 4 if manifest.get("vote_words") else 3 if several else 2
    counted = 5 if manifest.get("vote_by_count") else words
    cube = 7 if "cube" in (manifest.get("vote_shapes") or ()) else counted
    assert written == (8 if any(c.get("vote_table") for c in manifest["p_table"]) else cube)
    manifest["format_version"] = 1
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="format version"):
        Bundle.load(folder)
    manifest["format_version"] = written
    manifest["variants"][1]["recoder_from"] = "label-2d-k4"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="shares H with 'label-2d-k4'"):
        Bundle.load(folder)


def test_prototype_sizes_must_be_positive(prototype_bundle: Bundle) -> None:
    base = prototype_bundle.variants[0]
    classes = np.zeros(base.record.candidates, dtype=np.int64)
    with pytest.raises(InputError, match="1 or more"):
        prototype_variants(base, classes, (0,), 0, 0)


@pytest.fixture(scope="module")
def documents(encoder) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """G embeddings of real BBC News documents of 2, 5 and 12 sentences."""
    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    picked = [corpus.documents[i].sentences for i in (3, 400, 1200)]
    return [encoder.encode(s[:k]) for s, k in zip(picked, (2, 5, 12), strict=True)]


def test_neighbours_change_every_candidate_set_by_at_most_epsilon(
    prototype_bundle: Bundle, documents: list[np.ndarray]
) -> None:
    """Exact log-probability ratios for real documents and adversarial replacements, in the
    full set and in each prototype set of the same H."""
    rng = np.random.default_rng(5)
    worst: dict[str, float] = {}
    for variant in prototype_bundle.variants:
        mechanism = variant.mechanism()
        for document in documents:
            for position in (0, len(document) - 1):
                for replacement in (
                    rng.normal(size=384) * 1e6,
                    -document[position] * 100,
                    np.zeros(384),
                    document[(position + 1) % len(document)],
                ):
                    neighbour = document.copy()
                    neighbour[position] = replacement
                    a, b = recode(variant.recoder, document), recode(variant.recoder, neighbour)
                    for eps in (0.5, 1.0, 3.0):
                        for p in (1, 3):
                            gap = np.max(
                                np.abs(
                                    mechanism.log_probs(a, eps, p) - mechanism.log_probs(b, eps, p)
                                )
                            )
                            assert gap <= eps + 1e-9, (variant.record.name, eps, p, gap)
                            name = variant.record.name
                            worst[name] = max(worst.get(name, 0.0), gap / eps)
    # The bound is nearly reached in the small sets too: they do respond to the data.
    assert worst["label-2d-k1"] > 0.4, worst
    assert worst["label-2d-k4"] > 0.4, worst


def test_a_prototype_set_samples_its_exact_distribution(
    prototype_bundle: Bundle, documents: list[np.ndarray]
) -> None:
    """Chi-square of 100,000 draws from a real document's plan in the 4-per-class set."""
    variant = prototype_bundle.variant("label-2d-k4")
    mechanism = variant.mechanism()
    document = recode(variant.recoder, documents[2])
    epsilon, draws = 1.0, 100_000
    (plan,) = mechanism.plan_batch([document], [epsilon], [3])
    chosen = draw_many(plan, draw_words(np.random.default_rng(10), draws))
    expected = np.exp(mechanism.log_probs(document, epsilon, 3)) * draws
    observed = np.bincount(chosen, minlength=mechanism.m)
    assert expected.min() >= 5
    assert chisquare(observed, expected * draws / expected.sum()).pvalue > 1e-3
    wrong = np.exp(mechanism.log_probs(document, 3.0 * epsilon, 3)) * draws
    assert chisquare(observed, wrong * draws / wrong.sum()).pvalue < 1e-6
