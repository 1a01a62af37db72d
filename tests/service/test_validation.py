"""What a caller is told about an epsilon or a document the service refuses."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from service.errors import ApiError
from service.schemas import DocumentIn
from service.validation import charge_of, finite_epsilon


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan, math.inf])
def test_an_epsilon_at_or_below_zero_is_told_about_the_slack_too(epsilon: float) -> None:
    with pytest.raises(ApiError, match="above 0 \\(and above the mechanism's float slack"):
        finite_epsilon(epsilon)


def test_epsilon_messages_give_the_exact_values() -> None:
    """A trial saw "epsilon 10 is above this tenant's maximum of 10" for 10.0000001."""
    with pytest.raises(ApiError, match=r"epsilon 10\.0000001 is above .* maximum of 10\.0"):
        charge_of(10.0000001, 10.0, 1e-5)
    with pytest.raises(ApiError, match=r"above the mechanism's float slack 1e-05, got 1e-09"):
        charge_of(1e-9, 10.0, 1e-5)
    assert charge_of(10.0, 10.0, 1e-5) == 10_000_000


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "give each document its 'text' or its 'sentences'"),
        ({"text": "A.", "sentences": ["A."]}, "not both"),
    ],
)
def test_a_document_is_told_what_it_lacks_or_has_twice(document: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DocumentIn.model_validate(document)
