"""The worker plans each item with the vote or variant the gateway named (service.worker)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from sentdp.mechanism import DeepCandidate
from service.schemas import WorkItem
from service.worker import plan_encoded
from tests.service.fakes import DIM, tiny_bundle


def item(release: str, vote: int = 0, variant: str = "paper", epsilon: float = 1.0) -> WorkItem:
    return WorkItem(
        charge_id=1,
        model="m",
        variant=variant,
        sentences=["A."],
        epsilon=epsilon,
        p=3,
        release=release,  # type: ignore[arg-type]
        vote=vote,
        bounded_range=False,  # a pure-epsilon tenant's item
    )


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and all(
        np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a)
    )


def test_each_vote_item_is_planned_with_the_vote_it_names() -> None:
    bundle = tiny_bundle(vote=True, second_vote=True)
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    rng = np.random.default_rng(0)
    documents = [rng.normal(size=(k, DIM)) for k in (3, 5, 2, 4)]
    items = [item("vote", 1), item("vote", 0, epsilon=2.0), item("candidate"), item("vote", 1)]
    plans = plan_encoded(bundle, mechanisms, items, documents)
    for n in (0, 1, 3):
        vote = bundle.votes[items[n].vote]
        (expected,) = vote.plan_batch([documents[n]], [items[n].epsilon])
        assert same(plans[n], expected)
    (other,) = bundle.votes[0].plan_batch([documents[0]], [1.0])
    assert not same(plans[0], other)  # the two votes plan differently: the test sees which ran
    (candidate,) = mechanisms["paper"].plan_batch([documents[2]], [1.0], [3])
    assert same(plans[2], candidate)
    assert len(DeepCandidate.draw_plans(plans)) == 4


def test_a_vote_the_bundle_lacks_is_refused_before_anything_is_drawn() -> None:
    bundle = tiny_bundle(vote=True)
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    with pytest.raises(RuntimeError, match="no SentenceVote 1"):
        plan_encoded(bundle, mechanisms, [item("vote", 1)], [np.ones((2, DIM))])


def test_a_vote_that_reads_words_is_planned_with_each_item_s_own_sentences() -> None:
    """Items of one batch, of equal length, each read their own words: a batch that passed
    one item's sentences to another's vote would fail here."""
    from tests.service.fakes import WORDS

    bundle = tiny_bundle(vote=True, second_vote=True, words=True)
    assert bundle.votes[1].reads_words
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    rng = np.random.default_rng(1)
    documents = [rng.normal(size=(2, DIM)) for _ in range(5)]
    texts = [
        [f"{WORDS[0]} {WORDS[4]} {WORDS[5]}.", f"{WORDS[1]} {WORDS[2]}!"],
        [f"{WORDS[3]} {WORDS[6]}.", f"{WORDS[7]} {WORDS[7]} {WORDS[7]}."],
        ["no such words.", "none."],
        [f"{WORDS[2]} {WORDS[2]} {WORDS[1]}.", f"{WORDS[5]}."],
        [f"{WORDS[6]}.", f"{WORDS[0]} {WORDS[3]}."],
    ]
    kinds = [("vote", 1), ("candidate", 0), ("vote", 1), ("vote", 0), ("vote", 1)]
    items = [
        item(release, vote).model_copy(update={"sentences": sentences})
        for (release, vote), sentences in zip(kinds, texts, strict=True)
    ]
    plans = plan_encoded(bundle, mechanisms, items, documents)
    for n in (0, 2, 3, 4):
        vote = bundle.votes[items[n].vote]
        (expected,) = vote.plan_batch([documents[n]], [1.0], texts=[texts[n]])
        assert same(plans[n], expected)
    for n in (0, 2, 4):  # the words moved each plan: the test sees whose words were read
        (other,) = bundle.votes[1].plan_batch([documents[n]], [1.0], texts=[texts[(n + 2) % 5]])
        assert not same(plans[n], other)


def test_a_vote_by_count_is_planned_with_each_item_s_own_sentence_count() -> None:
    """Items of different lengths in one batch: each plan uses its own document's count (one
    sentence draws from the calibrated distribution, which permute-and-flip's plan is not)."""
    from sentdp.labels import vote_plan

    bundle = tiny_bundle(vote=True, by_count=True)
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    rng = np.random.default_rng(2)
    documents = [rng.normal(size=(k, DIM)) * 5 for k in (1, 9, 2, 1)]
    items = [item("vote") for _ in documents]
    plans = plan_encoded(bundle, mechanisms, items, documents)
    vote = bundle.votes[0]
    for plan, document in zip(plans, documents, strict=True):
        deviations = vote.deviations(document)
        assert same(plan, vote_plan(deviations, 1.0, len(document)))
    assert not same(plans[0], vote_plan(vote.deviations(documents[0]), 1.0))
    assert same(plans[1], vote_plan(vote.deviations(documents[1]), 1.0))  # long: flip


def test_a_bounded_range_vote_item_is_planned_with_the_exponential_mechanism() -> None:
    """A zCDP tenant's item next to a pure tenant's, same vote and document, one batch: each
    gets its own draw (a batch that planned both alike would fail here)."""
    from sentdp.labels import bounded_vote_plan

    bundle = tiny_bundle(vote=True, by_count=True)
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    document = np.random.default_rng(3).normal(size=(1, DIM)) * 5
    items = [item("vote").model_copy(update={"bounded_range": flag}) for flag in (True, False)]
    bounded, own = plan_encoded(bundle, mechanisms, items, [document, document])
    deviations = bundle.votes[0].deviations(document)
    assert same(bounded, bounded_vote_plan(deviations, 1.0))
    assert same(own, bundle.votes[0].plan_for(deviations, 1.0, 1))
    assert not same(bounded, own)
    # an item that does not say gets the draw that is private under either accountant
    unsaid = WorkItem(charge_id=2, model="m", variant="paper", sentences=["A."], epsilon=1.0, p=3)
    assert unsaid.bounded_range


def test_documents_recoded_together_plan_as_each_alone() -> None:
    """The worker recodes a group's rows with H at once: every plan must equal the plan of
    its document recoded alone, bit for bit (documents of 1 to 70 sentences, across H's
    64-row blocks)."""
    import dataclasses

    from sentdp.encoders import MLP, recode

    bundle = tiny_bundle()
    rng = np.random.default_rng(4)
    h = MLP(
        tuple(rng.normal(size=(DIM, DIM)) for _ in range(4)),
        tuple(rng.normal(size=DIM) for _ in range(4)),
    )
    paper = dataclasses.replace(bundle.variants[0], recoder=h)
    bundle = dataclasses.replace(bundle, variants=(paper, *bundle.variants[1:]))
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    documents = [rng.normal(size=(k, DIM)) for k in (1, 19, 70, 3, 64, 5)]
    items = [item("candidate", epsilon=1.0 + n) for n in range(len(documents))]
    plans = plan_encoded(bundle, mechanisms, items, documents)
    for plan, document, it in zip(plans, documents, items, strict=True):
        (alone,) = mechanisms["paper"].plan_batch([recode(h, document)], [it.epsilon], [3])
        assert same(plan, alone)
    (unrecoded,) = mechanisms["paper"].plan_batch([documents[1]], [2.0], [3])
    assert not same(plans[1], unrecoded)  # H ran: the test sees it


def test_a_mean_item_is_planned_with_the_clipped_mean_rule_at_the_table_s_radius() -> None:
    """Depth and mean items of one variant in one batch: each gets its own rule (a worker that
    grouped them by variant alone would plan one with the other's)."""
    import dataclasses

    from service.worker import mean_mechanisms
    from tests.service.fakes import RADIUS

    bundle = tiny_bundle(mean=True)
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    means = mean_mechanisms(bundle)
    assert set(means) == {("paper", RADIUS)}
    rng = np.random.default_rng(5)
    documents = [rng.normal(size=(k, DIM)) for k in (3, 1, 4, 2)]
    mean_item = item("candidate", epsilon=5.0).model_copy(
        update={"selection": "mean", "radius": RADIUS, "p": 1}
    )
    items = [mean_item, item("candidate"), mean_item, item("candidate", epsilon=2.0)]
    plans = plan_encoded(bundle, mechanisms, items, documents, means)
    rule = bundle.variant("paper").mean_mechanism(RADIUS)
    for n in (0, 2):
        (expected,) = rule.plan_batch([documents[n]], [5.0])
        assert same(plans[n], expected)
        (depth,) = mechanisms["paper"].plan_batch([documents[n]], [5.0], [3])
        assert not same(plans[n], depth)
    for n in (1, 3):
        (expected,) = mechanisms["paper"].plan_batch([documents[n]], [items[n].epsilon], [3])
        assert same(plans[n], expected)
    # a rule that cannot plan documents as long as the service accepts refuses to start
    tiny = bundle.manifest.p_table[-1].model_copy(update={"radius": 1e-8})
    short = dataclasses.replace(
        bundle,
        manifest=bundle.manifest.model_copy(update={"p_table": [bundle.manifest.p_table[0], tiny]}),
    )
    longest = short.variant("paper").mean_mechanism(1e-8).longest()
    assert 1 < longest < 1000
    assert mean_mechanisms(short, longest)
    with pytest.raises(RuntimeError, match="plans documents of at most"):
        mean_mechanisms(short, longest + 1)
    # a radius the p table does not name is refused before anything is drawn
    other = mean_item.model_copy(update={"radius": RADIUS * 2})
    with pytest.raises(RuntimeError, match="no mean rule"):
        plan_encoded(bundle, mechanisms, [other], documents[:1], means)


def test_a_work_item_s_rule_and_radius_must_agree() -> None:
    """The gateway always sends both or neither; a worker refuses anything else unparsed."""
    from pydantic import ValidationError

    base = item("candidate").model_dump()
    for update in ({"selection": "mean"}, {"radius": 1.0}, {"selection": "median", "radius": 1}):
        with pytest.raises(ValidationError):
            WorkItem.model_validate({**base, **update})
    assert WorkItem.model_validate(base).selection == "depth"


def test_a_short_vote_item_is_planned_from_the_hard_vote_table_it_names() -> None:
    from sentdp.labels import hard_counts
    from sentdp.vote_table import hard_vote_table

    bundle = tiny_bundle(vote=True)
    vote = bundle.votes[0]
    mechanisms = {v.record.name: v.mechanism() for v in bundle.variants}
    rng = np.random.default_rng(3)
    documents = [rng.normal(size=(k, DIM)) for k in (3, 5, 3)]
    tabled = [item("vote").model_copy(update={"vote_table": 4}) for _ in documents]
    tabled[2] = tabled[2].model_copy(update={"bounded_range": True})
    plans = plan_encoded(bundle, mechanisms, tabled, documents)
    counts = hard_counts(vote.logits(documents[0]))
    assert same(plans[0], hard_vote_table(3, vote.classes, 1.0).plan(counts))
    # five sentences are above the limit, and a bounded-range draw never uses the table
    (own,) = vote.plan_batch([documents[1]], [1.0])
    assert same(plans[1], own)
    (bounded,) = vote.plan_batch([documents[2]], [1.0], bounded_range=True)
    assert same(plans[2], bounded)
    (untabled,) = plan_encoded(bundle, mechanisms, [item("vote")], documents[:1])
    assert not same(plans[0], untabled)  # the test sees which rule ran
    with pytest.raises(ValueError, match="vote_table"):  # tables stop at 10 sentences
        WorkItem.model_validate({**item("vote").model_dump(), "vote_table": 11})
