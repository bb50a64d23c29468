"""The `raven` command: lazy imports per subcommand, --version, help for every subcommand and
flag, documented exit codes."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys

import pytest

from raven.version import version
from raven_cli.main import COMMANDS, build_parser, run_async


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raven_cli.main", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def loaded_modules(argv: list[str]) -> set[str]:
    """Top packages imported by building the parser for ``argv`` in a fresh interpreter."""
    code = (
        "import sys, json; from raven_cli.main import build_parser; "
        f"build_parser({argv!r}); print(json.dumps(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(proc.stdout))


def test_applications_are_imported_only_for_their_subcommand() -> None:
    apps = {"cloud_gateway", "edge_agent", "coredns_hosts", "gpu_exporter", "raven_cli.demo",
            "kubernetes", "aiohttp", "prometheus_client"}  # fmt: skip
    assert not apps & loaded_modules([])
    assert not apps & loaded_modules(["keygen"])
    agent = loaded_modules(["agent"])
    assert not {"coredns_hosts", "kubernetes", "raven_cli.demo", "cloud_gateway"} & agent
    assert not any(m.startswith("gpu_exporter") for m in agent)
    assert "coredns_hosts.cli" in loaded_modules(["coredns-hosts"])


def test_a_bad_environment_variable_of_one_subcommand_does_not_break_another() -> None:
    proc = run("keygen", env={"DCGM_EXPORTER_INTERVAL": "30s"})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip()) == 44


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"raven {version()} (raven-edge; Python ")


def test_every_subcommand_and_flag_has_a_one_line_help() -> None:
    parser = build_parser()
    subactions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (sub,) = subactions
    listed = {c.dest: c.help for c in sub._choices_actions}
    assert set(listed) == {c.name for c in COMMANDS}
    missing = []
    for name, p in sub.choices.items():
        assert listed[name] and "\n" not in listed[name]
        parsers = [(name, p)]
        for a in p._actions:  # coredns-hosts has actions of its own (run, check)
            if isinstance(a, argparse._SubParsersAction):
                parsers += [(f"{name} {n}", q) for n, q in a.choices.items()]
        for where, q in parsers:
            for action in q._actions:
                if isinstance(action, argparse._SubParsersAction):
                    continue
                if not action.help or action.help == argparse.SUPPRESS:
                    missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"flags without help: {missing}"


def test_help_lists_commands_and_exit_codes() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    for command in COMMANDS:
        assert command.name in proc.stdout
    assert "exit codes: 0 ok" in " ".join(proc.stdout.split())


def test_every_subcommand_help_runs_and_logging_flags_are_everywhere() -> None:
    for command in COMMANDS:
        proc = run(command.name, "--help")
        assert proc.returncode == 0, (command.name, proc.stderr)
        assert "--log-format" in proc.stdout, command.name


def test_unknown_command_is_a_usage_error() -> None:
    proc = run("gatway")
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "raven: unknown command 'gatway'; did you mean 'gateway'? 'raven --help' lists them\n"
    )


def test_a_bad_environment_variable_is_named_by_its_own_subcommand() -> None:
    proc = run("gpu-exporter", "--simulate", "1", env={"DCGM_EXPORTER_INTERVAL": "30s"})
    assert proc.returncode == 2
    assert "'30s' is not a positive number of milliseconds" in proc.stderr
    assert "DCGM_EXPORTER_INTERVAL" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("event_loop", "module"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")]
)
def test_run_async_runs_on_the_chosen_event_loop(event_loop: str, module: str) -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    async def main() -> int:
        return 0 if await loop_module() == module else 1

    assert run_async(main(), event_loop) == 0


def test_help_wraps_at_the_terminal_width_without_shutil(monkeypatch: pytest.MonkeyPatch) -> None:
    """raven_cli.main's HelpFormatter finds the width as shutil.get_terminal_size does (COLUMNS,
    else stdout's terminal, else 80): argparse's own would import shutil (zlib, bz2, lzma)."""
    from raven_cli.main import terminal_columns

    monkeypatch.setenv("COLUMNS", "60")
    assert terminal_columns() == 60
    monkeypatch.setenv("COLUMNS", "wide")  # not a number: stdout's terminal
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((132, 40)))
    assert terminal_columns() == 132

    def no_terminal(fd: int) -> os.terminal_size:
        raise OSError(25, "Inappropriate ioctl for device")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert terminal_columns() == 80
    proc = run("agent", "--help", env={"COLUMNS": "60"})
    assert proc.returncode == 0
    assert max(len(line) for line in proc.stdout.splitlines()) <= 60
    assert "usage: raven agent" in proc.stdout
