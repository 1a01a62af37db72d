"""Deliberately broken builds of sentdp, for the audit's power tests (never shipped).

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that has
one. A test server started with this folder on ``PYTHONPATH`` and ``SENTDP_TEST_MUTANT=name``
therefore runs the broken code in every one of its processes (the gateway's and the
worker's), through the real HTTP path; without the variable nothing changes.

- ``epsilon-doubled``: the utility's sensitivity taken as 1/2 instead of 1, i.e. the
  exponential mechanism run at 2 epsilon;
- ``fixed-randomness``: every draw reads the same random word, so each document has one fixed
  output (a seeded generator, or a cache of outputs per document);
- ``naive-splitter``: text cut at every period, so one of sentdp's segments with
  abbreviations in it becomes several units and a one-segment change moves several.
"""

from __future__ import annotations

import os
import re

MUTANT = os.environ.get("SENTDP_TEST_MUTANT", "")


def _epsilon_doubled() -> None:
    import sentdp.mechanism as mechanism

    honest = mechanism.mechanism_epsilon
    mechanism.mechanism_epsilon = lambda epsilon, m: 2 * honest(epsilon, m)


def _fixed_randomness() -> None:
    import sentdp.mechanism as mechanism

    class Constant:
        def bytes(self, length: int, /) -> bytes:
            return bytes([0x5A]) * length

    mechanism.SystemRandomBytes = Constant  # type: ignore[misc,assignment]


def _naive_splitter() -> None:
    from sentdp.text import SentenceSplitter

    def tokenize(self: SentenceSplitter, s: str) -> list[str]:
        return [part for part in re.split(r"(?<=[.!?])\s+", s.strip()) if part]

    SentenceSplitter.tokenize = tokenize  # type: ignore[method-assign]


MUTANTS = {
    "epsilon-doubled": _epsilon_doubled,
    "fixed-randomness": _fixed_randomness,
    "naive-splitter": _naive_splitter,
}

if MUTANT:
    MUTANTS[MUTANT]()
