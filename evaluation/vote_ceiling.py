"""How far any vote could take a corpus's private label: the expected macro-F1 of the
vote's selection if every sentence of a document gave all its units to one class.

Three such unanimous votes are scored, per split and grid epsilon, by two rules (exact
probabilities, the floor included): permute-and-flip alone, as the service draws a cube vote,
and with the hard-vote table (:mod:`sentdp.vote_table`) for every document of at most
:data:`~sentdp.vote_table.LONGEST` sentences, as the service draws a short document where the
bundle's limit N allows (a unanimous document's hard votes are all for its class, which the
table releases more surely than permute-and-flip: on clothing reviews' test split at epsilon
1, 0.696 against 0.569 for the true class):

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
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from evaluation.experiment import embedded_corpus
from evaluation.tables import bundles, print_table, tag_parser
from evaluation.vote_selection import split_documents
from sentdp.bundle import Bundle
from sentdp.labels import VOTE_UNITS, vote_probabilities
from sentdp.vote_table import LONGEST, hard_vote_table, makes_table
from training.classifiers import macro_f1
from training.p_selection import DEFAULT_EPSILONS, soft_macro_f1
from training.settings import load_settings


def unanimous_macro_f1(
    voted: Sequence[int],
    counts: Sequence[int],
    truth: Sequence[int],
    classes: int,
    epsilon: float,
    longest: int = 0,
) -> float:
    """Expected macro-F1 when each document's sentences all give their ``VOTE_UNITS`` to
    class ``voted[i]`` (so every other class is ``counts[i] * VOTE_UNITS`` behind): a
    document of at most ``longest`` sentences is drawn from the hard-vote table (where one
    is made for its count), any other by permute-and-flip at ``epsilon``."""
    deviations = np.full((len(voted), classes), 0, dtype=np.int64)
    deviations += np.asarray(counts, dtype=np.int64)[:, None] * VOTE_UNITS
    deviations[np.arange(len(voted)), np.asarray(voted)] = 0
    probabilities = vote_probabilities(deviations, epsilon)
    for i, (v, n) in enumerate(zip(voted, counts, strict=True)):
        if n <= longest and makes_table(n, classes, epsilon):
            hard = [0] * classes
            hard[v] = n
            probabilities[i] = hard_vote_table(n, classes, epsilon).probabilities(hard)
    confusion = np.zeros((classes, classes))
    np.add.at(confusion, np.asarray(truth), probabilities)
    return soft_macro_f1(confusion)


class Ceiling(NamedTuple):
    """One split and epsilon's ceilings: each unanimous vote's expected macro-F1 by
    permute-and-flip alone and with the table (``..._table``), and each non-private
    reading's own macro-F1."""

    split: str
    epsilon: float
    true: float
    true_table: float
    agreed: float
    agreed_table: float
    nonprivate: float
    led: float
    led_table: float
    tally: float


def ceilings(bundle: Bundle, epsilons: Sequence[float]) -> list[Ceiling]:
    """The :class:`Ceiling` of the validation and test splits at each epsilon."""
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
            by_rule = {
                longest: [
                    unanimous_macro_f1(voted, counts, truth, classes, epsilon, longest)
                    for voted in (truth, list(predicted), leaders)
                ]
                for longest in (0, LONGEST)
            }
            (true, agreed, led), (true_table, agreed_table, led_table) = by_rule.values()
            rows.append(
                Ceiling(
                    split,
                    epsilon,
                    true,
                    true_table,
                    agreed,
                    agreed_table,
                    macro_f1(truth, predicted, classes),
                    led,
                    led_table,
                    macro_f1(truth, leaders, classes),
                )
            )
    return rows


def main() -> None:
    args = tag_parser("python -m evaluation.vote_ceiling").parse_args()
    header = [
        "split",
        "ε",
        "true class: flip / table",
        "non-private label: flip / table (C_nonpriv alone)",
        "tally's label: flip / table (the tally alone)",
    ]
    for bundle in bundles(args.tags):
        rows = [
            [
                c.split,
                f"{c.epsilon:g}",
                f"{c.true:.3f} / {c.true_table:.3f}",
                f"{c.agreed:.3f} / {c.agreed_table:.3f} ({c.nonprivate:.3f})",
                f"{c.led:.3f} / {c.led_table:.3f} ({c.tally:.3f})",
            ]
            for c in ceilings(bundle, DEFAULT_EPSILONS)
        ]
        print_table(bundle.manifest.name, header, rows)


if __name__ == "__main__":
    main()
