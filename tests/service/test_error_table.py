"""The README's table of error codes lists every code with the status the service sends."""

from __future__ import annotations

import re
from pathlib import Path

from service.errors import STATUS, Code

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_code_is_in_the_readme_table_with_its_status() -> None:
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `")]
    table: dict[str, int] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) != 4 or not re.fullmatch(r"\d{3}( / \d{3})?", cells[1]):
            continue
        codes = re.findall(r"`([a-z_]+)`", cells[0])
        statuses = [int(s) for s in cells[1].split(" / ")]
        for n, code in enumerate(codes):
            table[code] = statuses[n] if len(statuses) == len(codes) else statuses[0]
    assert set(table) == {code.value for code in Code}
    for code in Code:
        assert table[code.value] == int(STATUS[code]), code
