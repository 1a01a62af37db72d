"""How far any vote could take a corpus's private label: the expected macro-F1 of the
vote's selection if every sentence of a document gave all its units to one class.

Two such unanimous votes are scored, per split and grid epsilon (permute-and-flip, exact
probabilities, the floor included, as the service draws a cube vote):

- **true class**: each sentence votes for its document's true class, the most any vote can
  do (a document of n sentences leads by n);
- **non-private label**: each sentence votes for the label the bundle's non-private
  classifier (C_nonpriv, on the document's mean embedding) gives its document;
- **tally's label**: each sentence votes for the class its document's tally leads with, under
  the vote the bundle runs at its largest grid epsilon (the votes' own non-private reading,
  which can beat C_nonpriv: it reads words).

The last two are what a vote gets whose sentences all agree with a non-private reading of
their document. Where both are below a target, a vote reaches it only if its sentences are
unanimous and more often right than either reading.

Run: ``.venv/bin/python -m evaluation.vote_ceiling TAG [TAG ...]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from evaluation.experiment import embedded_corpus
from evaluation.tables import bundles, print_table, tag_parser
from evaluation.vote_selection import split_documents
from sentdp.bundle import Bundle
from sentdp.labels import VOTE_UNITS, vote_probabilities
from training.classifiers import macro_f1
from training.p_selection import DEFAULT_EPSILONS, soft_macro_f1
from training.settings import load_settings


def unanimous_macro_f1(
    voted: Sequence[int], counts: Sequence[int], truth: Sequence[int], classes: int, epsilon: float
) -> float:
    """Expected macro-F1 of permute-and-flip at ``epsilon`` when each document's sentences
    all give their ``VOTE_UNITS`` to class ``voted[i]`` (so every other class is
    ``counts[i] * VOTE_UNITS`` behind)."""
    deviations = np.full((len(voted), classes), 0, dtype=np.int64)
    deviations += np.asarray(counts, dtype=np.int64)[:, None] * VOTE_UNITS
    deviations[np.arange(len(voted)), np.asarray(voted)] = 0
    confusion = np.zeros((classes, classes))
    np.add.at(confusion, np.asarray(truth), vote_probabilities(deviations, epsilon))
    return soft_macro_f1(confusion)


def ceilings(
    bundle: Bundle, epsilons: Sequence[float]
) -> list[tuple[str, float, float, float, float, float, float]]:
    """``(split, epsilon, true class, non-private label, its macro-F1, tally's label, its
    macro-F1)`` rows for the validation and test splits."""
    if bundle.classifier_nonpriv is None:
        raise ValueError(f"{bundle.manifest.name} has no non-private classifier")
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    classes = len(corpus.labels)
    tally_vote = bundle.votes[bundle.manifest.choice_for(max(epsilons)).vote_index]
    rows = []
    for split in ("validation", "test"):
        texts, vectors, truth = split_documents(corpus, splits, embeddings, split)
        documents = list(getattr(splits, split))
        predicted: npt.NDArray[np.int64] = np.argmax(
            bundle.classifier_nonpriv(embeddings.means(documents)), axis=1
        )
        leaders = [
            int(np.argmax(tally_vote.votes(x, sentences).sum(axis=0)))
            for x, sentences in zip(vectors, texts, strict=True)
        ]
        counts = [len(sentences) for sentences in texts]
        for epsilon in epsilons:
            rows.append(
                (
                    split,
                    epsilon,
                    unanimous_macro_f1(truth, counts, truth, classes, epsilon),
                    unanimous_macro_f1(list(predicted), counts, truth, classes, epsilon),
                    macro_f1(truth, predicted, classes),
                    unanimous_macro_f1(leaders, counts, truth, classes, epsilon),
                    macro_f1(truth, leaders, classes),
                )
            )
    return rows


def main() -> None:
    args = tag_parser("python -m evaluation.vote_ceiling").parse_args()
    header = [
        "split",
        "ε",
        "true class",
        "non-private label (C_nonpriv alone)",
        "tally's label (the tally alone)",
    ]
    for bundle in bundles(args.tags):
        rows = [
            [
                split,
                f"{eps:g}",
                f"{true:.3f}",
                f"{agreed:.3f} ({nonpriv:.3f})",
                f"{led:.3f} ({tally:.3f})",
            ]
            for split, eps, true, agreed, nonpriv, led, tally in ceilings(bundle, DEFAULT_EPSILONS)
        ]
        print_table(bundle.manifest.name, header, rows)


if __name__ == "__main__":
    main()
