"""The operator docs stay true to the code: every error reason, handshake result, metric, file
path and link they mention exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cloud_gateway.proxy.errors import ErrorKind
from tests.helpers.metrics import defined_metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MINE = ["concepts.md", "kubernetes.md", "operations.md", "troubleshooting.md", "backfill.md"]


def table_rows(text: str, heading: str) -> list[str]:
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")]


def handshake_results() -> set[str]:
    """Every reason the handshake code and the tunnel listener count under result=..."""
    results: set[str] = set()
    for path in (ROOT / "raven/protocol").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "HandshakeRejected"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                results.add(node.args[1].value)
    listener = (ROOT / "cloud_gateway/tunnel_listener.py").read_text()
    results |= set(re.findall(r'handshakes\.labels\("(\w+)"\)', listener))
    results.discard("ok")
    return results


def test_every_proxy_error_reason_is_explained_with_its_status() -> None:
    rows = table_rows((DOCS / "troubleshooting.md").read_text(), "Proxy errors")
    for kind in ErrorKind:
        row = next((r for r in rows if f"`{kind.value}`" in r.split("|")[2]), None)
        assert row is not None, f"troubleshooting.md does not explain {kind.value}"
        status_cell = row.split("|")[1]
        assert f"{kind.status} {kind.phrase}" in status_cell, (kind, status_cell)


def test_every_handshake_result_is_explained() -> None:
    results = handshake_results()
    assert {"unknown_key", "decrypt_failed", "replay", "rate_limited"} <= results
    rows = table_rows((DOCS / "troubleshooting.md").read_text(), "Handshake failures")
    explained = {m for r in rows for m in re.findall(r"`(\w+)`", r.split("|")[1])}
    assert results <= explained, f"not explained: {sorted(results - explained)}"


def test_metrics_named_in_the_docs_exist() -> None:
    metrics = defined_metrics()
    bases = {re.sub(r"_(bucket|count|sum)$", "", m) for m in metrics}
    for doc in MINE:
        for name in re.findall(r"\braven_[a-z0-9_]+\b", (DOCS / doc).read_text()):
            if name.endswith("_") or name == "raven_hosts_":
                continue  # a family prefix such as raven_hosts_*
            assert name in metrics or name in bases, f"{doc}: unknown metric {name}"


@pytest.mark.parametrize("doc", MINE)
def test_links_and_paths_resolve(doc: str) -> None:
    text = (DOCS / doc).read_text()
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)", text):
        path, anchor = target
        linked = DOCS / path
        assert linked.exists(), f"{doc} links to missing {path}"
        if anchor:
            body = linked.read_text()
            headings = {
                re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", body, re.M)
            }
            ids = set(re.findall(r'<a id="([\w-]+)">', body))
            assert anchor in headings | ids, f"{doc}: no #{anchor} in {path}"
    for path in re.findall(r"`((?:deploy|compose|scripts)/[\w./-]+)`", text):
        assert (ROOT / path.rstrip("/")).exists(), f"{doc} mentions missing {path}"
