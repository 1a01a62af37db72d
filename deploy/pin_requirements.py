"""Pin the image's Python packages to exactly the versions this environment tested.

Walks the installed dependency closure of the service's requirements (the bentofile's
``python.packages``) in the running interpreter and prints one ``name==version`` line each,
so an image runs what the tests ran. torch is written as given by ``--torch`` (a wheel path
for the CPU image, ``torch==<tested version>`` for the CUDA one, whose CUDA libraries then
come from PyPI as torch's own dependencies).

    .venv/bin/python deploy/pin_requirements.py --torch ./wheels/torch-...whl > reqs.txt
"""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """Installed name -> version for ``roots`` and everything they need here."""
    pinned: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = metadata.distribution(requirement.name)
        if not requirement.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{requirement} is not met here: {name} {dist.version} installed")
        pinned[name] = dist.version
        for line in dist.requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                todo.append((needed, frozenset(needed.extras)))
    return pinned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bentofile", type=Path, default=ROOT / "bentofile.yaml")
    parser.add_argument("--torch", required=True, help="torch's requirement line")
    args = parser.parse_args()
    packages = yaml.safe_load(args.bentofile.read_text())["python"]["packages"]
    pinned = closure([Requirement(p) for p in packages])
    torch_version = pinned.pop("torch")
    lines = [f"{name}=={version}" for name, version in sorted(pinned.items())]
    print(f"# pinned from the tested environment by deploy/pin_requirements.py ({torch_version=})")
    print(args.torch)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
