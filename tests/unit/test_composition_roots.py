"""raven/ is the shared library: no module of it imports an application (cloud_gateway,
edge_agent, gpu_exporter, coredns_hosts) or the composition roots (raven_cli/: the CLI, its
subcommands, the demo), which live outside it; no application imports raven_cli; and the CLI's
own subcommand modules import an application only inside the function that runs it, so each
subcommand loads only its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPLICATIONS = {"cloud_gateway", "edge_agent", "gpu_exporter", "coredns_hosts"}
APPLICATION_DIRS = ["cloud_gateway", "edge_agent", "gpu_exporter", "coredns-hosts/coredns_hosts"]


def application_imports(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) of every import of an application."""
    top = {id(n) for n in getattr(tree, "body", [])}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in APPLICATIONS:
                out.append((node.lineno, name, id(node) in top))
    return out


def test_the_library_imports_no_application_and_no_composition_root() -> None:
    offenders = []
    for path in sorted((ROOT / "raven").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, module, _ in application_imports(ast.parse(path.read_text())):
            offenders.append(f"{rel}:{line}: imports {module}")
        for line, module in imports_of(ast.parse(path.read_text()), "raven_cli"):
            offenders.append(f"{rel}:{line}: imports {module}")
    assert offenders == []


def test_no_application_imports_the_composition_roots() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for folder in APPLICATION_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "__main__.py"  # `python -m cloud_gateway`: the CLI's entry, not its code
        for line, module in imports_of(ast.parse(path.read_text()), "raven_cli")
    ]
    assert offenders == []


def imports_of(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import of ``package`` or its modules."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] if node.module.split(".")[0] == package else []
    return out


def test_cli_subcommand_modules_import_applications_lazily() -> None:
    eager = []
    cli = ROOT / "raven_cli"
    for path in [cli / "main.py", *sorted((cli / "commands").glob("*.py"))]:
        for line, module, top_level in application_imports(ast.parse(path.read_text())):
            if top_level:
                eager.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert eager == []
    # the gateway and agent subcommands do import their application, inside their function
    services = ast.parse((cli / "commands" / "services.py").read_text())
    lazy = {module for _, module, top_level in application_imports(services) if not top_level}
    assert lazy == {"cloud_gateway.app", "edge_agent.app"}
