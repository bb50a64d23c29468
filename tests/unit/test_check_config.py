"""`raven check-config` and the config loader: every problem at once, with file:line:column
and the field path; duplicate keys refused; unknown fields get a did-you-mean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raven import keys
from raven.config.gateway import load_gateway_config
from raven.config.loader import ConfigError
from raven.config.source import parse_document
from raven_cli.commands.check_config import check_file, guess_kind

PUB = keys.encode_key(keys.public_key(keys.generate_private_key()))


def write(tmp_path: Path, text: str, name: str = "gw.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_every_problem_at_once_with_positions(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
private_key_file: gw.key
agents:
  - name: site-a
    public_key: "xx"
  - name: site-b
    public_key: "{PUB}"
    nodez: ["site-b-*"]
tunel_listen: "0.0.0.0:1"
limits:
  max_streams: many
""")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path)
    lines = str(info.value).splitlines()
    assert lines == [
        f"{path}:4:17: agents[0].public_key: agent 'site-a': public_key: 'xx': not valid "
        "base64; expected 44 base64 characters ending in '=': paste the output of raven pubkey "
        "< agent.key",
        f"{path}:7:5: agents[1].nodez: unknown field; did you mean 'nodes'?",
        f"{path}:8:1: tunel_listen: unknown field; did you mean 'tunnel_listen'?",
        f"{path}:10:16: limits.max_streams: expected an integer (like 1024), got 'many' (str)",
    ]
    assert len(info.value.problems) == 4
    by_path = {p.path: p for p in info.value.problems}
    assert by_path["tunel_listen"].position == (8, 1)
    assert by_path["agents[1].nodez"].position == (7, 5)
    assert by_path["limits.max_streams"].position == (10, 16)  # the value
    assert by_path["agents[0].public_key"].position == (4, 17)
    assert "did you mean 'tunnel_listen'" in by_path["tunel_listen"].message


def test_duplicate_key_is_refused_not_silently_replaced(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
private_key_file: gw.key
agents:
  - {{name: site-a, public_key: "{PUB}"}}
agents: []
""")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path)
    (problem,) = info.value.problems
    assert problem.path == "agents"
    assert problem.position == (4, 1)
    assert "duplicate key (first at line 2)" in problem.message


def test_nested_duplicate_and_yaml_syntax_positions() -> None:
    doc = parse_document("a:\n  b: 1\n  b: 2\n", "x.yaml")
    assert str(doc.problems[0]).startswith("x.yaml:3:3: a.b: duplicate key")
    doc = parse_document("a: [unclosed\n", "y.yaml")
    (problem,) = doc.problems
    assert str(problem).startswith("y.yaml:2:1: not valid YAML")
    assert "<byte string>" not in str(problem) and "<unicode string>" not in str(problem)


def test_file_named_once(tmp_path: Path) -> None:
    path = write(tmp_path, "private_key_file: 3\n")
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path)
    text = str(info.value)
    assert text.count(str(path)) == 1
    assert text == f"{path}:1:19: private_key_file: expected a string, got 3 (int) (quote it)"


def test_guess_kind() -> None:
    assert guess_kind({"gateway": "gw:1", "nodes": {}}) == "agent"
    assert guess_kind({"agents": []}) == "gateway"
    assert guess_kind({"private_key_file": "k"}) is None
    assert guess_kind(["a list"]) is None


def test_check_file_reads_key_files(tmp_path: Path) -> None:
    key = tmp_path / "gw.key"
    keys.write_private_key_file(key, keys.generate_private_key())
    path = write(tmp_path, f"private_key_file: {key}\nagents: []\n")
    assert check_file(str(path)) == ("gateway", [])
    key.chmod(0o644)
    kind, problems = check_file(str(path))
    assert kind == "gateway"
    (problem,) = problems
    assert problem.path == "private_key_file" and "chmod 600" in problem.message
    assert problem.position == (1, 1)
    assert check_file(str(path), key_files=False) == ("gateway", [])


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raven_cli.main", *args], capture_output=True, text=True, cwd=cwd,
        timeout=60,
    )  # fmt: skip


def test_check_config_command(tmp_path: Path) -> None:
    good = write(tmp_path, f"private_key_file: k\ngateway: gw:10262\ngateway_public_key: {PUB}\n",
                 "agent.yaml")  # fmt: skip
    bad = write(tmp_path, "private_key_file: k\nagents: []\nagent: []\nadmin_listen: x\n")
    proc = run_cli("check-config", "--no-key-files", str(good))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{good}: ok (agent config)\n"
    proc = run_cli("check-config", "--no-key-files", str(good), str(bad))
    assert proc.returncode == 2
    assert f"{bad}:3:1: agent: unknown field; did you mean 'agents'?" in proc.stderr
    assert f"{bad}:4:15: admin_listen:" in proc.stderr
    assert f"{bad}: 2 problems" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("check-config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2
    assert "cannot read: No such file or directory" in proc.stderr


def test_check_config_across_a_gateway_and_its_agents(tmp_path: Path) -> None:
    """Each file valid alone, together wrong: the agent pasted its own public key, one agent
    is not authorised, one node is outside its entry's globs; each finding at the agent
    file's line, naming the gateway file and what to write."""
    gw_key, a_key, b_key = tmp_path / "gw.key", tmp_path / "a.key", tmp_path / "b.key"
    pubs = {}
    for path in (gw_key, a_key, b_key):
        private = keys.generate_private_key()
        path.write_text(keys.encode_key(private) + "\n")
        path.chmod(0o600)
        pubs[path.name] = keys.encode_key(keys.public_key(private))
    gateway = write(tmp_path, f"""\
private_key_file: {gw_key}
agents:
  - name: site-a
    public_key: "{pubs['a.key']}"
    nodes: ["site-a-*"]
""")  # fmt: skip
    agent_a = write(tmp_path, f"""\
private_key_file: {a_key}
gateway: gw:10262
gateway_public_key: "{pubs['a.key']}"
nodes:
  site-a-gpu-1: 192.168.1.10
  site-b-gpu-1: 192.168.1.11
""", "agent-a.yaml")  # fmt: skip
    agent_b = write(tmp_path, f"""\
private_key_file: {b_key}
gateway: gw:10262
gateway_public_key: "{pubs['b.key'][:-4]}AAA="
""", "agent-b.yaml")  # fmt: skip
    for one in (gateway, agent_a, agent_b):  # each alone: valid
        assert run_cli("check-config", str(one)).returncode == 0
    proc = run_cli("check-config", str(gateway), str(agent_a), str(agent_b))
    assert proc.returncode == 2, proc.stdout
    err = proc.stderr
    assert f"{agent_a}:3:21: gateway_public_key: is this agent's own public key" in err, err
    assert f"{agent_a}:6:3: nodes.site-b-gpu-1: not covered by {gateway}'s agents entry" in err
    assert f"{agent_b}:1:19: private_key_file: this agent's key ({pubs['b.key']}) is not" in err
    wrong = f"{pubs['b.key'][:12]}... is not the public key of the gateway in {gateway}"
    assert f"{agent_b}:3:21: gateway_public_key: {wrong} ({pubs['gw.key']})" in err
    assert f"{gateway}: ok (gateway config)" in proc.stdout
    good = write(tmp_path, agent_a.read_text().replace(pubs["a.key"], pubs["gw.key"])
                 .replace("  site-b-gpu-1: 192.168.1.11\n", ""), "agent-good.yaml")  # fmt: skip
    assert run_cli("check-config", str(gateway), str(good)).returncode == 0


def test_default_timeout_above_the_cap_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, """\
private_key_file: gw.key
proxy:
  default_timeout_s: 60
  max_timeout_s: 5
""")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path)
    (problem,) = info.value.problems
    assert problem.path == "proxy.default_timeout_s"  # at the field the message names
    assert "default_timeout_s (60) must be above 0 and at most max_timeout_s (5)" in str(problem)
