"""SentenceVote's selection rule compared: the exponential mechanism against permute-and-flip,
on the same votes, by expected macro-F1 (exact probabilities, no sampling noise).

Run: ``.venv/bin/python -m evaluation.vote_selection TAG [TAG ...]`` prints, per bundle, the
validation and test figures at the grid's epsilons. The vote's classifier and temperature are
the bundle's, so only the selection differs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from evaluation.experiment import evaluation_corpus
from sentdp.bundle import Bundle
from sentdp.encoders import open_encoder
from sentdp.labels import exponential_vote_log_probs, vote_log_probs
from training.embeddings import embed_corpus
from training.p_selection import DEFAULT_EPSILONS, soft_macro_f1
from training.settings import load_settings
from training.store import load_from_store


def exponential_probs(deviations: npt.NDArray[np.int64], epsilon: float) -> npt.NDArray[np.float64]:
    """The exponential mechanism over the tallies at the vote's epsilon, floor included."""
    probs: npt.NDArray[np.float64] = np.exp(exponential_vote_log_probs(deviations, epsilon))
    return probs


def compare(bundle: Bundle, epsilons: Sequence[float]) -> list[tuple[str, float, float, float]]:
    """``(split, epsilon, exponential, permute-and-flip)`` expected macro-F1 rows."""
    if not bundle.votes:
        raise ValueError(f"{bundle.manifest.name} has no SentenceVote")
    settings = load_settings()
    corpus, splits = evaluation_corpus(bundle, settings)
    bundle.check_encoder()
    encoder = open_encoder(bundle.encoder_dir, bundle.encoder_backend, settings.device)
    embeddings = embed_corpus(corpus, encoder, settings.cache_dir, dict(bundle.manifest.splitter))
    class_of = {label: i for i, label in enumerate(corpus.labels)}
    rows = []
    for split in ("validation", "test"):
        documents = list(getattr(splits, split))
        truth = [class_of[corpus.documents[i].label] for i in documents]
        by_vote: dict[int, list[npt.NDArray[np.int64]]] = {}
        for epsilon in epsilons:
            index = bundle.manifest.choice_for(epsilon).vote_index  # as the service runs it
            if index not in by_vote:
                vote = bundle.votes[index]
                by_vote[index] = [
                    vote.deviations(embeddings.document(i), corpus.documents[i].sentences)
                    for i in documents
                ]
            deviations = by_vote[index]
            classes = bundle.votes[index].classes
            exponential = np.zeros((classes, classes))
            flip = np.zeros_like(exponential)
            for devs, label in zip(deviations, truth, strict=True):
                exponential[label] += exponential_probs(devs, epsilon)
                flip[label] += np.exp(vote_log_probs(devs, epsilon))
            rows.append((split, epsilon, soft_macro_f1(exponential), soft_macro_f1(flip)))
    return rows


def main() -> None:
    for tag in sys.argv[1:]:
        bundle = load_from_store(tag)
        print(f"\n{bundle.manifest.name} ({bundle.vote.classes if bundle.vote else 0} classes)")
        print("| split | ε | exponential mechanism | permute-and-flip |")
        print("|---|---|---|---|")
        for split, epsilon, exponential, flip in compare(bundle, DEFAULT_EPSILONS):
            print(f"| {split} | {epsilon:g} | {exponential:.3f} | {flip:.3f} |")


if __name__ == "__main__":
    main()
