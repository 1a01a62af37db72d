"""How much a better selection rule could add to a vote: the best epsilon-SentDP rule over
hard-vote histograms, found by a linear program, against the served vote.

A *hard vote* gives each sentence's whole vote to its likeliest class (the argmax of the
bundle's vote logits). For documents of n sentences and r classes a symmetric selection rule
over hard votes is a table ``f(lam, t)``: the probability of releasing a class that holds t
of the n votes when the sorted vote counts are the partition ``lam`` of n. It is a
distribution for every ``lam`` (``sum_t mult(lam, t) f(lam, t) = 1``), and it is
epsilon-SentDP when ``f(lam, t) <= e^epsilon f(lam', t')`` for every neighbour ``lam'`` (one
vote moved from one class to another) and every class (its count t in ``lam``, t' in
``lam'``). These constraints are linear, so the rule of largest expected accuracy on a set of
documents is a linear program, one per n. The exponential mechanism at ``epsilon / 2`` per
vote is one such rule, so the program's optimum is never below it on the documents it is fitted
on (tested).

The first table :func:`main` prints fits the table on one half of the validation split and
scores it on the other half, against the served vote on the same half
(the bundle's cube or simplex vote through its own selection rule). Measured on clothing
reviews (2026-11-27, `sentdp-train --dataset clothing-reviews`, macro-F1 on validation's
second half): epsilon 1, served 0.197, hard votes by the exponential mechanism 0.158, by the
fitted table 0.234; epsilon 3: 0.445, 0.366 and 0.433. A table over hard votes gains at
epsilon 1 and loses at 3, where the cube vote's graded votes count for more than the better
rule. For unanimous documents the table's gain is larger still: a unanimous 5-sentence
document of 13 classes gets its class with probability 0.862 at epsilon 1, against 0.504
from the exponential mechanism (group privacy allows 0.925).

The second (:func:`cutoffs`) needs no fitting: :mod:`sentdp.vote_table`'s data-free table
(each histogram counted once, a plurality class as the target), exact and floored as the
sampler would draw it, for documents of at most N sentences and the served vote for longer
ones; validation chooses N per epsilon and test is reported at that N. Clothing reviews,
2026-11-27, test macro-F1 without and with it: epsilon 0.5, 0.120 -> 0.145 (N = 9); 1, 0.192
-> 0.228 (N = 9); 2, 0.337 -> 0.354 (N = 8); 3, 0.430 -> 0.437 (N = 3); 6, no table chosen.

Run: ``.venv/bin/python -m evaluation.vote_lp TAG [TAG ...] [--epsilons 1 3]``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.vote_table import (
    LONGEST,
    Entry,
    entries,
    histogram,
    histograms,
    neighbour_pairs,
)

FloatArray = npt.NDArray[np.float64]

LARGEST = LONGEST
"""Documents of more sentences than this keep the served rule."""

SPLITS = ("validation", "test")


@dataclass(frozen=True)
class HardVoteRule:
    """A symmetric selection rule over the hard votes of n-sentence documents: ``table[(lam,
    t)]`` is the probability of each class holding t votes when the counts are ``lam``."""

    sentences: int
    classes: int
    epsilon: float
    table: dict[Entry, float]

    def probabilities(self, counts: Sequence[int]) -> npt.NDArray[np.float64]:
        """(r,) the rule's probability of releasing each class, given its vote counts."""
        lam = histogram(counts)
        return np.array([self.table[(lam, int(c))] for c in counts], dtype=np.float64)


def fit_rule(
    sentences: int, classes: int, epsilon: float, documents: Sequence[tuple[Sequence[int], int]]
) -> HardVoteRule:
    """The epsilon-SentDP rule of largest expected accuracy on ``documents`` (each its
    per-class vote counts, summing to ``sentences``, and its true class)."""
    from scipy.sparse import lil_matrix

    variables = {key: j for j, key in enumerate(entries(sentences, classes))}
    pairs = sorted(neighbour_pairs(sentences, classes))
    bound = math.exp(epsilon)
    upper = lil_matrix((2 * len(pairs), len(variables)))
    for k, (before, after) in enumerate(pairs):
        u, v = variables[before], variables[after]
        upper[2 * k, u], upper[2 * k, v] = 1.0, -bound
        upper[2 * k + 1, v], upper[2 * k + 1, u] = 1.0, -bound
    states = sorted({lam for lam, _ in variables})
    equal = lil_matrix((len(states), len(variables)))
    for s, lam in enumerate(states):
        for t in {t for (other, t) in variables if other == lam}:
            equal[s, variables[(lam, t)]] = lam.count(t) if t else classes - len(lam)
    objective = np.zeros(len(variables))
    for counts, truth in documents:
        if sum(counts) != sentences:
            raise ValueError(f"a document's votes sum to {sum(counts)}, not {sentences}")
        objective[variables[(histogram(counts), int(counts[truth]))]] -= 1.0
    solution = solve_table_program(objective, upper, equal, f"the program for n={sentences}")
    table = {key: float(solution[j]) for key, j in variables.items()}
    return HardVoteRule(sentences, classes, epsilon, table)


def solve_table_program(objective: FloatArray, upper: Any, equal: Any, what: str) -> FloatArray:
    """The solution of a table's program: minimise ``objective . x`` subject to the ratio
    constraints ``upper x <= 0``, one distribution per state ``equal x = 1`` (sparse
    matrices) and ``0 <= x <= 1``; ``what`` names it in the error."""
    from scipy.optimize import linprog

    solved = linprog(
        objective,
        A_ub=upper.tocsr(),
        b_ub=np.zeros(upper.shape[0]),
        A_eq=equal.tocsr(),
        b_eq=np.ones(equal.shape[0]),
        bounds=(0.0, 1.0),
        method="highs",
    )
    if solved.status != 0:
        raise RuntimeError(f"{what} failed: {solved.message}")
    solution: FloatArray = solved.x
    return solution


def exponential_rule(sentences: int, classes: int, epsilon: float) -> HardVoteRule:
    """The exponential mechanism over hard-vote counts at ``epsilon / 2`` per vote, as a
    table (epsilon-SentDP: one moved vote changes each count by at most 1)."""
    table = {}
    for lam, full in histograms(sentences, classes):
        total = float(np.exp(epsilon / 2 * (np.asarray(full) - max(full))).sum())
        for t in set(full):
            table[(lam, t)] = math.exp(epsilon / 2 * (t - max(full))) / total
    return HardVoteRule(sentences, classes, epsilon, table)


def largest_ratio(rule: HardVoteRule) -> float:
    """The largest probability ratio of the rule between neighbouring histograms."""
    worst = 1.0
    for before, after in neighbour_pairs(rule.sentences, rule.classes):
        p, q = rule.table[before], rule.table[after]
        if p > 0 and q == 0:
            return math.inf
        if q > 0:
            worst = max(worst, p / q)
    return worst


def compare(
    tag: str, epsilons: Sequence[float], seed: int = 0
) -> list[tuple[float, float, float, float]]:
    """``(epsilon, served, exponential on hard votes, fitted table on hard votes)`` macro-F1
    on the second half of the bundle's validation split, the table fitted on the first half
    (documents above :data:`LARGEST` sentences keep the served rule in the last column)."""
    from evaluation.experiment import embedded_corpus
    from evaluation.tables import bundles
    from evaluation.vote_selection import split_documents
    from sentdp.labels import tally_deviations, vote_probabilities
    from training.p_selection import soft_macro_f1
    from training.settings import load_settings

    bundle = next(iter(bundles([tag])))
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    texts, vectors, truth = split_documents(corpus, splits, embeddings, "validation")
    classes = len(corpus.labels)
    order = np.random.default_rng(seed).permutation(len(truth))
    fitted_on = set(order[: len(order) // 2].tolist())
    rows = []
    for epsilon in epsilons:
        vote = bundle.votes[bundle.manifest.choice_for(epsilon).vote_index]
        logits = [vote.logits(x, t) for x, t in zip(vectors, texts, strict=True)]
        counts = [np.bincount(np.argmax(x, axis=1), minlength=classes).tolist() for x in logits]
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, x in enumerate(logits):
            by_length[len(x)].append(i)
        served = np.zeros((classes, classes))
        exponential = np.zeros((classes, classes))
        table = np.zeros((classes, classes))
        for n, members in sorted(by_length.items()):
            rule = None
            fit = [(counts[i], truth[i]) for i in members if i in fitted_on]
            if n <= LARGEST and fit:
                rule = fit_rule(n, classes, epsilon, fit)
            reference = exponential_rule(n, classes, epsilon) if n <= LARGEST else None
            for i in (i for i in members if i not in fitted_on):
                deviations = tally_deviations(vote.votes_from_logits(logits[i]))[None, :]
                own = vote_probabilities(deviations, epsilon, [n] if vote.by_count else None)[0]
                served[truth[i]] += own
                exponential[truth[i]] += (
                    reference.probabilities(counts[i]) if reference is not None else own
                )
                table[truth[i]] += rule.probabilities(counts[i]) if rule is not None else own
        rows.append(
            (epsilon, soft_macro_f1(served), soft_macro_f1(exponential), soft_macro_f1(table))
        )
    return rows


def cutoffs(
    tag: str, epsilons: Sequence[float]
) -> list[tuple[float, list[float], int, float, float]]:
    """Per epsilon: validation macro-F1 when documents of at most N sentences get the
    data-free table (N = 0, no table, to :data:`LARGEST`), the N validation chooses, and
    test's macro-F1 without the table and with it at that N (training's own scoring,
    :func:`training.vote_tables.limit_scores`, with the bundle's vote at each epsilon)."""
    from evaluation.experiment import embedded_corpus
    from evaluation.tables import bundles
    from evaluation.vote_selection import split_documents
    from training.settings import load_settings
    from training.vote_tables import choose_limit, limit_scores

    bundle = next(iter(bundles([tag])))
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    documents = {split: split_documents(corpus, splits, embeddings, split) for split in SPLITS}
    logits: dict[tuple[int, str], list[FloatArray]] = {}
    rows = []
    for epsilon in epsilons:
        index = bundle.manifest.choice_for(epsilon).vote_index
        vote = bundle.votes[index]
        scores = {}
        for split, (texts, vectors, truth) in documents.items():
            if (index, split) not in logits:
                logits[(index, split)] = [
                    vote.logits(x, t) for x, t in zip(vectors, texts, strict=True)
                ]
            scores[split] = limit_scores(vote, logits[(index, split)], truth, epsilon)
        chosen = choose_limit(scores["validation"])
        test = scores["test"]
        rows.append((epsilon, scores["validation"], chosen, test[0], test[chosen]))
    return rows


def main() -> None:
    from evaluation.tables import print_table, tag_parser

    parser = tag_parser("python -m evaluation.vote_lp")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0])
    args = parser.parse_args()
    header = ["ε", "served vote", "hard votes, exponential", "hard votes, fitted table"]
    for tag in args.tags:
        rows = [
            [f"{eps:g}", f"{served:.3f}", f"{exp:.3f}", f"{table:.3f}"]
            for eps, served, exp, table in compare(tag, args.epsilons)
        ]
        print_table(f"{tag}: validation, second half", header, rows)
        by_cutoff = [
            [f"{eps:g}", *(f"{v:.3f}" for v in scores), str(chosen), f"{before:.3f} -> {after:.3f}"]
            for eps, scores, chosen, before, after in cutoffs(tag, args.epsilons)
        ]
        print_table(
            f"{tag}: the data-free table for documents of at most N sentences",
            ["ε", *(f"val N={n}" for n in range(LARGEST + 1)), "chosen N", "test"],
            by_cutoff,
        )


if __name__ == "__main__":
    main()
