"""Backfill writes into two real receivers behind an authenticating, TLS-terminating proxy.

One network namespace: Prometheus 2.42 (``--web.enable-remote-write-receiver``) and
VictoriaMetrics (both Debian packages) behind nginx, which serves TLS with a certificate of
the test's own CA and answers 401 unless ``Authorization: Bearer right-token`` (and, for
VictoriaMetrics, 403 unless the tenant header is ``X-Scope-OrgID: tenant-a``), as a managed
or shared receiver would. The gateway's own code writes, from its config file as an operator
writes it (``backfill.remote_write``: bearer_token_file, tls_config, headers): a wrong token
is refused (401, the batch kept for retry, the token never shown), the rotated right token is
accepted without a restart, a wrong CA is refused at the handshake, and every series lands in
each receiver with its samples, queried back through each one's own API.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import python_env, write_key
from tests.helpers.certs import make_ca
from tests.helpers.e2e.netns import Lab, Netns, wait_until
from tests.helpers.e2e.nginx import NGINX, start_nginx
from tests.helpers.e2e.prometheus import PROMETHEUS_BIN, Prometheus

pytestmark = pytest.mark.e2e

VICTORIA = "/usr/bin/victoria-metrics"
NAME = "receiver.test"
PROM_PORT, VM_PORT, TLS_PORT = 9090, 8428, 8443
SERIES = 20  # series per write, 4 samples each
TOKEN = "right-token"

#: Writes one batch through the gateway's backfill receiver, configured from a gateway config
#: file; prints the refusal (or null when the receiver answered 2xx).
DRIVER = """
import asyncio, json, sys, time
from prometheus_client import CollectorRegistry
from cloud_gateway.backfill.receiver import BackfillReceiver
from raven.config.gateway import load_gateway_config
config, metric = load_gateway_config(sys.argv[1]).backfill, sys.argv[2]
base, count = int(sys.argv[3]), int(sys.argv[4])
series = [((("__name__", metric), ("job", "edge"), ("series", str(i))),
           [(base + k * 15000, float(i * 10 + k)) for k in range(4)]) for i in range(count)]
async def main():
    receiver = BackfillReceiver(config, CollectorRegistry(), discovery=lambda n, p: {})
    try:
        ack = await receiver.write_series("site-a", series)
    finally:
        await receiver.close()
    print(json.dumps(None if ack is None else {"retry": ack.retry, "error": ack.error}))
asyncio.run(main())
"""


def start_receivers_proxy(lab: Lab, ns: Netns, cert: Path, key: Path) -> None:
    """nginx in front of both receivers: TLS, a bearer token, a tenant header for one."""
    server = f"""  server {{
    listen 127.0.0.1:{TLS_PORT} ssl;
    server_name {NAME};
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location /prometheus/ {{
      if ($http_authorization != "Bearer {TOKEN}") {{ return 401 "bad token\\n"; }}
      proxy_pass http://127.0.0.1:{PROM_PORT}/;
    }}
    location /victoria/ {{
      if ($http_authorization != "Bearer {TOKEN}") {{ return 401 "bad token\\n"; }}
      if ($http_x_scope_orgid != "tenant-a") {{ return 403 "no tenant\\n"; }}
      proxy_pass http://127.0.0.1:{VM_PORT}/;
    }}
  }}"""
    start_nginx(lab, ns, server, host="127.0.0.1", port=TLS_PORT)


def gateway_file(lab: Lab, name: str, path: str, ca: Path, token: Path) -> Path:
    """A gateway config whose backfill writes to ``path`` behind nginx."""
    key = lab.workdir / "gw.key"
    if not key.exists():
        write_key(key)
    config: dict[str, Any] = {
        "private_key_file": str(key),
        "agents": [],
        "backfill": {
            "enabled": True,
            "remote_write_url": f"https://127.0.0.1:{TLS_PORT}/{path}",
            "timeout_s": 10,
            "remote_write": {
                "bearer_token_file": str(token),
                "tls_config": {"ca_file": str(ca), "server_name": NAME},
                "headers": {"X-Scope-OrgID": "tenant-a"},
            },
        },
    }
    file = lab.workdir / f"gateway-{name}.yaml"
    file.write_text(yaml.safe_dump(config))
    return file


def write_batch(ns: Netns, config: Path, metric: str, base_ms: int) -> Any:
    env = [f"{k}={v}" for k, v in python_env().items()]
    argv = [sys.executable, "-c", DRIVER, str(config), metric, str(base_ms), str(SERIES)]
    out = ns.run(["env", *env, *argv])
    return json.loads(out.strip().splitlines()[-1])


def vm_count(ns: Netns, metric: str) -> int:
    query = urllib.parse.urlencode({"query": f"count_over_time({metric}[10m])", "nocache": "1"})
    body = json.loads(ns.http("127.0.0.1", VM_PORT, f"/api/v1/query?{query}").body)
    return sum(int(float(r["value"][1])) for r in body["data"]["result"])


def test_authenticated_receivers_prometheus_and_victoriametrics(lab: Lab) -> None:
    from tests.helpers.e2e.netns import require_e2e

    require_e2e(PROMETHEUS_BIN, VICTORIA, NGINX)
    ns = lab.netns("rw")
    ca = make_ca(lab.workdir, "rw-ca")
    (lab.workdir / "other").mkdir()
    other_ca = make_ca(lab.workdir / "other", "other-ca")  # not the one nginx's certificate has
    cert, key = ca.issue(NAME, lab.workdir)
    prom = Prometheus(lab, ns, [], listen=f"127.0.0.1:{PROM_PORT}",
                      extra_config={"storage": {"tsdb": {"out_of_order_time_window": "1h"}}},
                      extra_args=["--web.enable-remote-write-receiver"]).start()  # fmt: skip
    vm = lab.process(ns, "victoria-metrics", [
        VICTORIA, f"-storageDataPath={lab.workdir / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{VM_PORT}", "-search.disableCache",
        "-search.latencyOffset=1s", "-loggerLevel=WARN"])  # fmt: skip
    ns.wait_for_http("127.0.0.1", VM_PORT, "/health", timeout_s=30, proc=vm)
    start_receivers_proxy(lab, ns, cert, key)
    token = lab.workdir / "token"
    token.write_text("wrong-token\n")
    base = int(time.time() * 1000) - 120_000
    for name, path in (("prometheus", "prometheus/api/v1/write"),
                       ("victoria", "victoria/api/v1/write")):  # fmt: skip
        config = gateway_file(lab, name, path, ca.pem, token)
        token.write_text("wrong-token\n")
        refused = write_batch(ns, config, f"raven_rw_{name}", base)
        assert refused["retry"] and "401" in refused["error"], refused  # kept for retry
        assert "bearer_token_file" in refused["error"] and "wrong-token" not in refused["error"]
        token.write_text(f"{TOKEN}\n")  # the Secret rotated: the next write uses it
        assert write_batch(ns, config, f"raven_rw_{name}", base) is None
        bad_ca = gateway_file(lab, f"{name}-bad-ca", path, other_ca.pem, token)
        refused = write_batch(ns, bad_ca, f"raven_rw_{name}", base)
        assert refused["retry"] and "certificate verify failed" in refused["error"], refused
    # every series with its four samples, in each receiver, once
    query = "count_over_time(raven_rw_prometheus[10m])"
    wait_until(lambda: len(prom.query(query)) == SERIES, 30, "the series in Prometheus")
    assert {float(r["value"][1]) for r in prom.query(query)} == {4.0}
    wait_until(lambda: vm_count(ns, "raven_rw_victoria") == 4 * SERIES, 60,
               "the samples in VictoriaMetrics")  # fmt: skip
