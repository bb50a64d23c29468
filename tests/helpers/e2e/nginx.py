"""nginx for the end-to-end tests (Debian's package): one process in a namespace, its
configuration one ``server`` block around which this writes the rest (foreground, its own
pid and temp files under the lab's workdir, logs to stderr)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.e2e.netns import Lab, Netns, Proc

NGINX = "/usr/sbin/nginx"


def start_nginx(lab: Lab, ns: Netns, server: str, *, host: str, port: int) -> Proc:
    """nginx in ``ns`` serving the ``server { ... }`` block ``server``, up on ``host:port``."""
    folder = lab.workdir / "nginx"
    folder.mkdir()
    temp = "\n".join(f"  {k}_temp_path {folder}/{k};" for k in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))  # fmt: skip
    conf: Path = folder / "nginx.conf"
    conf.write_text(
        f"user root;\nworker_processes 1;\ndaemon off;\npid {folder}/nginx.pid;\n"
        f"error_log stderr warn;\nevents {{ worker_connections 256; }}\n"
        f"http {{\n  access_log off;\n{temp}\n{server}\n}}\n"
    )
    argv = ["setpriv", "--pdeathsig", "TERM", NGINX, "-c", str(conf), "-p", str(folder)]
    proc = lab.process(ns, "nginx", argv)
    ns.wait_for_port(host, port, timeout_s=30, proc=proc)
    return proc
