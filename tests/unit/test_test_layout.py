"""Test helpers live in tests/helpers/ only: no test module imports another test module (or a
conftest), so a helper is written once and a test file holds tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "helpers" in path.relative_to(ROOT / "tests").parts:
            continue
        for module in _imported_modules(path):
            if module.startswith("tests.") and not module.startswith("tests.helpers"):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == [], "move what they share into tests/helpers/"


def test_helpers_import_no_test_module() -> None:
    offenders = []
    for path in sorted((ROOT / "tests" / "helpers").rglob("*.py")):
        for module in _imported_modules(path):
            if module.startswith("tests.") and not module.startswith("tests.helpers"):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_benchmarks_import_helpers_not_tests() -> None:
    offenders = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for module in _imported_modules(path):
            if module.startswith("tests.") and not module.startswith("tests.helpers"):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []
