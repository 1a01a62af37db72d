"""SentenceVote's selection rules compared: the exponential mechanism, permute-and-flip and
the sentence-count rule (:mod:`sentdp.count_calibrated`), on the same votes, by expected
macro-F1 (exact probabilities, no sampling noise).

Run: ``.venv/bin/python -m evaluation.vote_selection TAG [TAG ...]`` prints, per bundle, the
validation and test figures at the grid's epsilons; with ``--short``, also the corpus's
one-sentence documents, which the loader keeps out of every split (short texts the votes were
neither fitted nor chosen on). The vote's classifier and temperature are
the bundle's, so only the selection differs (whichever rule the bundle itself runs). Short
documents the bundle draws from the hard-vote table (format version 8) are scored here by the
vote's own rules, since the table is what these rules are compared against in
:mod:`evaluation.vote_lp`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluation.experiment import embedded_corpus
from evaluation.tables import bundles, print_table, tag_parser
from sentdp.bundle import Bundle
from sentdp.labels import exponential_vote_log_probs, vote_log_probs
from training.p_selection import DEFAULT_EPSILONS, soft_macro_f1
from training.settings import load_settings


def exponential_probs(deviations: npt.NDArray[np.int64], epsilon: float) -> npt.NDArray[np.float64]:
    """The exponential mechanism over the tallies at the vote's epsilon, floor included."""
    probs: npt.NDArray[np.float64] = np.exp(exponential_vote_log_probs(deviations, epsilon))
    return probs


def split_documents(
    corpus: Any, splits: Any, embeddings: Any, split: str
) -> tuple[list[Sequence[str]], list[npt.NDArray[Any]], list[int]]:
    """A split's documents as a vote reads them: sentence texts, sentence embeddings and the
    class index of each."""
    class_of = {label: i for i, label in enumerate(corpus.labels)}
    documents = list(getattr(splits, split))
    texts = [corpus.documents[i].sentences for i in documents]
    vectors = [embeddings.document(i) for i in documents]
    truth = [class_of[corpus.documents[i].label] for i in documents]
    return texts, vectors, truth


def compare(
    bundle: Bundle, epsilons: Sequence[float], short: bool = False
) -> list[tuple[str, float, float, float, float]]:
    """``(split, epsilon, exponential, permute-and-flip, by count)`` expected macro-F1 rows
    (by count: as drawn, so permute-and-flip for a cube vote, which is never drawn by count);
    with ``short``, a "short" split too: the documents the loader dropped for having one
    sentence."""
    if not bundle.votes:
        raise ValueError(f"{bundle.manifest.name} has no SentenceVote")
    settings = load_settings()
    corpus, splits, encoder, embeddings = embedded_corpus(bundle, settings)
    class_of = {label: i for i, label in enumerate(corpus.labels)}
    short_documents = [d for d in corpus.short if d.label in class_of] if short else []
    short_texts = [s for d in short_documents for s in d.sentences]
    short_vectors = encoder.encode(short_texts) if short_texts else np.zeros((0, 0))
    short_rows = np.cumsum([0] + [len(d.sentences) for d in short_documents])
    rows = []
    texts: Sequence[Sequence[str]]
    vectors: Sequence[npt.NDArray[Any]]
    for split in ("validation", "test", "short")[: 3 if short_documents else 2]:
        if split == "short":
            texts = [d.sentences for d in short_documents]
            vectors = [short_vectors[a:b] for a, b in itertools.pairwise(short_rows)]
            truth = [class_of[d.label] for d in short_documents]
        else:
            texts, vectors, truth = split_documents(corpus, splits, embeddings, split)
        counts = [len(sentences) for sentences in texts]
        by_vote: dict[int, list[npt.NDArray[np.int64]]] = {}
        for epsilon in epsilons:
            index = bundle.manifest.choice_for(epsilon).vote_index  # as the service runs it
            if index not in by_vote:
                vote = bundle.votes[index]
                by_vote[index] = [
                    vote.deviations(x, sentences)
                    for x, sentences in zip(vectors, texts, strict=True)
                ]
            deviations = by_vote[index]
            classes = bundle.votes[index].classes
            exponential = np.zeros((classes, classes))
            flip = np.zeros_like(exponential)
            by_count = np.zeros_like(exponential)
            for devs, label, n in zip(deviations, truth, counts, strict=True):
                exponential[label] += exponential_probs(devs, epsilon)
                flip[label] += np.exp(vote_log_probs(devs, epsilon))
                counted = n if bundle.votes[index].shape == "simplex" else None  # as drawn
                by_count[label] += np.exp(vote_log_probs(devs, epsilon, counted))
            f1 = [soft_macro_f1(m) for m in (exponential, flip, by_count)]
            rows.append((split, epsilon, f1[0], f1[1], f1[2]))
    return rows


def main() -> None:
    parser = tag_parser("python -m evaluation.vote_selection")
    parser.add_argument(
        "--short", action="store_true", help="also score the corpus's one-sentence documents"
    )
    args = parser.parse_args()
    header = [
        "split",
        "ε",
        "exponential mechanism",
        "permute-and-flip",
        "by sentence count (a cube vote: as drawn, permute-and-flip)",
    ]
    for bundle in bundles(args.tags):
        rows = [
            [split, f"{epsilon:g}", f"{exponential:.3f}", f"{flip:.3f}", f"{count:.3f}"]
            for split, epsilon, exponential, flip, count in compare(
                bundle, DEFAULT_EPSILONS, short=args.short
            )
        ]
        classes = bundle.vote.classes if bundle.vote else 0
        print_table(f"{bundle.manifest.name} ({classes} classes)", header, rows)


if __name__ == "__main__":
    main()
