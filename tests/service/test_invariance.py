"""The worker's start-up choice of encoder mode, with encoders whose check results are set:
each fallback in its order, failures logged by type only, and a refusal when all fail."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from service.invariance import LaterChecks, StartUpCheck, bucket_violations, invariant_encoder

SECRET = "a sentence that must never reach a log"


@dataclass
class FakeEncoder:
    device: str
    fixed: bool = False
    cuda_graphs: bool = False
    moves: bool = False
    capture_fails: bool = False
    warmed: list[bool] = field(default_factory=list)
    cpu_linear: str | None = None
    cpu_linear_note: str | None = None

    def warm_up(self) -> None:
        if self.capture_fails:
            raise RuntimeError(SECRET)
        self.warmed.append(True)


def check(encoder: FakeEncoder) -> list[str]:
    return ["probe 0, mixed batch of 2 at 1: 1e-07"] if encoder.moves else []


class Opener:
    """reopen(device, graphs) with a chosen outcome per (device, graphs); records the calls."""

    def __init__(self, outcomes: dict[tuple[str, bool], str]) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, device: str, graphs: bool) -> FakeEncoder:
        self.calls.append((device, graphs))
        outcome = self.outcomes.get((device, graphs), "passes")
        if outcome == "raises":
            raise RuntimeError(SECRET)
        return FakeEncoder(
            device,
            fixed=True,
            cuda_graphs=graphs,
            moves=outcome == "moves",
            capture_fails=outcome == "capture fails",
        )


def choose(first: FakeEncoder, opener: Opener, graphs: bool = True) -> tuple[FakeEncoder, str]:
    calls: list[int] = []
    encoder, mode = invariant_encoder(first, opener, check, graphs, lambda: calls.append(1))
    if any(device.startswith("cuda") for device, _ in opener.calls):
        assert calls, "deterministic kernels must be on before a CUDA reopen"
    return encoder, mode


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_an_encoder_that_passes_serves_as_opened(device: str) -> None:
    first, opener = FakeEncoder(device), Opener({})
    assert choose(first, opener) == (first, device.split(":", maxsplit=1)[0])
    assert opener.calls == []


def test_on_the_cpu_fixed_batches_follow_a_failed_check() -> None:
    opener = Opener({})
    encoder, mode = choose(FakeEncoder("cpu", moves=True), opener)
    assert (mode, opener.calls) == ("cpu-fixed-batch", [("cpu", False)])
    assert encoder.fixed


def test_on_cuda_graphed_fixed_batches_come_first_and_are_captured_before_serving() -> None:
    opener = Opener({})
    encoder, mode = choose(FakeEncoder("cuda:0", moves=True), opener)
    assert (mode, opener.calls) == ("cuda-fixed-batch", [("cuda:0", True)])
    assert encoder.cuda_graphs
    assert encoder.warmed


def test_a_failed_capture_falls_back_to_eager_cuda_passes_and_logs_no_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    opener = Opener({("cuda:0", True): "capture fails"})
    with caplog.at_level(logging.WARNING, logger="sentdp.service"):
        encoder, mode = choose(FakeEncoder("cuda:0", moves=True), opener)
    assert (mode, encoder.cuda_graphs) == ("cuda-fixed-batch", False)
    assert opener.calls == [("cuda:0", True), ("cuda:0", False)]
    events = [r.sentdp_fields for r in caplog.records if hasattr(r, "sentdp_fields")]
    failed = next(e for e in events if e["event"] == "cuda_graph_capture_failed")
    assert failed["error"] == "RuntimeError"
    assert SECRET not in str(events)


def test_graphs_off_skips_them() -> None:
    opener = Opener({})
    _, mode = choose(FakeEncoder("cuda:0", moves=True), opener, graphs=False)
    assert (mode, opener.calls) == ("cuda-fixed-batch", [("cuda:0", False)])


def test_cuda_falls_back_to_the_cpu_when_no_cuda_mode_passes() -> None:
    opener = Opener({("cuda:0", True): "moves", ("cuda:0", False): "raises"})
    encoder, mode = choose(FakeEncoder("cuda:0", moves=True), opener)
    assert mode == "cpu-fallback"
    assert opener.calls == [("cuda:0", True), ("cuda:0", False), ("cpu", False)]
    assert encoder.device == "cpu"


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_it_refuses_to_serve_when_every_mode_moves_a_probe(
    device: str, caplog: pytest.LogCaptureFixture
) -> None:
    opener = Opener({(d, g): "moves" for d in ("cpu", "cuda:0") for g in (True, False)})
    with caplog.at_level(logging.ERROR, logger="sentdp.service"), pytest.raises(RuntimeError):
        choose(FakeEncoder(device, moves=True), opener)
    assert any(
        getattr(r, "sentdp_fields", {}).get("event") == "encoder_not_batch_invariant"
        for r in caplog.records
    )


@pytest.mark.parametrize(
    ("opener", "device", "level"),
    [
        (Opener({}), "cuda:0", logging.INFO),  # graphed fixed batches: the usual CUDA mode
        (
            Opener({("cuda:0", True): "moves", ("cuda:0", False): "raises"}),
            "cuda:0",
            logging.WARNING,
        ),
    ],
)
def test_only_a_fallback_to_the_cpu_is_logged_as_a_warning(
    opener: Opener, device: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A new user's trial read the start-up's fixed-batch mode, logged as a warning on every
    start of a 2-core AVX-512 machine, as something wrong."""
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        choose(FakeEncoder(device, moves=True), opener)
    (serving,) = [
        r
        for r in caplog.records
        if getattr(r, "sentdp_fields", {}).get("event") == "encoder_batch_invariance"
    ]
    assert serving.levelno == level


@pytest.mark.parametrize("note", [None, "SENTDP_CPU_LINEAR=auto keeps BLAS: rounds to bf16"])
def test_auto_keeping_blas_is_logged_with_its_reason(
    note: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator whose environment lowers oneDNN's precision learns why the encoder kept
    BLAS (and, on a CPU whose MKL rows move, fixed-shape passes) from the start-up log."""
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        choose(FakeEncoder("cpu", cpu_linear="blas", cpu_linear_note=note), Opener({}))
    (serving,) = [
        r
        for r in caplog.records
        if getattr(r, "sentdp_fields", {}).get("event") == "encoder_batch_invariance"
    ]
    fields = serving.sentdp_fields  # type: ignore[attr-defined]
    assert (fields["mode"], fields["cpu_linear"]) == ("cpu", "blas")
    assert fields.get("cpu_linear_note") == note
    assert serving.levelno == (logging.WARNING if note else logging.INFO)


def test_the_worker_checks_an_encoder_in_fixed_shape_batches_over_every_pass_layout() -> None:
    """The worker's check of a fixed-shape encoder builds the layouts the mixed-batch check
    never does (here: four real rows of bucket 16), and a plain encoder still gets the sweep."""
    from tests.sentdp.fake_encoders import FixedPasses, MovesAtFiveRows, layout

    planted = FixedPasses(8, layout(16, 4, 0))
    found = StartUpCheck()(planted)
    assert found
    assert all("pass of 4 real rows at 0:" in line for line in found)
    assert StartUpCheck()(FixedPasses(8)) == []
    assert StartUpCheck()(MovesAtFiveRows())[0].startswith("probe 0, swept batch of 5")


@pytest.mark.parametrize("fixed", [True, False])
def test_every_bucket_checks_the_buckets_the_probes_miss(fixed: bool) -> None:
    """SENTDP_CHECK_EVERY_BUCKET: a fault in a bucket no invariance probe lands in (128
    characters here) passes the default check and fails the check of every bucket, which
    records the buckets it covered."""
    from sentdp.encoders import INVARIANCE_PROBES
    from tests.sentdp.fake_encoders import CHAR_BUCKETS, FixedPasses, real_rows

    def in_128(length: int, rows: list[list[int]], *_: int) -> bool:
        return length == 128 and real_rows(rows) >= 2

    assert 128 not in FixedPasses(8).buckets_of(INVARIANCE_PROBES)
    assert StartUpCheck()(FixedPasses(8, in_128, fixed)) == []
    assert StartUpCheck(every_bucket=True)(FixedPasses(8, in_128, fixed))
    default, every = StartUpCheck(), StartUpCheck(every_bucket=True)
    assert default(FixedPasses(8, fixed=fixed)) == every(FixedPasses(8, fixed=fixed)) == []
    assert default.buckets == sorted(set(FixedPasses(8).buckets_of(INVARIANCE_PROBES)))
    assert every.buckets == list(CHAR_BUCKETS)


@pytest.mark.parametrize("fixed", [True, False])
def test_every_bucket_keeps_the_default_check_as_it_is(fixed: bool) -> None:
    """The probes of the other buckets are checked apart: every fault in the default
    buckets that the default check finds, the check of every bucket finds too (mixed with
    the default probes, they had thinned each bucket's batches)."""
    from sentdp.encoders import INVARIANCE_PROBES
    from tests.sentdp.fake_encoders import FixedPasses, real_rows

    rows = 8 if fixed else 32
    found = 0
    for bucket in sorted(set(FixedPasses(rows).buckets_of(INVARIANCE_PROBES))):
        for real in range(2, rows + 1):

            def fault(length: int, passed: list[list[int]], *_: int) -> bool:
                return (length, real_rows(passed)) == (bucket, real)  # noqa: B023

            if StartUpCheck()(FixedPasses(rows, fault, fixed)):
                found += 1
                assert StartUpCheck(every_bucket=True)(FixedPasses(rows, fault, fixed))
    assert found >= 4 * (rows - 1) if fixed else found > 20


def test_every_bucket_checks_the_added_buckets_as_later_checks_do() -> None:
    """Some layouts of each added bucket (every layout is the later checks' test, below)."""
    from tests.sentdp.fake_encoders import FixedPasses, layout

    for bucket in (32, 128, 512):
        for real, position in [(2, 1), (5, 0), (8, 7)]:
            planted = FixedPasses(8, layout(bucket, real, position))
            assert StartUpCheck(every_bucket=True)(planted), (bucket, real, position)
            assert StartUpCheck()(planted) == []


def test_every_bucket_with_no_bucket_left_and_what_the_worker_logs() -> None:
    from tests.sentdp.fake_encoders import FixedPasses

    short = FixedPasses(8, fixed=False)
    short.max_tokens = 16  # the invariance probes fill both buckets: nothing more to check
    every = StartUpCheck(every_bucket=True)
    assert every(short) == []
    assert every.report(short.max_tokens) == (
        logging.INFO,
        {"buckets": [8, 16], "unchecked": [], "later": [], "every_bucket": True},
    )
    default = StartUpCheck()
    assert default(FixedPasses(8)) == []
    later = [24, 32, 48, 96, 128, 192, 384, 512]
    level, fields = default.report(512, later)
    assert (level, fields["unchecked"], fields["later"]) == (logging.INFO, later, later)
    assert default.report(512, later[:-1])[0] == logging.WARNING  # 512: neither
    every.buckets = [8, 16, 64]  # a bucket got no probe although every one was asked for
    assert every.report(64)[0] == logging.WARNING


def test_a_rejected_encoder_goes_straight_to_fixed_shape_passes_even_if_it_is_in_them() -> None:
    """After a later bucket check moved a probe, the mode is chosen again without the
    encoder that failed, whichever mode it was in."""
    for first in (FakeEncoder("cpu"), FakeEncoder("cpu", fixed=True)):
        opener = Opener({})
        encoder, mode = invariant_encoder(first, opener, check, True, lambda: None, rejected=True)
        assert (mode, opener.calls) == ("cpu-fixed-batch", [("cpu", False)])
        assert encoder is not first
    opener = Opener({("cpu", False): "moves"})
    with pytest.raises(RuntimeError, match="refusing to serve"):
        invariant_encoder(FakeEncoder("cpu"), opener, check, True, lambda: None, rejected=True)


@pytest.mark.parametrize("fixed", [True, False])
def test_later_checks_find_a_fault_in_a_bucket_the_start_up_probes_miss(fixed: bool) -> None:
    """The buckets the default check's probes miss are left to later checks, smallest first;
    a fault in one is found there, and the bucket stays pending."""
    from tests.sentdp.fake_encoders import FixedPasses, in_bucket

    planted = FixedPasses(8, in_bucket(128), fixed)
    start = StartUpCheck()
    assert start(planted) == []  # the default check misses it
    later = LaterChecks(planted, start.buckets, "later")
    assert later.pending() == [32, 128, 512]
    assert later.check(planted, 64) == []  # 32 only: it passes
    assert (later.pending(), later.checked) == ([128, 512], [32])
    found = later.check(planted)
    assert found
    assert all(line.startswith("bucket 128: probe ") for line in found)  # no text
    assert later.pending() == [128, 512]
    clean = FixedPasses(8, fixed=fixed)
    assert later.check(clean) == []
    assert (later.pending(), later.checked) == ([], [32, 128, 512])


@pytest.mark.parametrize("fixed", [True, False])
def test_later_checks_give_a_pass_rows_of_different_lengths(fixed: bool) -> None:
    """A kernel that depends on the other rows' lengths (unpadding to the longest row) moves
    a row only when a bucket's pass holds rows of different lengths: in plain buckets each
    bucket's check cycles through its longest and its shortest run of words; in fixed-shape
    passes its filler rows are shorter than its probe."""
    from tests.sentdp.fake_encoders import FixedPasses

    def lengths_differ(length: int, rows: list[list[int]], *_: int) -> bool:
        return length == 128 and len({len(row) for row in rows}) > 1

    later = LaterChecks(FixedPasses(8, fixed=fixed), [8, 16, 64, 256], "later")
    assert later.check(FixedPasses(8, lengths_differ, fixed))
    if not fixed:  # with its longest probe alone every row of the bucket is one length
        (longest, _), alone = later._probes[128], FixedPasses(8, lengths_differ, fixed)
        assert bucket_violations(alone, (longest,)) == []

    def all_short(length: int, rows: list[list[int]], *_: int) -> bool:
        """Trims a pass to its longest row: moves one whose rows are all short."""
        return length == 128 and len(rows) > 1 and max(len(row) for row in rows) < 110

    later = LaterChecks(FixedPasses(8, fixed=fixed), [8, 16, 64, 256], "later")
    assert later.check(FixedPasses(8, all_short, fixed))


def test_later_checks_cover_every_layout_of_their_buckets_in_fixed_shape_passes() -> None:
    """The check of one bucket in fixed-shape passes: every count of real rows and position,
    in the bucket's first pass of a call and after a full one."""
    from sentdp.encoders import bucket_probes
    from tests.sentdp.fake_encoders import FixedPasses, layout, real_rows

    longest, shortest = bucket_probes(FixedPasses(8)), bucket_probes(FixedPasses(8), shortest=True)
    for bucket in (32, 128, 512):
        probes = (longest[bucket], shortest[bucket])
        assert bucket_violations(FixedPasses(8), probes) == []
        for real in range(2, 9):
            for position in range(real):
                planted = FixedPasses(8, layout(bucket, real, position))
                assert bucket_violations(planted, probes), (bucket, real, position)

        def second(length: int, rows: list[list[int]], _: int, before: int, __: int) -> bool:
            return length == bucket and before >= 1 and real_rows(rows) > 1  # noqa: B023

        assert bucket_violations(FixedPasses(8, second), probes), bucket

        def beside_another(length: int, rows: list[list[int]], _: int, before: int, earlier: int):  # type: ignore[no-untyped-def]
            return length == bucket and earlier > before  # noqa: B023

        assert bucket_violations(FixedPasses(8, beside_another), probes), bucket
