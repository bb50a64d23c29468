"""README's measured figures are BENCHMARKS.md's current table, verbatim: one source, so the
first page a newcomer reads never disagrees with the benchmarks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- current-figures: begin.*?-->\n(.*?)<!-- current-figures: end -->", re.S)


def _table(path: Path) -> str:
    found = BLOCK.findall(path.read_text())
    assert len(found) == 1, f"{path.name}: {len(found)} current-figures tables"
    return str(found[0])


def test_readme_shows_the_current_table_of_benchmarks() -> None:
    assert _table(ROOT / "README.md") == _table(ROOT / "BENCHMARKS.md"), (
        "README.md's figures differ from BENCHMARKS.md's current table: copy the table"
    )


def test_every_row_names_its_command_and_when() -> None:
    rows = [line for line in _table(ROOT / "BENCHMARKS.md").splitlines() if line.startswith("|")]
    header, rule, *body = rows
    assert header.split("|")[1:-1][-2:] == [" command (`bench/`) ", " measured "]
    assert set(rule) <= set("|-")
    assert len(body) >= 5
    for row in body:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == 5, row
        command = re.search(r"`(bench_[a-z0-9_]+\.py)", cells[3])
        assert command and (ROOT / "bench" / command.group(1)).exists(), row
        assert re.fullmatch(r"\d{4}-\d\d-\d\d|issue \d+", cells[4]), row


def test_benchmarks_open_with_the_current_table() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "Current figures"
