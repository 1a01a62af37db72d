"""The clipped-mean rule scored against the p table on a small real bundle."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.experiment import embedded_corpus
from evaluation.mean_selection import compare
from sentdp.encoders import recode
from training.settings import load_settings
from training.store import load_from_store

pytestmark = pytest.mark.slow


def test_the_mean_rule_is_scored_on_validation_beside_the_p_table(quick_bundle_tag: str) -> None:
    bundle = load_from_store(quick_bundle_tag)
    rows = compare(bundle, quantiles=(0.5, 0.9))
    table = bundle.manifest.p_table
    assert [row.epsilon for row in rows] == [choice.epsilon for choice in table]
    assert [row.table_f1 for row in rows] == [choice.validation_macro_f1 for choice in table]
    assert all(0 < row.mean_f1 <= 1 and row.mean_quantile in (0.5, 0.9) for row in rows)

    # the best cell again, by plain arithmetic: distances to the clipped mean, rounded to
    # 1/64, the plan at epsilon / 65 in deviation units (the floor and eta are negligible)
    row = rows[-1]
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    variant = bundle.variant(row.mean_variant)
    labels = variant.candidate_labels()
    classes = len(corpus.labels)
    confusion = np.zeros((classes, classes))
    for i in splits.validation:
        rows_ = recode(variant.recoder, embeddings.document(i))
        norms = np.linalg.norm(rows_, axis=1, keepdims=True)
        mu = (rows_ * np.minimum(1.0, row.mean_radius / norms)).mean(axis=0)
        k = len(rows_)
        devs = np.rint(64 * k * np.linalg.norm(variant.candidates - mu, axis=1) / row.mean_radius)
        weights = np.exp(-row.epsilon / 65 * (devs - devs.min()) / 4)
        truth = corpus.labels.index(corpus.documents[i].label)
        confusion[truth] += np.bincount(labels, weights / weights.sum(), minlength=classes)
    tp = np.diag(confusion)
    f1 = 2 * tp / (confusion.sum(axis=0) + confusion.sum(axis=1))
    assert float(np.nanmean(np.where(np.isnan(f1), 0, f1))) == pytest.approx(row.mean_f1, abs=2e-3)
