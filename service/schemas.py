"""Request and response bodies of the HTTP API, and the worker's batch items."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sentdp.vote_table import LONGEST

_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
"""Unicode categories an id may not hold: controls, format characters (zero-width spaces,
bidirectional overrides), surrogates, private-use and unassigned code points, and every
separator but the ASCII space."""

_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xFFFC, 0xFFFD),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
"""Unicode's Default_Ignorable_Code_Point ranges (characters a renderer may show as
nothing: variation selectors, the combining grapheme joiner, Hangul fillers), and the
Braille blank and the object and replacement characters."""


def _shown_as_nothing(character: str) -> bool:
    if character != " " and unicodedata.category(character) in _INVISIBLE:
        return True
    code = ord(character)
    return any(low <= code <= high for low, high in _IGNORABLE)


def _visible_nfc(value: str) -> str:
    """Refuse ids that render like another id: characters shown as nothing or as a space
    other than the ASCII one, spaces at either end, or text not in NFC. Refused, not
    normalised: a ledger keys accounts by the exact id, so folding two spellings into one
    here would move a user's spending between accounts. (Look-alike letters of other
    scripts are not caught: ids should be opaque.)"""
    odd = next((c for c in value if _shown_as_nothing(c)), None)
    if odd is not None:
        raise ValueError(f"ids may not contain U+{ord(odd):04X} (invisible or a special space)")
    if value != value.strip(" ") or "  " in value:
        raise ValueError("ids may not begin or end with a space, nor hold two in a row")
    if unicodedata.category(value[0]).startswith("M"):
        raise ValueError("ids may not begin with a combining mark")
    if not unicodedata.is_normalized("NFC", value):
        raise ValueError("ids must be in Unicode NFC form (normalise them before sending)")
    return value


UserId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The end user, named by the tenant; scoped to the tenant.",
        examples=["user-42"],
    ),
    AfterValidator(_visible_nfc),
]
"""A user id: 1 to 256 characters in NFC, nothing invisible; the same rule on every endpoint
(one person spelled two ways would be two accounts, each with the whole budget)."""

DocumentId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The caller's stable id of a document (per-document accounting): reuse it "
        "when the document is re-sent or edited.",
        examples=["note-1832"],
    ),
    AfterValidator(_visible_nfc),
]

MAX_LOOKUP_CANDIDATES = 1000
"""Candidate ids in one free /classify lookup."""


class DocumentIn(BaseModel):
    """One document: raw ``text`` (split by the service) or pre-split ``sentences``; under a
    tenant's per-document accounting, also the caller's stable ``document_id``."""

    model_config = ConfigDict(extra="forbid")

    document_id: DocumentId | None = None

    text: str | None = Field(default=None, examples=["The film was long. The acting was superb."])
    sentences: list[str] | None = Field(default=None, examples=[["First.", "Second."]])

    @model_validator(mode="after")
    def _exactly_one(self) -> DocumentIn:
        if self.text is None and self.sentences is None:
            raise ValueError("give each document its 'text' or its 'sentences'")
        if self.text is not None and self.sentences is not None:
            raise ValueError("give either 'text' or 'sentences' for each document, not both")
        return self


EXAMPLE_DOCUMENTS = [
    {
        "text": (
            "Shares in the carmaker rose sharply on Monday. Analysts said the results beat "
            "expectations. The firm will raise its dividend. Its chief executive was upbeat."
        )
    }
]


Epsilon = Annotated[float, Field(strict=True)]
"""A JSON number (an integer is fine): ``true`` or ``"2.5"`` are refused, not read as 1.0 and
2.5. NaN and infinities pass here and get 400 ``invalid_epsilon`` from the gateway."""


class PrivatizeRequest(BaseModel):
    """Body of /privatize. Unknown fields are refused (the service takes no seed, no p)."""

    model_config = ConfigDict(extra="forbid")

    user: UserId
    epsilon: Epsilon = Field(description="epsilon per document", examples=[3.0])
    documents: list[DocumentIn] = Field(min_length=1, examples=[EXAMPLE_DOCUMENTS])


class ClassifyRequest(BaseModel):
    """Body of /classify: user, epsilon and documents; or model and candidate ids."""

    model_config = ConfigDict(extra="forbid")

    user: UserId | None = None
    epsilon: Epsilon | None = None
    documents: list[DocumentIn] | None = Field(default=None, min_length=1)
    model: str | None = Field(
        default=None, max_length=256, description="a released embedding's model version"
    )
    candidates: list[Annotated[int, Field(strict=True)]] | None = Field(
        default=None, min_length=1, max_length=MAX_LOOKUP_CANDIDATES
    )


class BudgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: UserId


class Budget(BaseModel):
    """A user's spending in this period. Amounts in epsilon; ``group_epsilon = g * spent``."""

    user: str
    spent_epsilon: float
    group_size: int
    group_epsilon: float
    limit: float
    remaining: float
    """``limit - group_epsilon``, in group-epsilon."""
    remaining_epsilon: float
    """How much more epsilon can be requested in total: ``remaining / group_size``."""
    documents: int
    period: int
    accounting: str = "pure"
    """``pure`` (epsilon) or ``zcdp`` (rho, converted to (B, delta))."""
    composition: str = "sequential"
    """``sequential`` (every release adds up) or ``per-document`` (the largest spend over the
    user's document ids)."""
    spend: float = 0.0
    """What the accountant charged this period, times the group factor, in ``spend_unit``."""
    spend_limit: float = 0.0
    spend_unit: str = "epsilon"
    largest_document_spend: float | None = None
    """Per document: the spend of the user's most-spent document id."""
    kept_by: str | None = None
    """Set when this period was kept by another accountant than the tenant's (it changed):
    ``spend`` is then in that accountant's units, nothing remains, and requests get 409
    ``accountant_changed`` until a new period opens."""


class PrivateDocument(BaseModel):
    """One released, epsilon-SentDP result. From /privatize, and from /classify where the
    bundle takes the label from the candidate: a public candidate chosen by DeepCandidate (its
    embedding, and its class as post-processing). From /classify where the bundle takes the
    label from SentenceVote: the label alone (``label_mechanism`` says which)."""

    embedding: list[float] | None = None
    candidate: int | None = None
    """Global candidate id in the model (see /classify lookups)."""
    variant: str | None = None
    """The bundle's mechanism variant that produced it (chosen by epsilon)."""
    k: int
    """Number of sentences the document was split into (public)."""
    epsilon: float
    """Epsilon charged for this document."""
    p: int | None = None
    """Tukey-depth directions used (``selection`` "depth")."""
    selection: Literal["depth", "mean"] | None = None
    """How the candidate was drawn: Tukey depth over p directions, or distance to the
    document's clipped mean (the bundle's p table says which, per epsilon)."""
    label: str | None = None
    probabilities: dict[str, float] | None = None
    """The released candidate's class probabilities (public: a property of the candidate)."""
    label_mechanism: Literal["candidate", "sentence-vote"] | None = None
    """/classify: "candidate" (the label is the released candidate's class) or
    "sentence-vote" (the label was drawn by SentenceVote; no embedding is released: ask
    /privatize for one, a separate charge)."""


class PrivatizeResponse(BaseModel):
    model: str
    documents: list[PrivateDocument]
    budget: Budget


class CandidateLabel(BaseModel):
    candidate: int
    label: str
    probabilities: dict[str, float]


class ClassifyResponse(BaseModel):
    """Either privatized documents with labels (and the budget), or labels of released ids."""

    model: str
    documents: list[PrivateDocument] | None = None
    budget: Budget | None = None
    labels: list[CandidateLabel] | None = None


class WorkItem(BaseModel):
    """One document for the worker: sentences, the epsilon to run at, p, and its charge.
    Unknown fields are refused (before anything is drawn), so a worker never silently
    ignores an instruction a newer gateway sends, such as ``release``."""

    model_config = ConfigDict(extra="forbid")

    charge_id: int
    model: str
    variant: str
    sentences: list[str]
    epsilon: float
    p: int
    release: Literal["candidate", "vote"] = "candidate"
    """What to draw: a DeepCandidate candidate, or a SentenceVote label."""
    vote: int = Field(default=0, ge=0)
    """Which of the bundle's votes draws a ``vote`` release (the p table's ``vote_index``)."""
    vote_table: int = Field(default=0, ge=0, le=LONGEST)
    """A ``vote`` release of at most this many sentences is drawn from the hard-vote table
    (the p table's ``vote_table``); private whatever its value, since the rule depends on
    the sentence count only. A ``bounded_range`` draw never uses it."""
    bounded_range: bool = True
    """Draw a ``vote`` release by the epsilon-bounded-range exponential mechanism (for
    tenants charged in zCDP), not by the vote's own rule. The gateway always says which; an
    item that does not gets the bounded-range draw, private under either accountant."""
    selection: Literal["depth", "mean"] = "depth"
    """How a ``candidate`` release is drawn (the p table's ``selection``): Tukey depth over
    ``p`` directions, or distance to the clipped mean at ``radius``. A worker draws the mean
    rule only at a radius its bundle's p table names for the variant, else refunds."""
    radius: float | None = None

    @model_validator(mode="after")
    def _rule_parameters(self) -> WorkItem:
        if (self.selection == "mean") != (self.radius is not None):
            raise ValueError("a radius goes with the mean selection rule, and only with it")
        return self


class WorkRequest(BaseModel):
    """One charged request for the worker. It reaches the worker whole (adaptive batching
    never splits it), so a cancelled batch never takes half of a request with it."""

    request_id: str
    tenant: str
    """Whose turn it is (see :mod:`service.scheduling`); never logged with content."""
    deadline: float
    """Wall-clock time (Unix seconds) by which the computation must start; a request that
    has not started by then draws no randomness and is refunded."""
    cost: int = 0
    """Padded tokens to encode (decides whether it may join an adaptive batch)."""
    items: list[WorkItem]


class WorkResult(BaseModel):
    """The worker's answer for one item. ``sampled`` is False only if no randomness was drawn."""

    candidate: int | None = None
    """Global candidate id (the variant's offset plus its index in the variant)."""
    label: int | None = None
    """Class index drawn by SentenceVote (for a ``vote`` item)."""
    sampled: bool
    error: str | None = None


LATE_ERROR = "not started before its deadline"
"""A refused item's error when its request could not start in time (nothing drawn)."""
CLOSED_ERROR = "this worker's encoder failed its batch-invariance check; it refuses to serve"
"""A refused item's error once no encoder mode passed a later check of a length bucket."""
BACKLOG_ERROR = "not started before its deadline, behind this tenant's earlier requests"
"""The same, when the tenant's own earlier requests held the worker for at least half of its
wait: the gateway answers 429 (the tenant sends faster than it is served), not 503."""


class WorkReply(BaseModel):
    """The worker's results for one :class:`WorkRequest`, in the order of its items."""

    results: list[WorkResult]
