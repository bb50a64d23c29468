"""raven/ is the shared library: no module of it imports an application (cloud_gateway,
edge_agent, gpu_exporter, coredns_hosts) except the two composition roots, the CLI (raven/cli.py
and its raven/commands/) and the demo (raven/demo/); and the CLI's own subcommand modules import
an application only inside the function that runs it, so each subcommand loads only its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPLICATIONS = {"cloud_gateway", "edge_agent", "gpu_exporter", "coredns_hosts"}


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


def test_only_the_composition_roots_import_applications() -> None:
    offenders = []
    for path in sorted((ROOT / "raven").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "raven/cli.py" or rel.startswith(("raven/commands/", "raven/demo/")):
            continue
        for line, module, _ in application_imports(ast.parse(path.read_text())):
            offenders.append(f"{rel}:{line}: imports {module}")
    assert offenders == []


def test_cli_subcommand_modules_import_applications_lazily() -> None:
    eager = []
    for path in [ROOT / "raven" / "cli.py", *sorted((ROOT / "raven" / "commands").glob("*.py"))]:
        for line, module, top_level in application_imports(ast.parse(path.read_text())):
            if top_level:
                eager.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert eager == []
    # the gateway and agent subcommands do import their application, inside their function
    services = ast.parse((ROOT / "raven" / "commands" / "services.py").read_text())
    lazy = {module for _, module, top_level in application_imports(services) if not top_level}
    assert lazy == {"cloud_gateway.app", "edge_agent.app"}
