"""Small modules and functions in the production packages (issue 11, docs/architecture.md):
a module over MAX_MODULE_LINES lines or a function over MAX_FUNCTION_LINES is asking to be
split along one of its seams. Lines are counted as the file has them (docstrings and
comments included); a function from its first decorator to its last line, nested
functions counted inside their parent too. Nothing is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    ROOT / "raven",
    ROOT / "cloud_gateway",
    ROOT / "edge_agent",
    ROOT / "gpu_exporter",
    ROOT / "coredns-hosts" / "coredns_hosts",
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def production_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_packages_are_there() -> None:
    for package in PACKAGES:
        assert (package / "__init__.py").is_file(), package
    assert len(production_modules()) > 100


def test_no_module_is_over_the_limit() -> None:
    too_long = {}
    for path in production_modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            too_long[_name(path)] = lines
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: split them"


def function_lengths(path: Path) -> dict[str, int]:
    """``Class.method`` / ``function`` (qualified by the enclosing scopes) -> lines."""
    lengths: dict[str, int] = {}

    def walk(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{scope}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    assert child.end_lineno is not None
                    lengths[name] = child.end_lineno - first + 1
                walk(child, f"{name}.")
            else:
                walk(child, scope)

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return lengths


def test_no_function_is_over_the_limit() -> None:
    too_long = {}
    for path in production_modules():
        for function, lines in function_lengths(path).items():
            key = f"{_name(path)}:{function}"
            if lines > MAX_FUNCTION_LINES:
                too_long[key] = lines
    assert too_long == {}, f"functions over {MAX_FUNCTION_LINES} lines: split them"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    pass\n", {"f": 2}),
        ("@dec\n@dec2\ndef f():\n    return 1\n", {"f": 4}),
        (
            "class C:\n    async def m(self):\n        def inner():\n            pass\n",
            {"C.m": 3, "C.m.inner": 2},
        ),
    ],
)
def test_function_lengths_counts_from_the_first_decorator(
    tmp_path: Path, source: str, expected: dict[str, int]
) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert function_lengths(path) == expected
