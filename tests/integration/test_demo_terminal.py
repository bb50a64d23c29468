"""The demo's live view under a real terminal (tmux) at 80x24: the URLs and the "Try:" lines stay
on screen after the view refreshes, no line wraps, and a node table too long for the screen is cut
with a "more" line. The Prometheus link it shows redirects to the graph with a range that fits
the demo's age. Closing the terminal stops the demo and every process it started."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.helpers import require

COLUMNS, ROWS = 80, 24


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _capture(session: str) -> list[str]:
    out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return out.splitlines()


def _wait_for_frame(session: str, timeout_s: float) -> list[str]:
    """The screen once the live view has redrawn at least twice (two different clocks)."""
    clocks: set[str] = set()
    deadline = time.monotonic() + timeout_s
    screen: list[str] = []
    while time.monotonic() < deadline:
        screen = _capture(session)
        if screen and (m := re.match(r"Raven demo (\d\d:\d\d:\d\d):", screen[0])):
            clocks.add(m.group(1))
            if len(clocks) >= 2:
                return screen
        time.sleep(0.5)
    raise AssertionError("the live view did not redraw twice:\n" + "\n".join(screen))


def test_live_view_fits_80x24_and_keeps_urls_and_try_lines(tmp_path: Path) -> None:
    require(shutil.which("tmux") is not None, "tmux missing: run scripts/setup as root")
    require(shutil.which("prometheus") is not None, "prometheus missing: run scripts/setup")
    session = f"raven-demo-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "raven_cli.main", "demo", "--base-port", "0", "--sites", "3",
           "--nodes-per-site", "5", "--workdir", str(tmp_path / "demo")]  # fmt: skip
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(COLUMNS),
                    "-y", str(ROWS), " ".join(cmd) + f" 2>{tmp_path / 'err'}; sleep 60"],
                   check=True)  # fmt: skip
    try:
        screen = _wait_for_frame(session, timeout_s=90)
        link = _check_screen(screen)
        _check_link(link)
    finally:
        # the terminal goes away (SIGHUP), as when its window is closed
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    # the demo stops cleanly: its Prometheus (and every other child) goes with it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _processes_using(tmp_path / "demo"):
        time.sleep(0.5)
    assert _processes_using(tmp_path / "demo") == []
    assert "Traceback" not in (tmp_path / "err").read_text()


def _processes_using(workdir: Path) -> list[str]:
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if str(workdir) in line]


def _check_screen(screen: list[str]) -> str:
    text = "\n".join(screen)
    assert len(screen) <= ROWS, text
    # the first line is the view's own heading: nothing scrolled it away
    assert re.match(r"Raven demo \d\d:\d\d:\d\d: 3/3 agents up, \d+/15 nodes", screen[0]), text
    prom = re.search(r"^Prometheus, GPU utilisation by node:  (http://\S+/)$", text, re.M)
    status = re.search(r"^Gateway status page: +(http://\S+/)$", text, re.M)
    assert prom and status, text
    # every "Try:" line whole, on a line of its own (none wrapped at 80 columns)
    tries = text.split("\nTry:\n", 1)[1].splitlines()
    assert [t.split()[0] for t in tries[:5]] == ["curl"] * 4 + ["raven"], text
    assert tries[0].endswith("/metrics | head") and "Host: site-a-gpu-1:" in tries[0]
    assert tries[4].startswith("  raven status --gateway http://")
    assert all(len(line) <= COLUMNS for line in screen)
    # 15 nodes do not fit beside the rest: the table is cut with a pointer to the full list
    assert re.search(r"^\.\.\. \d+ more nodes: raven status lists every one$", text, re.M), text
    assert "site-a-gpu-1" in text
    return prom.group(1)


def _check_link(link: str) -> None:
    """The short link redirects to the Prometheus graph over a range that fits a young demo."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(link, timeout=10)
        raise AssertionError("no redirect")
    except urllib.error.HTTPError as exc:
        assert exc.code == 302
        location = exc.headers["Location"]
    assert "/graph?" in location and "g0.range_input=1m" in location, location
    assert "DCGM_FI_DEV_GPU_UTIL" in urllib.request.unquote(location)
    with urllib.request.urlopen(location, timeout=10) as resp:  # Prometheus answers it
        assert resp.status == 200
