"""What an evaluation found, as typed values, and their ``results.json`` form.

The JSON form is the one the committed reports under ``reports/*/`` use: ``from_json`` reads
them and ``to_json`` writes the same keys in the same order, so ``sentdp-eval --render-only``
rewrites an existing ``results.json`` byte for byte. Keep that promise: never rename or
remove a key; a new one must be optional.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEEPCANDIDATE = "deepcandidate:"
"""Prefix of a DeepCandidate method; the bundle's name follows."""


def deepcandidate_method(bundle_name: str) -> str:
    return f"{DEEPCANDIDATE}{bundle_name}"


VOTE = "sentence_vote:"
"""Prefix of a SentenceVote method (the label mechanism of /classify); the bundle's name
follows."""


def vote_method(bundle_name: str) -> str:
    return f"{VOTE}{bundle_name}"


SERVED = "classify:"
"""Prefix of the label /classify serves with a bundle: per epsilon, the vote's or the
candidate's, as the bundle's validation chose; the bundle's name follows."""


def served_method(bundle_name: str) -> str:
    return f"{SERVED}{bundle_name}"


def epsilon_key(epsilon: float) -> str:
    """How an epsilon names its column in the JSON: ``1``, ``10``, ``0.5``."""
    return f"{epsilon:g}"


@dataclass(frozen=True)
class Score:
    """Macro-F1 over the trials of one method at one epsilon (or one k bin)."""

    mean: float
    sd: float
    trials: tuple[float, ...]
    p: int | None = None
    """DeepCandidate: the number of directions chosen on validation."""
    variant: str | None = None
    """DeepCandidate: the mechanism variant chosen on validation."""
    documents: int | None = None
    """k sweep: the number of test documents in the bin."""

    @classmethod
    def of(
        cls,
        values: Sequence[float],
        p: int | None = None,
        variant: str | None = None,
        documents: int | None = None,
    ) -> Score:
        """Mean and sample sd (0 for a single value) of ``values``."""
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.fmean(values), sd, tuple(values), p, variant, documents)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mean": self.mean, "sd": self.sd, "trials": list(self.trials)}
        optional = {"p": self.p, "variant": self.variant, "documents": self.documents}
        return data | {key: value for key, value in optional.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Score:
        return cls(
            mean=data["mean"],
            sd=data["sd"],
            trials=tuple(data["trials"]),
            p=data.get("p"),
            variant=data.get("variant"),
            documents=data.get("documents"),
        )


MethodScores = dict[str, Score]
"""One method's scores by epsilon key (see :func:`epsilon_key`)."""


def sweep_to_json(sweep: dict[str, MethodScores], methods: Sequence[str]) -> dict[str, Any]:
    """``methods``' rows of an epsilon sweep, in that order, as the JSON holds them."""
    return {
        method: {key: score.to_json() for key, score in sweep[method].items()} for method in methods
    }


def sweep_from_json(data: dict[str, Any]) -> dict[str, MethodScores]:
    return {
        method: {key: Score.from_json(entry) for key, entry in row.items()}
        for method, row in data.items()
    }


@dataclass(frozen=True)
class KSweep:
    """Scores at one epsilon on test documents binned by their number of sentences."""

    bins: list[str]
    methods: dict[str, list[Score | None]]
    """Per method, one score per bin (None: fewer than 5 documents in the bin)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "bins": list(self.bins),
            "methods": {
                method: [None if s is None else s.to_json() for s in rows]
                for method, rows in self.methods.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KSweep:
        return cls(
            bins=list(data["bins"]),
            methods={
                method: [None if s is None else Score.from_json(s) for s in rows]
                for method, rows in data["methods"].items()
            },
        )


@dataclass(frozen=True)
class PairedSweep:
    """Methods scored again on the test documents a subsampled baseline scored (word-level
    metric DP's), from the same predictions: a paired comparison with that baseline."""

    documents: int
    eps_sweep: dict[str, MethodScores]

    def to_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "eps_sweep": sweep_to_json(self.eps_sweep, list(self.eps_sweep)),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairedSweep:
        return cls(documents=data["documents"], eps_sweep=sweep_from_json(data["eps_sweep"]))


@dataclass(frozen=True)
class EvaluationResults:
    """Every number of one ``sentdp-eval`` run."""

    models: dict[str, str]
    """Bundle name -> recipe, for every bundle evaluated."""
    corpus: str
    test_documents: int
    epsilons: tuple[float, ...]
    trials: int
    k_epsilon: float
    methods: list[str]
    """Table order: the DeepCandidate bundles, then the baselines."""
    eps_sweep: dict[str, MethodScores]
    notes: list[str]
    k_sweep: KSweep
    seconds: float
    command: str | None = None
    """The command line that produced the results (absent from older files)."""
    on_mdp_documents: PairedSweep | None = None
    """Every method on word-level metric DP's documents (absent without that baseline, and
    from older files)."""
    split_seed: int | None = None
    """The seed of the corpus's train/validation/test split the bundles were scored on
    (absent from older files)."""

    def __post_init__(self) -> None:
        if set(self.eps_sweep) != set(self.methods):
            raise ValueError(
                f"the epsilon sweep scores {sorted(self.eps_sweep)}, "
                f"but the methods are {sorted(self.methods)}"
            )

    def score(self, method: str, epsilon: float) -> Score:
        return self.eps_sweep[method][epsilon_key(epsilon)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "models": dict(self.models),
            "corpus": self.corpus,
            "test_documents": self.test_documents,
            "epsilons": list(self.epsilons),
            "trials": self.trials,
            "k_epsilon": self.k_epsilon,
            "methods": list(self.methods),
            "eps_sweep": sweep_to_json(self.eps_sweep, self.methods),
            "notes": list(self.notes),
            "k_sweep": self.k_sweep.to_json(),
            "seconds": self.seconds,
        }
        if self.command is not None:
            data["command"] = self.command
        if self.on_mdp_documents is not None:
            data["on_mdp_documents"] = self.on_mdp_documents.to_json()
        if self.split_seed is not None:
            data["split_seed"] = self.split_seed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvaluationResults:
        return cls(
            models=dict(data["models"]),
            corpus=data["corpus"],
            test_documents=data["test_documents"],
            epsilons=tuple(data["epsilons"]),
            trials=data["trials"],
            k_epsilon=data["k_epsilon"],
            methods=list(data["methods"]),
            eps_sweep=sweep_from_json(data["eps_sweep"]),
            notes=list(data.get("notes", [])),
            k_sweep=KSweep.from_json(data["k_sweep"]),
            seconds=data["seconds"],
            command=data.get("command"),
            on_mdp_documents=(
                PairedSweep.from_json(data["on_mdp_documents"])
                if "on_mdp_documents" in data
                else None
            ),
            split_seed=data.get("split_seed"),
        )
