"""Which build of the sans-IO core (and the hot path's adapters, setup.py's HOT_PATH) the
tests run: pure Python unless RAVEN_EXPECT_COMPILED=1.

scripts/test runs every test on the pure-Python core (a compiled build left in place fails
here, so the pure run never tests the compiled core by accident), then scripts/test-compiled
builds it with mypyc (scripts/build-compiled), sets RAVEN_EXPECT_COMPILED=1 and runs the unit
and loopback tests again on it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup_py() -> ModuleType:
    """The checkout's setup.py, which names the modules both builds compile."""
    spec = importlib.util.spec_from_file_location("raven_setup_py", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SETUP = _setup_py()
#: Dotted names: what both builds compile, and what stays pure in the compiled packages
COMPILED = tuple(m[:-3].replace("/", ".") for m in SETUP.core_modules())
PURE = tuple(sorted(m[:-3].replace("/", ".") for m in SETUP.PURE))


def test_the_compiled_set_is_the_core_less_the_pure_modules_and_the_hot_path() -> None:
    everything = {
        f"{package.replace('/', '.')}.{p.stem}"
        for package in SETUP.PACKAGES
        for p in (ROOT / package).glob("*.py")
        if p.stem != "__init__"
    }
    hot = {m[:-3].replace("/", ".") for m in SETUP.HOT_PATH}
    assert all((ROOT / m).is_file() for m in SETUP.HOT_PATH), "HOT_PATH names a missing module"
    assert set(COMPILED) | set(PURE) == everything | hot
    assert not set(COMPILED) & set(PURE)
    core = {"raven.protocol.mux", "raven.protocol.records", "raven.l3.packet", "raven.l3.prefixes"}
    adapters = {"raven.transport.tunnel", "raven.transport.splice", "cloud_gateway.proxy.heads"}
    assert core | adapters <= set(COMPILED)


def _subclassed_from(path: Path, modules: set[str]) -> list[str]:
    """``Base`` for each class in ``path`` whose base ``Base`` it imports from one of
    ``modules`` (dotted names)."""
    tree = ast.parse(path.read_text(), str(path))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in modules
        for alias in node.names
    }
    return [
        base.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in imported
    ]


def test_no_interpreted_class_subclasses_a_compiled_one() -> None:
    """mypyc refuses to make an instance of an interpreted subclass of a compiled class
    (TypeError at the first call): a class subclassed outside the compiled set is compiled
    with its subclasses or stays pure (setup.py, HOT_PATH)."""
    compiled = set(COMPILED)
    found = []
    for folder in ("raven", "raven_cli", "cloud_gateway", "edge_agent", "gpu_exporter",
                   "coredns-hosts", "tests", "bench"):  # fmt: skip
        for path in sorted((ROOT / folder).rglob("*.py")):
            dotted = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            if dotted not in compiled:
                bases = _subclassed_from(path, compiled)
                found += [f"{path.relative_to(ROOT)}: {base}" for base in bases]
    assert not found, found


def _is_extension(name: str) -> bool:
    module = importlib.import_module(name)
    return str(module.__file__).endswith(".so")


@pytest.mark.parametrize("name", COMPILED)
def test_core_module_build_is_the_expected_one(name: str) -> None:
    expected = os.environ.get("RAVEN_EXPECT_COMPILED") == "1"
    assert _is_extension(name) == expected, (
        "a mypyc build of the core is in place: scripts/build-compiled --clean"
        if not expected
        else "RAVEN_EXPECT_COMPILED=1 but the core is pure: run scripts/build-compiled"
    )


@pytest.mark.parametrize("name", PURE)
def test_dataclass_modules_stay_pure(name: str) -> None:
    assert not _is_extension(name)


def test_core_imports_from_any_directory(tmp_path: Path) -> None:
    """A process started elsewhere (``raven`` from a shell's own directory, a test's child
    process) loads the same build: the compiled modules' shared runtime lives inside the
    package, not at the top of the checkout."""
    probe = "import raven.protocol.mux as m, raven.keys; print(m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    expected = os.environ.get("RAVEN_EXPECT_COMPILED") == "1"
    assert out.stdout.strip().endswith(".so") == expected, out.stdout


def test_version_and_build_info_name_the_core_build() -> None:
    """``raven --version`` and ``raven_build_info{core}`` say which build runs: what an operator
    checks after choosing an image (--build-arg RAVEN_COMPILE)."""
    from raven.telemetry.process_metrics import BuildInfoCollector
    from raven.version import core_build, version_line

    expected = "compiled" if os.environ.get("RAVEN_EXPECT_COMPILED") == "1" else "pure"
    assert core_build() == expected
    assert version_line().endswith(f", core {expected})")
    (family,) = BuildInfoCollector().collect()
    (sample,) = family.samples
    assert sample.labels["core"] == expected and sample.value == 1
