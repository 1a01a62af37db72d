"""What graded hard votes could add to the short-document table (evaluation only, not served).

:mod:`sentdp.vote_table` serves, for documents of n <= 10 sentences, the best data-free
epsilon-SentDP rule over *hard* votes: each sentence gives its whole vote to its likeliest
class. Here a sentence gives 0, 1 or 2 units to its likeliest class by how sure it is (below
``lo`` its top probability abstains, from ``hi`` it counts twice), so an unsure sentence such
as "fits true to size" weighs less than a sure one. A neighbouring document replaces one
sentence, i.e. one (class, units) contribution by any other. A symmetric rule is a table
``f(lam, t)`` over the partition ``lam`` of the class units (valid for n sentences when
``sum ceil(lam_i / 2) <= n``), and the program of :mod:`sentdp.vote_table` (every state
counted once, a plurality class as the target) carries over with these neighbours.

Measured on clothing reviews (bundle trained 2026-11-28 with ``sentdp-train --dataset
clothing-reviews``; validation chooses the grades and N, test is reported at that choice;
expected macro-F1): at epsilon 3 the plain table gives validation 0.4498 and test 0.4370,
graded votes (lo 0, hi 0.3, N = 7) 0.4677 and 0.4450; at epsilon 1, 0.2312 / 0.2267 against
0.2347 / 0.2292 (lo 0, hi 0, N = 8). The program runs at epsilon itself, without the served
table's slack, and is solved in floating point, not checked exactly as the served table is;
the tests check it by brute force over every vote vector.

Run: ``.venv/bin/python -m evaluation.graded_votes TAG [--epsilons 1 3] [--longest 8]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from sentdp.sampling import GAMMA
from sentdp.vote_table import Partition, histogram, multiplicity, partitions

FloatArray = npt.NDArray[np.float64]
Entry = tuple[Partition, int]
"""A state's partition of the class units and one class's units in it."""

GRADES: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (0.0, 0.3),
    (0.0, 0.4),
    (0.0, 0.5),
    (0.2, 0.4),
    (0.2, 0.5),
    (0.3, 0.5),
)
"""(lo, hi) top-probability thresholds tried: below lo a sentence abstains, from hi it gives
2 units; (0, 0) gives every sentence 2 units (the plain table's votes, in this program)."""


def needed(units: Sequence[int]) -> int:
    """The fewest sentences (of at most 2 units each) that give these class units."""
    return sum((u + 1) // 2 for u in units)


def states(sentences: int, classes: int) -> Iterator[Partition]:
    """Every partition of class units that ``sentences`` graded votes can give."""
    for total in range(2 * sentences + 1):
        for lam in partitions(total, 2 * sentences):
            if len(lam) <= classes and needed(lam) <= sentences:
                yield lam


def entries(lam: Partition, classes: int) -> list[Entry]:
    """Every (lam, t): the distinct units a class holds in ``lam`` (0 where some class has
    none)."""
    held = set(lam) | ({0} if len(lam) < classes else set())
    return [(lam, t) for t in sorted(held)]


def neighbour_pairs(sentences: int, classes: int) -> set[tuple[Entry, Entry]]:
    """Every (entry before, entry after) of one class when one sentence's contribution (none,
    or 1 or 2 units to one class) is replaced by any other."""
    pairs: set[tuple[Entry, Entry]] = set()
    for lam in states(sentences, classes):
        full = list(lam) + [0] * (classes - len(lam))
        firsts = [i for i in range(classes) if i == 0 or full[i] != full[i - 1]]
        removals = [(None, 0)] + [(i, g) for i in firsts for g in (1, 2) if full[i] >= g]
        for source, units in removals:
            rest = list(full)
            if source is not None:
                rest[source] -= units
            if needed(rest) > sentences - 1:
                continue  # no decomposition of lam holds this contribution
            targets: list[int | None] = [None]
            for value in sorted(set(rest)):
                if source is not None and rest[source] == value:
                    targets.append(source)  # the same class, its sentence's grade changed
                other = next((k for k in range(classes) if rest[k] == value and k != source), None)
                if other is not None:
                    targets.append(other)
            for target in targets:
                for added in (0,) if target is None else (1, 2):
                    after = list(rest)
                    if target is not None:
                        after[target] += added
                    for c in range(classes):
                        pairs.add(((lam, full[c]), (histogram(after), after[c])))
    return pairs


@lru_cache(maxsize=256)
def graded_table(sentences: int, classes: int, epsilon: float) -> dict[Entry, float]:
    """The data-free program's rule at ``epsilon``: each entry's probability of releasing one
    class, the sampler's floor included."""
    from scipy.sparse import coo_matrix

    from evaluation.vote_lp import solve_table_program

    lams = list(states(sentences, classes))
    keys = [entry for lam in lams for entry in entries(lam, classes)]
    index = {key: j for j, key in enumerate(keys)}
    pairs = sorted(neighbour_pairs(sentences, classes))
    rows = np.repeat(np.arange(len(pairs)), 2)
    cols = np.array([index[entry] for pair in pairs for entry in pair])
    values = np.tile([1.0, -math.exp(epsilon)], len(pairs))
    upper = coo_matrix((values, (rows, cols)), shape=(len(pairs), len(keys)))
    equal_rows, equal_cols, equal_values = [], [], []
    for s, lam in enumerate(lams):
        for entry in entries(lam, classes):
            equal_rows.append(s)
            equal_cols.append(index[entry])
            equal_values.append(multiplicity(entry, classes))
    equal = coo_matrix((equal_values, (equal_rows, equal_cols)), shape=(len(lams), len(keys)))
    objective = np.zeros(len(keys))
    for lam in lams:
        if lam:
            objective[index[(lam, lam[0])]] = -1.0
    solution = solve_table_program(objective, upper, equal, f"the graded program for n={sentences}")
    floor = GAMMA / classes
    return {key: floor + (1 - GAMMA) * float(solution[j]) for key, j in index.items()}


def graded_units(logits: FloatArray, lo: float, hi: float) -> list[int]:
    """(r,) class units of a document's sentences: each gives 0, 1 or 2 units to its
    likeliest class as its top softmax probability is below ``lo``, below ``hi``, or not."""
    values = np.asarray(logits, dtype=np.float64)
    probabilities = np.exp(values - values.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    top = probabilities.max(axis=1)
    units = np.where(top >= hi, 2, np.where(top >= lo, 1, 0))
    counts = np.bincount(probabilities.argmax(axis=1), weights=units, minlength=values.shape[1])
    return [int(c) for c in counts]


def table_probabilities(table: dict[Entry, float], units: Sequence[int]) -> FloatArray:
    """(r,) each class's probability in ``table`` for a document of these class units."""
    lam = histogram(units)
    return np.array([table[(lam, int(u))] for u in units], dtype=np.float64)


def compare(
    tag: str, epsilons: Sequence[float], longest: int = 8
) -> list[tuple[float, str, int, float, float]]:
    """Per epsilon: the plain table (as served) and each of :data:`GRADES`, for documents of
    at most N <= ``longest`` sentences and the bundle's vote for longer ones, as
    ``(epsilon, rule, N, validation, test)``; validation chooses N per rule."""
    from evaluation.experiment import embedded_corpus
    from evaluation.tables import bundles
    from evaluation.vote_selection import split_documents
    from training.settings import load_settings
    from training.vote_tables import (
        hard_table_probabilities,
        scores_by_limit,
        served_probabilities,
    )

    bundle = next(iter(bundles([tag])))
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    splits_of = {s: split_documents(corpus, splits, embeddings, s) for s in ("validation", "test")}
    rows = []
    for epsilon in epsilons:
        vote = bundle.votes[bundle.manifest.choice_for(epsilon).vote_index]
        r = vote.classes
        scores: dict[str, dict[str, list[float]]] = {}
        for split, (texts, vectors, truth) in splits_of.items():
            logits = [vote.logits(x, t) for x, t in zip(vectors, texts, strict=True)]
            counts = [len(x) for x in logits]
            own = served_probabilities(vote, logits, epsilon)
            rules = {"plain table": hard_table_probabilities(vote, logits, epsilon, longest)}
            for lo, hi in GRADES:
                rules[f"graded, lo {lo:g}, hi {hi:g}"] = [
                    table_probabilities(graded_table(len(x), r, epsilon), graded_units(x, lo, hi))
                    if len(x) <= longest
                    else None
                    for x in logits
                ]
            for rule, tabled in rules.items():
                by_limit = scores_by_limit(truth, counts, own, tabled, r, longest)
                scores.setdefault(rule, {})[split] = by_limit
        for rule, by_split in scores.items():
            chosen = int(np.argmax(by_split["validation"]))
            rows.append(
                (epsilon, rule, chosen, by_split["validation"][chosen], by_split["test"][chosen])
            )
    return rows


def main() -> None:
    from evaluation.tables import print_table, tag_parser

    parser = tag_parser("python -m evaluation.graded_votes")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--longest", type=int, default=8, help="largest N tried (at most 10)")
    args = parser.parse_args()
    for tag in args.tags:
        rows = [
            [f"{eps:g}", rule, str(n), f"{val:.4f}", f"{test:.4f}"]
            for eps, rule, n, val, test in compare(tag, args.epsilons, min(args.longest, 10))
        ]
        print_table(
            f"{tag}: tables for documents of at most N sentences (N chosen on validation)",
            ["ε", "rule", "N", "validation", "test"],
            rows,
        )


if __name__ == "__main__":
    main()
