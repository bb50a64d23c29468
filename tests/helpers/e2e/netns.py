"""Network-namespace helpers for end-to-end tests (root only).

A :class:`Lab` owns everything a test creates: namespaces named ``rvn-<purpose>-<pid>``,
veth pairs between them, per-namespace ``/etc/netns/<ns>/resolv.conf`` files, and processes
started inside namespaces with ``ip netns exec`` (their output goes to a log file each, so a
failing test can print the last lines of every log). ``Lab.close()`` stops every process and
deletes every namespace, whatever happened; :func:`cleanup_stale` removes what a killed run
left behind.

The test process itself stays in the root namespace. To talk to a server inside a namespace
it creates sockets there (:meth:`Netns.new_socket`: a short-lived thread ``setns()``-es into the
namespace, creates the socket and exits; a socket keeps the namespace it was created in), so
HTTP requests, port waits and Prometheus API queries need no subprocess.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.helpers import require
from tests.helpers.threads import ThreadDidNotReturn, call_in_thread

T = TypeVar("T")

NS_PREFIX = "rvn-"
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
_CLONE_NEWNET = 0x40000000
_NS_NAME = re.compile(r"^rvn-[a-z0-9-]+-(\d+)$")


class NetnsError(RuntimeError):
    """A namespace operation or a command run for one failed; the message has its stderr."""


def ns_name(purpose: str) -> str:
    """``rvn-<purpose>-<pid>``, the name every namespace created by a test has."""
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", purpose):
        raise ValueError(f"namespace purpose {purpose!r}: use lower-case letters, digits, '-'")
    return f"{NS_PREFIX}{purpose}-{os.getpid()}"


def sh(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout_s: float = 30.0,
    input_text: str | None = None,
) -> str:
    """Run a command, return its stdout; NetnsError with its stderr when it fails."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            input=input_text,
        )
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{' '.join(argv)}: timed out after {timeout_s}s") from None
    except FileNotFoundError:
        raise NetnsError(f"{argv[0]}: not installed") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def missing_prerequisites(tools: Iterable[str] = ()) -> list[str]:
    """What stops namespace tests here: not root, ``ip`` or another tool missing."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not running as root")
    for tool in ("ip", *tools):
        path = tool if os.path.isabs(tool) else shutil.which(tool)
        if not path or not os.access(path, os.X_OK):
            problems.append(f"{tool} not found")
    return problems


# --- sockets inside a namespace ------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(name: str) -> None:
    """Switch the calling thread into network namespace ``name`` (setns is per thread)."""
    fd = os.open(NETNS_RUN_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(name: str, func: Callable[[], T]) -> T:
    """Call ``func`` in a fresh thread switched into namespace ``name``; return its result."""

    def enter() -> None:
        enter_netns(name)

    try:
        return call_in_thread(func, prepare=enter, name=f"netns-{name}", timeout_s=10.0)
    except ThreadDidNotReturn:
        raise NetnsError(f"{func!r} in namespace {name} did not return within 10s") from None


@dataclass(frozen=True)
class HttpResult:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


# --- namespaces ----------------------------------------------------------------------------


@dataclass
class Netns:
    """One network namespace (create it through :meth:`Lab.netns`)."""

    name: str

    def create(self) -> None:
        sh(["ip", "netns", "add", self.name])
        self.ip("link", "set", "lo", "up")

    def delete(self) -> None:
        """Kill whatever still runs inside, delete the namespace and its /etc/netns dir."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        sh(["ip", "netns", "del", self.name], check=False)
        shutil.rmtree(NETNS_ETC_DIR / self.name, ignore_errors=True)

    def pids(self) -> list[int]:
        out = sh(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in out.split() if p.isdigit()]

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout_s: float = 30.0,
        input_text: str | None = None,
    ) -> str:
        """Run a short command inside the namespace; its stdout."""
        return sh(self.exec_argv(argv), check=check, timeout_s=timeout_s, input_text=input_text)

    def nft(self, ruleset: str) -> None:
        """Load an nftables ruleset into this namespace (e.g. a Service-like DNAT)."""
        self.run(["nft", "-f", "-"], input_text=ruleset)

    def ip(self, *args: str) -> str:
        return sh(["ip", "-n", self.name, *args])

    def add_address(self, dev: str, cidr: str) -> None:
        self.ip("addr", "add", cidr, "dev", dev)
        self.ip("link", "set", dev, "up")

    def add_route(self, prefix: str, *, via: str | None = None, dev: str | None = None) -> None:
        args = ["route", "add", prefix]
        if via:
            args += ["via", via]
        if dev:
            args += ["dev", dev]
        self.ip(*args)

    def routes(self) -> str:
        return self.ip("route", "show") + self.ip("-6", "route", "show")

    def set_resolv_conf(self, nameservers: Sequence[str], search: Sequence[str] = ()) -> Path:
        """Write /etc/netns/<ns>/resolv.conf: ``ip netns exec`` bind-mounts it over
        /etc/resolv.conf for the processes it starts (``nsenter`` does not)."""
        path = NETNS_ETC_DIR / self.name / "resolv.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"nameserver {ns}" for ns in nameservers]
        if search:
            lines.append("search " + " ".join(search))
        lines.append("options timeout:1 attempts:2")
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- talking to servers inside --

    def new_socket(
        self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
    ) -> socket.socket:
        """A socket that lives in this namespace."""
        return run_in_netns(self.name, lambda: socket.socket(family, kind))

    def connect(self, host: str, port: int, timeout_s: float = 5.0) -> socket.socket:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        sock = self.new_socket(family)
        sock.settimeout(timeout_s)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    def http(
        self,
        host: str,
        port: int,
        target: str = "/",
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout_s: float = 10.0,
    ) -> HttpResult:
        """One HTTP/1.1 request to ``host:port`` from inside the namespace. ``target`` may be
        origin-form (``/metrics``) or absolute-form (``http://node:9400/metrics``); a ``Host``
        in ``headers`` replaces the default one."""
        sock = self.connect(host, port, timeout_s)
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        conn.sock = sock
        try:
            conn.request(method, target, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read()
            return HttpResult(
                resp.status, resp.reason, {k.lower(): v for k, v in resp.getheaders()}, data
            )
        finally:
            conn.close()

    def port_open(self, host: str, port: int) -> bool:
        try:
            self.connect(host, port, timeout_s=1.0).close()
        except OSError:
            return False
        return True

    def wait_for_port(
        self, host: str, port: int, timeout_s: float = 15.0, *, proc: Proc | None = None
    ) -> None:
        """Wait until ``host:port`` accepts connections (fail early if ``proc`` died)."""
        wait_until(
            lambda: self.port_open(host, port),
            timeout_s,
            f"{host}:{port} in {self.name} to accept connections",
            procs=[proc] if proc else [],
        )

    def wait_for_http(
        self,
        host: str,
        port: int,
        target: str = "/",
        *,
        ok: Callable[[HttpResult], bool] = lambda r: r.status == 200,
        timeout_s: float = 15.0,
        proc: Proc | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """Wait until a request to ``host:port`` gives a response ``ok`` accepts."""
        last: list[HttpResult | BaseException] = []

        def attempt() -> HttpResult | None:
            try:
                result = self.http(host, port, target, headers=headers, timeout_s=3.0)
            except (OSError, http.client.HTTPException) as exc:
                last[:] = [exc]
                return None
            last[:] = [result]
            return result if ok(result) else None

        got = wait_until(
            attempt,
            timeout_s,
            f"http://{host}:{port}{target} in {self.name}",
            procs=[proc] if proc else [],
            detail=lambda: f"last: {last[0]!r}"[:500] if last else "no attempt finished",
        )
        assert isinstance(got, HttpResult)
        return got


def veth(a: Netns, a_if: str, a_cidr: str, b: Netns, b_if: str, b_cidr: str) -> None:
    """A veth pair with one end in each namespace, addressed and up. Both ends are created
    directly inside their namespaces, so names never clash with the root namespace's."""
    if max(len(a_if), len(b_if)) > 15:
        raise ValueError("interface names are at most 15 characters")
    sh(["ip", "link", "add", a_if, "netns", a.name, "type", "veth", "peer", b_if, "netns", b.name])
    a.add_address(a_if, a_cidr)
    b.add_address(b_if, b_cidr)


# --- processes -----------------------------------------------------------------------------


@dataclass
class Proc:
    """A process started inside a namespace, with its own log file."""

    name: str
    argv: list[str]
    ns: Netns
    log_path: Path
    env: dict[str, str]
    cwd: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Proc:
        if self.alive:
            raise NetnsError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            self.starts += 1
            log.write(f"=== start #{self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.ns.exec_argv(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM its process group, wait, then SIGKILL; its exit status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(5)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would: no graceful shutdown."""
        if self.popen is not None and self.popen.poll() is None:
            self.signal(signal.SIGKILL)
            self.popen.wait(5)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.2,
    procs: Iterable[Proc] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; TimeoutError naming ``what``
    (and ``detail()``) after ``timeout_s``; NetnsError at once if one of ``procs`` exits."""
    deadline = time.monotonic() + timeout_s
    procs = list(procs)
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.popen is not None and not p.alive:
                raise NetnsError(
                    f"waiting for {what}: {p.name} exited with {p.returncode}:\n{p.tail(30)}"
                )
        if time.monotonic() >= deadline:
            extra = f" ({detail()})" if detail else ""
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}{extra}")
        time.sleep(interval_s)


# --- the lab -------------------------------------------------------------------------------


@dataclass
class Lab:
    """Everything one test creates; :meth:`close` undoes it all (also on failure)."""

    workdir: Path
    namespaces: list[Netns] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Extra sections for :meth:`diagnostics` (e.g. Prometheus's targets, a gateway's agents).
    diagnostic_hooks: list[Callable[[], str]] = field(default_factory=list)

    def netns(self, purpose: str) -> Netns:
        ns = Netns(ns_name(purpose))
        if (NETNS_RUN_DIR / ns.name).exists():  # a previous lab of this process leaked it
            ns.delete()
        ns.create()
        self.namespaces.append(ns)
        return ns

    def process(
        self,
        ns: Netns,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        start: bool = True,
    ) -> Proc:
        """A process in ``ns`` logging to ``<workdir>/<name>.log``; started unless told not."""
        if any(p.name == name for p in self.procs):
            raise ValueError(f"process name {name!r} used twice")
        full_env = {**self.base_env, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = Proc(
            name=name,
            argv=list(argv),
            ns=ns,
            log_path=self.workdir / f"{name}.log",
            env=full_env,
            cwd=str(cwd) if cwd else None,
        )
        self.procs.append(proc)
        if start:
            proc.start()
        return proc

    def diagnostics(self, lines: int = 40) -> str:
        """The last lines of every process log, the state of each process and the routes."""
        out: list[str] = []
        for p in self.procs:
            state = "running" if p.alive else f"exited {p.returncode}"
            out.append(f"----- {p.name} ({p.ns.name}, {state}) last {lines} lines of {p.log_path}")
            out.append(p.tail(lines))
        for ns in self.namespaces:
            with contextlib.suppress(NetnsError):
                out.append(f"----- routes in {ns.name}\n{ns.routes()}")
        for hook in self.diagnostic_hooks:
            try:
                out.append(hook())
            except Exception as exc:  # diagnostics must never hide the real failure
                out.append(f"----- diagnostic hook {hook!r} failed: {exc}")
        return "\n".join(out)

    def close(self, timeout_s: float = 5.0) -> None:
        """SIGTERM every process at once, SIGKILL what is left after ``timeout_s``, then
        delete the namespaces (which kills anything still inside)."""
        errors: list[str] = []
        for p in self.procs:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in reversed(self.procs):
            try:
                p.stop(timeout_s=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # cleanup goes on whatever happens
                errors.append(f"{p.name}: {exc}")
        for ns in reversed(self.namespaces):
            try:
                ns.delete()
            except Exception as exc:
                errors.append(f"{ns.name}: {exc}")
        self.namespaces.clear()
        if errors:
            raise NetnsError("cleanup: " + "; ".join(errors))

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Delete ``rvn-*-<pid>`` namespaces whose creating process is gone; their names."""
    removed: list[str] = []
    for name in list_namespaces():
        m = _NS_NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        Netns(name).delete()
        removed.append(name)
    return removed


@contextlib.contextmanager
def lab(workdir: Path) -> Iterator[Lab]:
    """``with lab(tmp_path) as lab:`` -- a Lab that is always closed."""
    the_lab = Lab(workdir)
    try:
        yield the_lab
    finally:
        the_lab.close()


def require_e2e(*tools: str) -> None:
    """Skip the test when not root or a tool is missing (in CI the skip fails the run)."""
    problems = missing_prerequisites(tools)
    require(not problems, "e2e prerequisites missing: " + "; ".join(problems))
