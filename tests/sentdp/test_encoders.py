"""G depends on each sentence alone; H and the MLP heads are exact and round-trip to disk."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from sentdp.encoders import (
    INVARIANCE_PROBES,
    MLP,
    MLP_BLOCK_ROWS,
    SentenceEncoder,
    batch_invariance_violations,
    bucket_probes,
    copies_violations,
    encode_once,
    fixed_batch_violations,
    length_buckets,
    recode,
)
from sentdp.errors import InputError
from tests.sentdp.fake_encoders import (
    CHAR_BUCKETS,
    FILLER,
    Fault,
    FixedPasses,
    MovesAtFiveRows,
    layout,
    real_rows,
)

TARGET = "The central bank raised interest rates by a quarter of a point on Thursday."
SHORTER = ["Hi.", "Rates rose.", "It rained in Leeds today."]
LONGER = [
    "Shares in the company, which employs more than 40,000 people across Europe, fell sharply "
    "after it warned that profits for the year would be far below analysts' expectations.",
    "The minister said the government would publish detailed plans for the railway network "
    "later this year, after a consultation with passengers, unions and the train operators.",
]


def test_a_sentence_embeds_bit_identically_alone_and_in_a_mixed_batch(encoder) -> None:
    alone = encoder.encode([TARGET])[0]
    for batch in (
        [*SHORTER, TARGET, *LONGER],
        [*LONGER, TARGET],
        [TARGET, *SHORTER],
        [*LONGER, *SHORTER, *SHORTER, TARGET, *LONGER],
    ):
        embedded = encoder.encode(batch)
        np.testing.assert_array_equal(embedded[batch.index(TARGET)], alone)


def _padded_to_the_longest(encoder, sentences):  # type: ignore[no-untyped-def]
    rows = encoder._ids(sentences)
    return encoder.run_padded(rows, max(len(row) for row in rows))


def test_unbucketed_encoding_is_not_batch_independent_which_is_why_buckets_exist(encoder) -> None:
    # Guard that the test above can fail: plain padding to the longest member moves the bits.
    alone = _padded_to_the_longest(encoder, [TARGET])[0]
    mixed = _padded_to_the_longest(encoder, [TARGET, *LONGER])[0]
    assert np.abs(alone - mixed).max() > 0


def test_fixed_batches_pass_the_start_up_check_on_the_cpu(encoder) -> None:
    """Plain length-bucketed batches are invariant on some CPUs but not on others (AVX-512
    kernels vary with the batch's row count, by about 2e-7); the worker checks at start-up
    and switches to fixed batches, which must pass everywhere."""
    probes = INVARIANCE_PROBES[:4]
    fixed = SentenceEncoder(encoder.path, "cpu", batch_size=4, fixed_batch=True)
    assert batch_invariance_violations(fixed, probes, batch_sizes=(2, 5)) == []
    assert fixed_batch_violations(fixed, probes) == []
    alone = fixed.encode([TARGET])[0]
    np.testing.assert_array_equal(fixed.encode([*LONGER, TARGET, *LONGER])[len(LONGER)], alone)


def test_the_start_up_check_catches_an_encoder_that_depends_on_its_batch(
    encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def padded_to_the_longest(sentences):  # type: ignore[no-untyped-def]
        return _padded_to_the_longest(encoder, list(sentences))

    monkeypatch.setattr(encoder, "encode", padded_to_the_longest)
    found = batch_invariance_violations(encoder, INVARIANCE_PROBES[:3], batch_sizes=(3,))
    assert found
    assert all(line.startswith("probe ") for line in found)  # no sentence text in the report


def test_embeddings_are_unit_vectors_of_the_encoder_size(encoder) -> None:
    out = encoder.encode([TARGET, *SHORTER])
    assert out.shape == (4, 384)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert encoder.encode([]).shape == (0, 384)


def test_encoder_directory_must_be_a_sentence_transformers_model(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a sentence-transformers model directory"):
        SentenceEncoder(tmp_path)


def scaled_mlp(rng: np.random.Generator, sizes: list[int]) -> MLP:
    """Random layers scaled by 1/sqrt(width), so that wide activations stay of order one."""
    return MLP(
        weights=tuple(
            rng.standard_normal((a, b)) / np.sqrt(a) for a, b in itertools.pairwise(sizes)
        ),
        biases=tuple(rng.standard_normal(b) * 0.1 for b in sizes[1:]),
    )


def random_mlp(rng: np.random.Generator, sizes: list[int]) -> MLP:
    return MLP(
        weights=tuple(rng.standard_normal((a, b)) for a, b in itertools.pairwise(sizes)),
        biases=tuple(rng.standard_normal(b) for b in sizes[1:]),
    )


@pytest.mark.parametrize("sizes", [[6, 6, 6, 6, 3], [384, 384, 384, 384, 384]])
def test_mlp_rows_do_not_depend_on_the_batch_and_match_a_plain_forward_pass(
    sizes: list[int],
) -> None:
    rng = np.random.default_rng(0)
    mlp = scaled_mlp(rng, sizes)
    x = rng.standard_normal((150, sizes[0]))
    out = mlp(x)
    block = MLP_BLOCK_ROWS
    # alone, inside one block, across a block's edge, and a block and more from other offsets
    for start, count in [(0, 1), (3, 7), (block - 1, 2), (60, 70), (5, block + 1), (149, 1)]:
        np.testing.assert_array_equal(mlp(x[start : start + count]), out[start : start + count])
    for row in range(0, 150, 11):
        np.testing.assert_array_equal(mlp(x[row : row + 1]), out[row : row + 1])
    h = x
    for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases, strict=True)):
        h = h @ w + b
        h = np.maximum(h, 0) if i < 3 else h
    np.testing.assert_allclose(out, h, rtol=1e-12, atol=1e-12)


def test_mlp_saves_and_loads_exactly(tmp_path: Path) -> None:
    mlp = random_mlp(np.random.default_rng(1), [4, 4, 2])
    mlp.save(tmp_path, "head")
    loaded = MLP.load(tmp_path, "head")
    x = np.random.default_rng(2).standard_normal((5, 4))
    np.testing.assert_array_equal(loaded(x), mlp(x))


def test_mlp_refuses_layers_that_do_not_chain() -> None:
    with pytest.raises(InputError, match="do not chain"):
        MLP(weights=(np.zeros((3, 4)), np.zeros((5, 2))), biases=(np.zeros(4), np.zeros(2)))
    with pytest.raises(InputError, match="expected rows of size 3"):
        MLP(weights=(np.zeros((3, 4)),), biases=(np.zeros(4),))(np.zeros((2, 5)))


def test_recode_without_a_recoder_is_the_identity() -> None:
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(recode(None, x), x)


def test_the_token_counter_agrees_with_the_encoders_buckets(encoder) -> None:
    from sentdp.encoders import TokenCounter

    counter = TokenCounter(encoder.path, encoder.max_tokens)
    sentences = [TARGET, *SHORTER, *LONGER, "x " * 600, "", "Ünïcödé — “quotes” 🙂."]
    assert counter.padded_tokens(sentences) == encoder.buckets_of(sentences)
    assert counter.padded_tokens([]) == []


def test_the_token_counter_needs_no_padding_token(encoder, tmp_path: Path) -> None:
    """The gateway only counts tokens: a tokenizer config that names no padding token (which
    only padding needs) must not stop it."""
    import json
    import shutil

    from sentdp.encoders import TokenCounter

    directory = tmp_path / "encoder"
    shutil.copytree(encoder.path, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    counter = TokenCounter(directory, encoder.max_tokens)
    assert counter.padded_tokens([TARGET, *SHORTER]) == encoder.buckets_of([TARGET, *SHORTER])


def test_each_owner_s_repeated_sentence_is_encoded_once_and_bit_identically(encoder) -> None:
    asked: list[list[str]] = []

    class Spy:
        def encode(self, sentences):  # type: ignore[no-untyped-def]
            asked.append(list(sentences))
            return encoder.encode(sentences)

    rose, fell = "Rates rose.", "Markets fell."
    keyed = [("a", rose), ("a", fell), ("a", rose), ("b", rose)]
    got = encode_once(Spy(), keyed)  # type: ignore[arg-type]
    assert asked == [[rose, fell, rose]]  # once per owner
    np.testing.assert_array_equal(got, encoder.encode([s for _, s in keyed]))
    assert encode_once(Spy(), []).shape == (0, encoder.dim)  # type: ignore[arg-type]


def test_the_start_up_check_sweeps_every_row_count_a_pass_can_have() -> None:
    encoder = MovesAtFiveRows()
    assert batch_invariance_violations(encoder) == []  # 2, 3, 8, 33 and 64 rows miss it
    found = batch_invariance_violations(encoder, sweep_rows=encoder.batch_size)
    assert found
    assert all(line.startswith("probe 0, swept batch of 5 at") for line in found)
    assert batch_invariance_violations(encoder, sweep_rows=4) == []
    first = batch_invariance_violations(encoder, sweep_rows=8, first_only=True)
    assert first == found  # one batch of five moved all five rows, and the check stopped there
    assert len(batch_invariance_violations(encoder, sweep_rows=8, batch_sizes=(2, 5))) > 5
    stopped = batch_invariance_violations(
        encoder, sweep_rows=8, batch_sizes=(2, 5), first_only=True
    )
    assert len(stopped) == 5


def test_cuda_graphs_are_for_fixed_shape_cuda_passes_only(encoder) -> None:
    """Graphs replay fixed-shape passes on CUDA; the CPU and plain buckets run eagerly."""
    assert not SentenceEncoder(
        encoder.path, "cpu", batch_size=4, fixed_batch=True
    )._bert.cuda_graphs
    if torch_cuda_available():
        assert not SentenceEncoder(encoder.path, "cuda", batch_size=4)._bert.cuda_graphs
        assert SentenceEncoder(
            encoder.path, "cuda", batch_size=4, fixed_batch=True
        )._bert.cuda_graphs


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_equal_eager_passes_bit_for_bit(encoder) -> None:
    sentences = [TARGET, *SHORTER, *LONGER] * 5
    graphed = SentenceEncoder(encoder.path, "cuda", batch_size=8, fixed_batch=True)
    eager = SentenceEncoder(encoder.path, "cuda", batch_size=8, fixed_batch=True, cuda_graphs=False)
    graphed.warm_up()
    assert len(graphed._bert._graphs) == len(graphed._buckets)  # replays, not eager passes
    np.testing.assert_array_equal(graphed.encode(sentences), eager.encode(sentences))
    assert batch_invariance_violations(graphed, INVARIANCE_PROBES[:4], batch_sizes=(3, 8)) == []


@pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA device")
def test_queued_graph_passes_equal_passes_waited_for_one_by_one(encoder) -> None:
    """Graphed passes queued without waiting (several of one shape share the graph's input
    and output tensors) give the bits of passes that each wait, also from two threads."""
    from concurrent.futures import ThreadPoolExecutor

    sentences = [TARGET, *SHORTER, *LONGER] * 7  # several passes of each bucket's shape
    queued = SentenceEncoder(encoder.path, "cuda", batch_size=4, fixed_batch=True)
    waited = SentenceEncoder(encoder.path, "cuda", batch_size=4, fixed_batch=True)
    waited.overlap_passes = False
    expected = waited.encode(sentences)
    np.testing.assert_array_equal(queued.encode(sentences), expected)
    fresh = SentenceEncoder(encoder.path, "cuda", batch_size=4, fixed_batch=True)
    for user in (queued, fresh):  # fresh: graphs are captured while the other thread runs
        with ThreadPoolExecutor(2) as pool:
            forward, backward = pool.map(user.encode, [sentences, sentences[::-1]])
        np.testing.assert_array_equal(forward, expected)
        np.testing.assert_array_equal(backward, expected[::-1])
    assert batch_invariance_violations(queued, INVARIANCE_PROBES[:4], batch_sizes=(3, 8)) == []


@pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA device")
def test_graphed_passes_refuse_a_caller_on_another_stream(encoder) -> None:
    """Two streams' work has no order: a pass queued from another stream could overwrite the
    shared input tensors of a pass not yet run. Such a caller gets an error, never rows."""
    import torch

    from sentdp.errors import InternalError

    queued = SentenceEncoder(encoder.path, "cuda", batch_size=4, fixed_batch=True)
    with torch.cuda.stream(torch.cuda.Stream()), pytest.raises(InternalError, match="stream"):
        queued.encode([TARGET])


def test_the_fixed_batch_check_catches_a_fault_at_every_layout_a_pass_can_have() -> None:
    """A fixed-shape pass can differ only in a row's position, the count of real rows and what
    they hold; a fault planted at any (bucket, real rows, position) of the probes' buckets is
    found, while the mixed-batch check with its sweep misses some, with twice the passes."""
    rows = 8
    buckets = sorted(set(FixedPasses(rows).buckets_of(INVARIANCE_PROBES)))
    assert len(buckets) >= 4  # the probes reach several buckets
    assert fixed_batch_violations(FixedPasses(rows)) == []
    missed = []
    for bucket in buckets:
        for real in range(2, rows + 1):
            for position in range(real):
                planted = FixedPasses(rows, layout(bucket, real, position))
                found = fixed_batch_violations(planted)
                assert found, (bucket, real, position)
                assert all(line.startswith("probe ") for line in found)  # no text
                assert all(f"pass of {real} real rows at {position}:" in x for x in found)
                assert fixed_batch_violations(planted, first_only=True)
                if not batch_invariance_violations(planted, sweep_rows=rows):
                    missed.append((bucket, real, position))
    assert missed  # the layouts the old check never built
    new, old = FixedPasses(rows), FixedPasses(rows)
    fixed_batch_violations(new)
    batch_invariance_violations(old, sweep_rows=rows)
    assert old.passes > 1.5 * new.passes


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 32])
def test_the_fixed_batch_check_catches_a_pass_that_depends_on_an_earlier_one(rows: int) -> None:
    """Passes of one call run side by side (ONNX Runtime's row threading) or queued on a
    device (CUDA graphs share their buffers): a second pass of a bucket in one call is built."""
    found = fixed_batch_violations(FixedPasses(rows, lambda _, __, ___, before, ____: before == 1))
    assert found


def test_the_fixed_batch_check_builds_partial_passes_after_full_ones() -> None:
    """A bucket's last pass in a call is the partial one: every count of real rows is built
    after a full pass in the smallest bucket, the largest count in every bucket, and full
    passes of each bucket follow another bucket's passes in one call."""
    rows = 8
    buckets = sorted(set(FixedPasses(rows).buckets_of(INVARIANCE_PROBES)))

    def later(bucket: int, real: int) -> Fault:
        return lambda length, passed, _, before, __: (
            before >= 1 and (length, real_rows(passed)) == (bucket, real)
        )

    for real in range(1, rows):
        assert fixed_batch_violations(FixedPasses(rows, later(buckets[0], real))), real
    for bucket in buckets:
        assert fixed_batch_violations(FixedPasses(rows, later(bucket, rows - 1))), bucket

    def full_after_another_bucket(
        length: int, passed: list[list[int]], _: int, before: int, earlier: int
    ) -> bool:
        return earlier > before and real_rows(passed) == rows

    assert fixed_batch_violations(FixedPasses(rows, full_after_another_bucket))


def test_the_fixed_batch_check_builds_a_pass_without_padding() -> None:
    """sentence-transformers' path drops the attention mask of a pass without any padding (a
    different kernel): a full pass of copies of a probe that fills its bucket is built."""
    probe = "He scored twice."
    assert FixedPasses(8).buckets_of([probe]) == [len(probe)]  # fills bucket 16 exactly

    def unpadded(length: int, rows: list[list[int]], *_: int) -> bool:
        return all(len(row) == length for row in rows)

    assert fixed_batch_violations(FixedPasses(8, unpadded), ("It rained.", probe))
    assert fixed_batch_violations(FixedPasses(8, unpadded))  # among the default probes


@pytest.mark.parametrize("rows", [2, 8])
def test_the_fixed_batch_check_puts_each_probe_at_each_position(rows: int) -> None:
    """Three probes share bucket 16: the rotations put each of them at each position among
    other probes (copies of itself are not enough), whether passes hold fewer rows than the
    bucket has probes or more."""
    probes = ("abcdefghij", "klmnopqrst", "uvwxyzabcd")
    ids = FixedPasses(rows)._ids(probes)
    for probe, position in itertools.product(range(3), range(rows)):

        def there(_: int, passed: list[list[int]], at: int, *__: int) -> bool:
            others = [row for row in passed if row not in (FILLER, ids[probe])]  # noqa: B023
            return at == position and passed[at] == ids[probe] and bool(others)  # noqa: B023

        assert fixed_batch_violations(FixedPasses(rows, there), probes), (probe, position)
    assert fixed_batch_violations(FixedPasses(1), probes) == []


def test_a_default_probe_fills_its_bucket_so_a_pass_without_padding_is_checked(encoder) -> None:
    lengths = [len(ids) for ids in encoder._ids(list(INVARIANCE_PROBES))]
    assert lengths[6] == 16  # "The film, though long, ...": a full pass of it has no padding
    assert encoder.buckets_of([INVARIANCE_PROBES[6]]) == [16]


def test_bucket_probes_fill_every_bucket_with_public_words(encoder) -> None:
    probes = bucket_probes(encoder)
    assert list(probes) == length_buckets(encoder.max_tokens)
    assert encoder.buckets_of(list(probes.values())) == list(probes)
    lengths = [len(ids) for ids in encoder._ids(list(probes.values()))]
    assert lengths[-1] == encoder.max_tokens  # the tokenizer cut the last to its bucket
    assert all(bucket - 4 < n <= bucket for bucket, n in zip(probes, lengths, strict=True))
    words = set(" ".join(INVARIANCE_PROBES).split())
    assert all(set(text.split()) <= words for text in probes.values())
    shortest = bucket_probes(encoder, shortest=True)
    assert encoder.buckets_of(list(shortest.values())) == list(probes)
    for bucket, text in shortest.items():  # a word fewer lands in a smaller bucket
        assert len(text) < len(probes[bucket]) or bucket == min(probes)
        fewer = " ".join(text.split()[:-1])
        assert not fewer or encoder.buckets_of([fewer])[0] < bucket


def test_bucket_probes_fill_buckets_that_no_run_of_words_lands_in() -> None:
    fake = FixedPasses(8)  # a token per character: a word of 12 skips the bucket of 8
    probes = bucket_probes(fake, words=["abcdefghijkl"])
    assert list(probes) == list(CHAR_BUCKETS)
    assert fake.buckets_of(list(probes.values())) == list(CHAR_BUCKETS)
    assert set(probes[8]) <= {".", " "}
    shortest = bucket_probes(fake, words=["abcdefghijkl"], shortest=True)
    assert fake.buckets_of(list(shortest.values())) == list(CHAR_BUCKETS)
    assert (shortest[8], len(probes[8])) == (".", 7)  # the fewest full stops, the most
    assert (len(shortest[64]), len(probes[64])) == (38, 64)  # 3 and 5 words of 12


def test_the_check_of_copies_builds_each_row_count_and_calls_of_two_buckets() -> None:
    """The lean check of one bucket in plain buckets: passes of 2, 3, 8 and a full 32 rows,
    a row after a full pass in one call, and another bucket's pass in every call."""
    probe = ["x" * 100]  # the bucket of 128 characters

    def rows_of(count: int) -> Fault:
        return lambda length, rows, *_: length == 128 and len(rows) == count

    plain = FixedPasses(32, fixed=False)
    assert copies_violations(plain, probe, "Short.") == []
    for count in (2, 3, 8, 32):
        found = copies_violations(FixedPasses(32, rows_of(count), False), probe, "Short.")
        assert found, count
        assert all(line.startswith("probe 0, batch of ") for line in found)
    assert copies_violations(FixedPasses(32, rows_of(5), False), probe, "Short.") == []
    assert copies_violations(FixedPasses(8, rows_of(8), False), probe, "Short.", [9])

    def after_full(length: int, rows: list[list[int]], _: int, before: int, __: int) -> bool:
        return length == 128 and before >= 1

    def beside_another(length: int, rows: list[list[int]], _: int, before: int, earlier: int):  # type: ignore[no-untyped-def]
        return length == 128 and earlier > before

    def alone_beside_another(length: int, rows: list[list[int]], _: int, before: int, earlier: int):  # type: ignore[no-untyped-def]
        return length == 128 and len(rows) == 1 and before == 0 and earlier > 0

    assert copies_violations(FixedPasses(32, alone_beside_another, False), probe, "Short.")

    def all_short(length: int, rows: list[list[int]], *_: int) -> bool:
        return length == 128 and len(rows) > 1 and max(len(row) for row in rows) < 100

    two = ["x" * 100, "y" * 70]
    assert copies_violations(FixedPasses(32, all_short, False), two, "Short.")
    assert copies_violations(FixedPasses(32, all_short, False), two[:1], "Short.") == []
    assert copies_violations(FixedPasses(32, after_full, False), probe, "Short.")
    assert copies_violations(FixedPasses(32, beside_another, False), probe, "Short.")
    moved = FixedPasses(32, rows_of(2), False)
    assert len(copies_violations(moved, probe, "Short.", [2, 2], first_only=True)) == 2


def test_the_fixed_batch_check_refuses_an_encoder_in_plain_buckets(encoder) -> None:
    with pytest.raises(InputError, match="fixed-shape"):
        fixed_batch_violations(encoder)
