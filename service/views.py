"""Response bodies built from ledger rows and the bundle: pure functions, no I/O.

What a caller sees of its user's budget, of a released candidate and of a refusal for budget
all come from here, so /privatize, /classify and /budget can never disagree.
"""

from __future__ import annotations

import math

from sentdp.accounting import PER_DOCUMENT, PURE, Policy, to_epsilon
from sentdp.bundle import Bundle, PChoice
from sentdp.errors import InternalError
from service.errors import ApiError, Code
from service.ledger import Account, BudgetExhaustedError
from service.schemas import Budget, CandidateLabel, PrivateDocument


def budget_view(account: Account, policy: Policy) -> Budget:
    """A user's spending under a tenant's accountant.

    ``spend`` is what the accountant charges, times the group factor (g for epsilon, g^2 for
    rho), in its own unit; ``remaining_epsilon`` is the largest epsilon one more release may
    have (per document: a release of the user's most-spent document).
    """
    spent = to_epsilon(account.spent_micro)
    spend = to_epsilon(policy.multiplier * account.spend_units)
    left = to_epsilon(policy.remaining_units(account.spend_units))
    kept_by = account.kept_by_another(policy.name)
    if kept_by is not None:  # its spend is in another accountant's units; requests get 409
        left = 0.0
    available = max(left, 0.0)  # none after a lowered budget, whatever ``left`` says
    if policy.accounting == PURE:
        next_epsilon = available / policy.group_size
    else:  # the epsilon whose rho = epsilon^2 / 8 fills what is left
        next_epsilon = math.sqrt(8 * available) / policy.group_size
    return Budget(
        user=account.user,
        spent_epsilon=spent,
        group_size=policy.group_size,
        group_epsilon=policy.group_size * spent,
        limit=policy_budget(policy),
        remaining=left,
        remaining_epsilon=next_epsilon,
        documents=account.documents,
        period=account.period,
        accounting=policy.accounting,
        composition=policy.composition,
        spend=spend,
        spend_limit=to_epsilon(policy.limit_micro),
        spend_unit="epsilon" if policy.accounting == PURE else "rho",
        largest_document_spend=spend if policy.composition == PER_DOCUMENT else None,
        kept_by=kept_by,
    )


def policy_budget(policy: Policy) -> float:
    """B in epsilon (for zCDP, the epsilon of the (B, delta) guarantee the rho limit keeps)."""
    return to_epsilon(policy.limit_micro) if policy.budget is None else policy.budget


def exhausted_error(refused: BudgetExhaustedError) -> ApiError:
    """The 402 for a refused debit, with the figures a client needs to decide what to do."""
    view = budget_view(refused.account, refused.policy)
    requested = to_epsilon(refused.charge.total_micro)
    return ApiError(
        Code.BUDGET_EXHAUSTED,
        f"privatizing would spend {requested:g} epsilon, but only "
        f"{view.remaining_epsilon:g} remains for this user (group size {view.group_size})",
        requested=requested,
        spent_epsilon=view.spent_epsilon,
        group_size=view.group_size,
        limit=view.limit,
        remaining=view.remaining,
        remaining_epsilon=view.remaining_epsilon,
    )


def label_of(bundle: Bundle, candidate: int) -> CandidateLabel:
    """The class a released candidate stands for (post-processing of a public vector).

    Raises :class:`sentdp.errors.InputError` for an id outside the bundle.
    """
    variant, local = bundle.locate(candidate)
    probs = variant.candidate_class_probs[local]
    labels = bundle.labels
    return CandidateLabel(
        candidate=candidate,
        label=labels[int(probs.argmax())],
        probabilities={name: float(p) for name, p in zip(labels, probs, strict=True)},
    )


def private_document(
    bundle: Bundle, candidate: int, k: int, epsilon: float, choice: PChoice, with_label: bool
) -> PrivateDocument:
    """One released document: the chosen public candidate (drawn by ``choice``'s rule), and
    its label if asked."""
    variant, local = bundle.locate(candidate)
    document = PrivateDocument(
        embedding=variant.candidates[local].tolist(),
        candidate=candidate,
        variant=variant.record.name,
        k=k,
        epsilon=epsilon,
        p=choice.p if choice.selection == "depth" else None,
        selection=choice.selection,
    )
    if with_label:
        label = label_of(bundle, candidate)
        document.label = label.label
        document.probabilities = label.probabilities
        document.label_mechanism = "candidate"
    return document


def voted_document(bundle: Bundle, label: int, k: int, epsilon: float) -> PrivateDocument:
    """A label released by SentenceVote: the label only (never the vote tallies, which are
    computed from the private sentences)."""
    if not 0 <= label < len(bundle.labels):
        raise InternalError(f"the worker drew label {label} of {len(bundle.labels)}")
    return PrivateDocument(
        k=k, epsilon=epsilon, label=bundle.labels[label], label_mechanism="sentence-vote"
    )


def backlog_error(documents: int) -> ApiError:
    """The 429 of a request that waited behind its own tenant's earlier requests until its
    deadline: nothing was drawn and every document was refunded."""
    return ApiError(
        Code.TENANT_BUSY,
        f"none of the {documents} documents could start before this tenant's earlier requests "
        "had finished; all were refunded; send fewer requests at once",
        headers={"Retry-After": "1"},
        released=[],
    )


def refunded_error(released: list[PrivateDocument], documents: int, reason: str) -> ApiError:
    """The 503 of a request some of whose documents drew no randomness and were refunded; the
    documents that were sampled are released all the same (their charges are final)."""
    return ApiError(
        Code.WORKER_UNAVAILABLE,
        f"{documents - len(released)} of {documents} documents could not be privatized and were "
        f"refunded ({reason}); retry later",
        released=[d.model_dump() for d in released],
    )
