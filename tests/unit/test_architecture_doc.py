"""docs/architecture.md is true to the code: every path, module, class and function it names
exists, and the layering it states holds on the import graph (that raven/ imports applications
only in its composition roots is tests/unit/test_composition_roots.py's).

What the doc names, and how each is checked:
- the layout tree (the fenced block under "## Layout"): a line starting at column 0 names a
  folder, a line indented by two spaces a file or folder inside the last one; each must exist;
- outside code blocks, a backticked path (``raven/admin/``, ``edge_agent/relay.py``) must
  exist; a backticked dotted name (``raven.telemetry.logs.fields``) must import; a backticked
  ``Name`` or ``Name.attr`` must be a class (or attribute) of a module the doc names; a backticked
  ``name(...)`` must be a function or method of a module or class the doc names;
- in the diagrams, every ``*.py`` path must exist and every ``Name.attr`` be as above;
- in ``python`` blocks, every class must exist and every ``def`` be one of its class's methods.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
APPLICATIONS = ("cloud_gateway", "edge_agent", "gpu_exporter", "coredns_hosts")
PACKAGE_DIRS = {
    "raven": ROOT / "raven",
    "cloud_gateway": ROOT / "cloud_gateway",
    "edge_agent": ROOT / "edge_agent",
    "gpu_exporter": ROOT / "gpu_exporter",
    "coredns_hosts": ROOT / "coredns-hosts" / "coredns_hosts",
}
SANS_IO = ("raven/protocol", "raven/l3", "raven/backfill")
SANS_IO_FORBIDDEN = {"asyncio", "socket", "time", "os", "threading", "selectors"}
ONE_LINE_PER_MODULE = {"raven/", "raven/admin/", "raven/protocol/", "raven/transport/"}
#: The one application that uses another: the agent embeds the GPU exporter.
EMBEDDED = {("edge_agent", "gpu_exporter")}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BACKTICK = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*(?:\.py|/)$")
DOTTED = re.compile(r"^[a-z_]\w*(?:\.\w+)+$")
CLASS_ATTR = re.compile(r"^([A-Z]\w*)(?:\.(\w+))?$")
CALL = re.compile(r"^(\w+)\(")
DIAGRAM_PATH = re.compile(r"(?<![\w/.-])([\w-]+(?:/[\w.-]+)+\.py)\b")
CAMEL = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b")
KUBERNETES_KINDS = {"ConfigMap", "EndpointSlice"}
DIAGRAM_CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w+)\.([a-z_]\w*)\b")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def fences() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(doc_text())]


def prose() -> str:
    return FENCE.sub("", doc_text())


def layout_block() -> str:
    text = doc_text()
    start = text.index("## Layout")
    match = FENCE.search(text, start)
    assert match is not None, "no fenced layout block under ## Layout"
    return match.group(2)


def layout_paths() -> list[str]:
    paths: list[str] = []
    folder = ""
    for line in layout_block().splitlines():
        if not line.strip() or line.startswith("    "):
            continue  # a description running on
        name = line.split()[0]
        if not line.startswith(" "):
            folder = name
            paths.append(name)
        elif line.startswith("  ") and not line.startswith("   "):
            paths.append(folder + name)
    return paths


def module_name(path: str) -> str | None:
    """The import name of a documented .py file or package folder (None: not Python)."""
    for package, directory in PACKAGE_DIRS.items():
        rel = directory.relative_to(ROOT).as_posix() + "/"
        if path.startswith(rel) or path + "/" == rel:
            inner = path[len(rel) :].removesuffix("/").removesuffix(".py")
            parts = [package, *[p for p in inner.split("/") if p]]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    return None


@cache
def documented_modules() -> tuple[ModuleType, ...]:
    names = {module_name(p) for p in layout_paths()}
    for token in BACKTICK.findall(prose()):
        if PATH.match(token):
            names.add(module_name(token))
    for _, body in fences():
        names.update(module_name(p) for p in DIAGRAM_PATH.findall(body))
    modules = []
    for name in sorted(n for n in names if n):
        if (ROOT / "/".join(name.split("."))).is_dir() or importlib.util.find_spec(name):
            modules.append(importlib.import_module(name))
    return tuple(modules)


def find_attr(name: str) -> list[object]:
    """Everything a documented module, or a class in one, calls ``name`` (a class's
    declared instance attributes too: a bound call such as TunnelConnection.next_event)."""
    found: list[object] = []
    for module in documented_modules():
        if hasattr(module, name):
            found.append(getattr(module, name))
        for value in vars(module).values():
            if isinstance(value, type) and name in vars(value):
                found.append(getattr(value, name))
            elif isinstance(value, type) and name in getattr(value, "__annotations__", {}):
                found.append(value.__annotations__[name])  # an instance attribute, declared
    return found


def exists(path: str) -> bool:
    return (ROOT / path).exists()


def test_every_layout_entry_exists() -> None:
    paths = layout_paths()
    assert len(paths) > 40, "the layout block was not found or not parsed"
    missing = [p for p in paths if not exists(p)]
    assert not missing, f"named in the layout but missing: {missing}"


def test_every_module_of_the_shared_layer_has_its_line() -> None:
    """A new module directly in raven/, raven/admin/, raven/protocol/ or raven/transport/ needs
    its line in the layout (the other folders of raven/ are described as a whole)."""
    listed = set(layout_paths())
    unlisted = [
        rel
        for rel, path in python_files("raven")
        if path.name != "__init__.py"
        and rel.rsplit("/", 1)[0] + "/" in ONE_LINE_PER_MODULE
        and rel not in listed
    ]
    assert not unlisted, f"modules of raven/ missing from the layout: {unlisted}"


def test_classes_named_in_the_layout_exist() -> None:
    """CamelCase names in the layout's descriptions are classes of the documented modules
    (Kubernetes kinds excepted)."""
    named = set(CAMEL.findall(layout_block())) - KUBERNETES_KINDS
    missing = sorted(n for n in named if not class_attr_exists(n, None))
    assert not missing, f"the layout names classes the code does not have: {missing}"


def test_backticked_paths_and_names_exist() -> None:
    problems = []
    for token in sorted(set(BACKTICK.findall(prose()))):
        if PATH.match(token) and "/" in token:
            if not exists(token):
                problems.append(f"path {token}")
        elif DOTTED.match(token) and token.split(".")[0] in (*PACKAGE_DIRS, "prometheus_client"):
            if not resolves(token):
                problems.append(f"name {token}")
        elif match := CLASS_ATTR.match(token):
            if not class_attr_exists(match.group(1), match.group(2)):
                problems.append(f"class {token}")
        elif (match := CALL.match(token)) and not find_attr(match.group(1)):
            problems.append(f"function {token}")
    assert not problems, f"named in docs/architecture.md but not in the code: {problems}"


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(value, attr):
                return False
            value = getattr(value, attr)
        return True
    return False


def class_attr_exists(cls_name: str, attr: str | None) -> bool:
    classes = [c for c in find_attr(cls_name) if isinstance(c, type)]
    if attr is None:
        return bool(classes)
    return any(hasattr(c, attr) for c in classes)


def test_diagrams_name_real_files_classes_and_methods() -> None:
    problems = []
    for lang, body in fences():
        if lang in {"python", "json"}:
            continue
        for path in DIAGRAM_PATH.findall(body):
            if not exists(path):
                problems.append(f"path {path}")
        for cls_name, attr in DIAGRAM_CLASS_ATTR.findall(body):
            if not class_attr_exists(cls_name, attr):
                problems.append(f"{cls_name}.{attr}")
    assert not problems, f"diagrams name what the code does not have: {problems}"


def test_python_blocks_name_real_classes_and_methods() -> None:
    problems = []
    for lang, body in fences():
        if lang != "python":
            continue
        current: list[type] = []
        for line in body.splitlines():
            if match := re.match(r"\s*class (\w+)", line) or re.match(r"\s*(\w+)\($", line):
                current = [c for c in find_attr(match.group(1)) if isinstance(c, type)]
                if not current:
                    problems.append(f"class {match.group(1)}")
            elif (match := re.match(r"\s+(?:async )?def (\w+)", line)) and not any(
                hasattr(c, match.group(1)) for c in current
            ):
                problems.append(f"method {match.group(1)}")
    assert not problems, f"code blocks name what the code does not have: {problems}"


# ---- the layering the doc states ------------------------------------------------------------


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def python_files(package: str) -> list[tuple[str, Path]]:
    directory = PACKAGE_DIRS[package]
    return [(p.relative_to(ROOT).as_posix(), p) for p in sorted(directory.glob("**/*.py"))]


def test_sans_io_cores_import_no_io() -> None:
    offenders = {
        rel: sorted(imports_of(path) & SANS_IO_FORBIDDEN)
        for rel, path in python_files("raven")
        if rel.startswith(SANS_IO) and imports_of(path) & SANS_IO_FORBIDDEN
    }
    assert not offenders, f"sans-IO modules doing I/O: {offenders}"


@pytest.mark.parametrize("application", APPLICATIONS)
def test_an_application_uses_no_other_application(application: str) -> None:
    others = set(APPLICATIONS) - {application}
    offenders = {
        rel: sorted(used)
        for rel, path in python_files(application)
        if (used := {o for o in imports_of(path) & others if (application, o) not in EMBEDDED})
    }
    assert not offenders, f"{application} importing another application: {offenders}"
