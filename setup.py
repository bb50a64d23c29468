"""setuptools' entry for the parts pyproject.toml cannot say: the optional compiled core.

``RAVEN_COMPILE=1 pip install .`` (or ``python -m build``) compiles the sans-IO core
(``raven/protocol`` and ``raven/l3``) and the adapters every scrape passes through
(``HOT_PATH``) with mypyc into the wheel; the ``.py`` files ship beside the extension modules
as the pure-Python fallback. Without it the build is pure Python.
``scripts/raven_build.py`` adds mypy to the isolated build's requirements when asked;
``scripts/build-compiled`` compiles the same modules in place for development.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup

#: The sans-IO packages compiled: the tunnel protocol and the L3 packet path (no I/O in either).
PACKAGES = ("raven/protocol", "raven/l3")

#: The asyncio adapters and HTTP modules every proxied scrape runs through, in the gateway
#: (HTTP head parsing and rewriting, the exchange, the response relay, the client connection)
#: and in both processes (the tunnel, its streams, the turn budget, the splice to a target):
#: bench/bench_l7_calls.py lists them. Compiled beside the core they take ~13 % off the CPU a
#: scrape costs (BENCHMARKS.md, issue 35). Of the other modules of these packages, set-up,
#: the TLS client and the proxies on the way to the gateway run once per connection; the
#: WebSocket framing (ws:// and wss:// tunnels) and the TUN loop are per packet but not in the
#: set yet: no benchmark has shown what compiling them buys.
HOT_PATH = (
    *(f"raven/transport/{m}.py" for m in ("deadlines", "inbox", "send_burst", "splice",
                                           "stream", "tunnel", "tunnel_stream",
                                           "tunnel_streams", "turn_budget")),
    *(f"cloud_gateway/proxy/{m}.py" for m in ("client_conn", "context", "exchange", "framing",
                                               "heads", "http_conn", "response_relay",
                                               "rewrite", "stream_pool", "target",
                                               "tls_conn")),
)  # fmt: skip
#: (An interpreted class cannot subclass a compiled one, so a class subclassed outside this set
#: is compiled with its subclasses (ClientConnection with TlsConnection) or stays pure:
#: raven/transport/read_buffer.py's CopyingReader, which the WebSocket receiver subclasses.)

#: Stay pure: frozen dataclasses with ClassVar fields (frames, events), which mypyc cannot
#: compile as written; limits (mypyc would turn its int defaults of float fields into floats,
#: which the configuration reference shows); every package's __init__.
PURE = frozenset(
    {"raven/protocol/frames.py", "raven/protocol/events.py", "raven/protocol/limits.py"}
)

#: the checkout (setuptools and scripts/build-compiled run this file from it)
ROOT = Path(__file__).resolve().parent


def core_modules() -> list[str]:
    """The modules mypyc compiles, as paths relative to the checkout."""
    core = (
        f"{package}/{p.name}"
        for package in PACKAGES
        for p in (ROOT / package).glob("*.py")
        if p.name != "__init__.py" and f"{package}/{p.name}" not in PURE
    )
    return sorted((*core, *HOT_PATH))


#: setup.py commands that build the extension modules (the others, sdist and the metadata and
#: requirement queries, run where mypyc is not installed)
BUILDS = frozenset({"bdist_wheel", "build", "build_ext", "install"})
#: editable installs: the checkout's own .py files run; scripts/build-compiled compiles them
EDITABLE = frozenset({"develop", "editable_wheel"})


def compiled_core() -> list[Any]:
    if os.environ.get("RAVEN_COMPILE") != "1":
        return []
    if EDITABLE & set(sys.argv[1:]):
        raise SystemExit(
            "RAVEN_COMPILE=1 builds wheels; in an editable checkout run scripts/build-compiled"
        )
    try:
        from mypyc.build import mypycify
    except ImportError:
        if BUILDS & set(sys.argv[1:]):
            raise SystemExit(
                "RAVEN_COMPILE=1 needs mypyc (pip install mypy) where the wheel is built"
            ) from None
        return []

    # group_name keeps the runtime the modules share inside the package
    # (raven/protocol/_core__mypyc), importable wherever raven is
    return mypycify(core_modules(), group_name="raven.protocol._core", opt_level="3")


if __name__ == "__main__":
    setup(ext_modules=compiled_core())
