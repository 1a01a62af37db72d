"""oneDNN's linear layers for the torch encoder on the CPU: a row's bits still depend on that
row alone, the embeddings stay within float32 rounding of MKL's, ``auto`` picks it on AMD
and Intel CPUs only, and training caches and records the two apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sentdp import torch_bert
from sentdp.encoders import (
    INVARIANCE_PROBES,
    SentenceEncoder,
    batch_invariance_violations,
    bucket_probes,
    default_encoder_path,
)
from sentdp.errors import InputError

needs_onednn = pytest.mark.skipif(
    not torch_bert.onednn_linear_available(), reason="this torch build has no oneDNN linear"
)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """Real BBC News sentences of many lengths, and the invariance probes."""
    from sentdp.text import TextLimits
    from training.datasets import REGISTRY
    from training.settings import load_settings

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    real = [s for document in corpus.documents[:30] for s in document.sentences]
    return [*real[:300], *INVARIANCE_PROBES, " ".join(["token"] * 400)]


@pytest.fixture(scope="module")
def onednn() -> SentenceEncoder:
    return SentenceEncoder(default_encoder_path(), "cpu", batch_size=32, cpu_linear="onednn")


@needs_onednn
def test_onednn_rows_depend_on_themselves_alone(onednn, sentences) -> None:
    assert onednn.cpu_linear == "onednn"
    assert len(set(onednn.buckets_of(sentences))) >= 6
    together = onednn.encode(sentences)
    alone = np.stack([onednn.encode([s])[0] for s in sentences])
    np.testing.assert_array_equal(together, alone)
    reversed_order = onednn.encode(sentences[::-1])[::-1]
    np.testing.assert_array_equal(together, reversed_order)
    # the worker's start-up check itself, swept over every row count of a pass, and a probe
    # in every length bucket
    assert batch_invariance_violations(onednn, sweep_rows=onednn.batch_size) == []
    assert batch_invariance_violations(onednn, list(bucket_probes(onednn).values())) == []


@needs_onednn
def test_onednn_embeddings_are_mkl_s_within_float32_rounding(encoder, onednn, sentences) -> None:
    if encoder.device != "cpu":
        pytest.skip("compares with the CPU's BLAS")
    assert encoder.cpu_linear == "blas"  # the library's default: sentence-transformers' bits
    blas, packed = encoder.encode(sentences), onednn.encode(sentences)
    assert np.abs(blas - packed).max() < 2e-6  # 2.7e-7 measured on an EPYC Zen 5
    cosine = (blas * packed).sum(axis=1)  # both unit length
    assert cosine.min() > 1 - 1e-6


@needs_onednn
def test_onednn_packs_the_linear_weights_once(onednn) -> None:
    bert = onednn._bert
    assert bert is not None
    assert len(bert._packed) == len(torch_bert.LINEAR_PARTS) * bert.layers == 36
    held = [name for name in bert._weights if name.removesuffix(".weight") in bert._packed]
    assert held == []  # packed, not held twice
    assert all(f"{name}.bias" in bert._weights for name in bert._packed)


def test_auto_is_onednn_on_x86_cpus_and_blas_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_bert, "onednn_linear_available", lambda: True)
    monkeypatch.setattr(torch_bert, "onednn_precision_error", lambda: None)
    assert torch_bert.resolve_cpu_linear("auto", vendor="AuthenticAMD") == "onednn"
    assert torch_bert.resolve_cpu_linear("auto", vendor="GenuineIntel") == "onednn"
    assert torch_bert.resolve_cpu_linear("auto", vendor="ARM") == "blas"
    assert torch_bert.resolve_cpu_linear("blas", vendor="GenuineIntel") == "blas"
    assert torch_bert.resolve_cpu_linear("blas", vendor="AuthenticAMD") == "blas"
    assert torch_bert.resolve_cpu_linear("onednn", vendor="GenuineIntel") == "onednn"
    monkeypatch.setattr(torch_bert, "onednn_precision_error", lambda: "rounds to bf16")
    assert torch_bert.resolve_cpu_linear("auto", vendor="GenuineIntel") == "blas"
    monkeypatch.setattr(torch_bert, "onednn_linear_available", lambda: False)
    assert torch_bert.resolve_cpu_linear("auto", vendor="AuthenticAMD") == "blas"
    with pytest.raises(InputError, match="cannot run linear layers in oneDNN"):
        torch_bert.resolve_cpu_linear("onednn")
    with pytest.raises(InputError, match="unknown CPU linear 'mkl'"):
        torch_bert.resolve_cpu_linear("mkl")


@needs_onednn
def test_onednn_refuses_a_reduced_float32_precision() -> None:
    import torch

    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        with pytest.raises(InputError, match="matmul precision is 'bf16'"):
            torch_bert.TorchBert(default_encoder_path(), cpu_linear="onednn")
    finally:
        matmul.fp32_precision = before
    assert torch_bert.TorchBert(default_encoder_path(), cpu_linear="onednn").cpu_linear == "onednn"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(flags.partition(":")[2].split())


needs_amx = pytest.mark.skipif(
    "amx_bf16" not in _cpu_flags(),
    reason="oneDNN lowers float32 products to bf16 only on AMX (not AVX-512 BF16 alone)",
)

OPEN_BOTH = """
from sentdp import torch_bert
from sentdp.encoders import default_encoder_path
from sentdp.errors import InputError
print(torch_bert.TorchBert(default_encoder_path(), cpu_linear="blas").cpu_linear)
print(torch_bert.resolve_cpu_linear("auto", vendor="GenuineIntel"))
try:
    torch_bert.TorchBert(default_encoder_path(), cpu_linear="onednn")
except InputError as error:
    print(error)
else:
    print("opened")
"""


@needs_onednn
@pytest.mark.parametrize(
    ("variable", "mode", "auto", "last_line"),
    [
        pytest.param(
            "ONEDNN_DEFAULT_FPMATH_MODE", "BF16", "blas", "round below float32", marks=needs_amx
        ),
        pytest.param(
            "DNNL_DEFAULT_FPMATH_MODE", "BF16", "blas", "round below float32", marks=needs_amx
        ),
        ("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT", "onednn", "opened"),
    ],
)
def test_onednn_refuses_its_own_reduced_default_math_mode(
    variable: str, mode: str, auto: str, last_line: str
) -> None:
    """oneDNN reads its default math mode from the environment once per process, so each
    setting opens the encoder in a fresh one: asked for, oneDNN is refused; ``auto`` keeps
    MKL, which ignores the mode and opens either way."""
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_DEFAULT_FPMATH_MODE")}
    run = subprocess.run(
        [sys.executable, "-c", OPEN_BOTH],
        env=clean | {variable: mode},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:2] == ["blas", auto], run.stdout
    assert last_line in lines[-1], run.stdout


def test_products_rounded_below_float32_are_told_from_float32_ones() -> None:
    """The precision probe on any CPU: bf16 and float16 products exceed the limit, float32
    ones in torch's default library stay ten times below it."""
    import torch

    def rounded(dtype: torch.dtype) -> float:
        return torch_bert.linear_rounding(lambda x, w: (x.to(dtype) @ w.to(dtype).T).float())

    assert rounded(torch.bfloat16) > 10 * torch_bert.ROUNDING_LIMIT
    assert rounded(torch.float16) > torch_bert.ROUNDING_LIMIT
    assert torch_bert.linear_rounding(torch.nn.functional.linear) < torch_bert.ROUNDING_LIMIT / 10


@needs_onednn
def test_the_probe_is_onednn_in_full_float32_by_default() -> None:
    assert torch_bert.linear_rounding(torch_bert._onednn_linear) < torch_bert.ROUNDING_LIMIT / 10
    assert torch_bert.onednn_precision_error() is None


def test_the_cpu_vendor_is_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n")
    assert torch_bert.cpu_vendor(cpuinfo) == "AuthenticAMD"
    cpuinfo.write_text("processor\t: 0\n")
    assert torch_bert.cpu_vendor(cpuinfo) is None
    assert torch_bert.cpu_vendor(tmp_path / "absent") is None


@needs_onednn
def test_training_records_onednn_and_caches_it_apart(encoder, onednn) -> None:
    from training.embeddings import encoder_fingerprint

    assert "cpu_linear" not in encoder.describe()  # bundles and caches as before
    assert onednn.describe()["cpu_linear"] == "onednn"
    assert encoder_fingerprint(encoder) != encoder_fingerprint(onednn)


def test_the_settings_default_to_auto_and_refuse_another_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sentdp.errors import SettingsError
    from service.settings import load_settings as service_settings
    from training.settings import load_settings as training_settings

    monkeypatch.delenv("SENTDP_CPU_LINEAR", raising=False)
    assert service_settings().cpu_linear == "auto"
    assert training_settings().cpu_linear == "auto"
    monkeypatch.setenv("SENTDP_CPU_LINEAR", "mkl")
    with pytest.raises(SettingsError, match="SENTDP_CPU_LINEAR"):
        service_settings()
    with pytest.raises(SettingsError, match="SENTDP_CPU_LINEAR"):
        training_settings()
