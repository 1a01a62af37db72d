"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest

import training.label_vote as label_vote_module


@pytest.fixture
def tried_fits(monkeypatch: pytest.MonkeyPatch) -> list[label_vote_module.VoteFit]:
    """Every fit ``train_vote`` hands to ``choose_votes`` (calibrated ones included), appended
    as training runs; the choice itself is unchanged."""
    seen: list[label_vote_module.VoteFit] = []
    choose = label_vote_module.choose_votes

    def record(tried):  # type: ignore[no-untyped-def]
        seen.extend(tried)
        return choose(tried)

    monkeypatch.setattr(label_vote_module, "choose_votes", record)
    return seen
