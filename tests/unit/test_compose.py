"""The docker-compose demo stack, checked without a Docker engine.

What is validated here: the compose file against the Compose specification (the `compose-spec`
package: the Rust compose_spec parser, after PyYAML resolves merge keys and ``${VAR:-default}``
is interpolated as compose does); every file it mounts exists or is produced by
compose/gen_keys.py; the network layout keeps Prometheus away from the edge sites; ports agree
between compose, the Raven configs, Prometheus, CoreDNS and Grafana; the rendered configs load
with the real config classes; every Raven command line parses with the real `raven` CLI parser.
What is not: that the images build and the containers start (no Docker engine here).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from raven import keys
from raven.config.agent import load_agent_config
from raven.config.common import parse_hostport
from raven.config.gateway import load_gateway_config
from raven_cli.main import build_parser
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_DIR = ROOT / "compose"
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` interpolation (no other forms are used)."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(1) in env:
            return env[m.group(1)]
        if m.group(2) is None:
            raise AssertionError(f"${{{m.group(1)}}} has no default in docker-compose.yml")
        return m.group(2)

    return _INTERPOLATION.sub(sub, text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(interpolate(COMPOSE_FILE.read_text(encoding="utf-8")))
    assert isinstance(data, dict)
    return data


def load_gen_keys() -> ModuleType:
    return load_script(COMPOSE_DIR / "gen_keys.py")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of compose/ with keys generated and templates rendered, as gen-keys.sh does."""
    base = tmp_path_factory.mktemp("compose")
    shutil.copytree(COMPOSE_DIR / "templates", base / "templates")
    load_gen_keys().generate(base, overrides={"KEY_DIR": str(base / "keys")})
    return base


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def service_networks(svc: dict[str, Any]) -> set[str]:
    nets = svc.get("networks", [])
    return set(nets) if isinstance(nets, list) else set(nets.keys())


def binds(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of every volume entry in short syntax."""
    out = []
    for entry in svc.get("volumes", []):
        parts = entry.split(":")
        out.append((parts[0], parts[1]))
    return out


def raven_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services(compose).items() if s.get("image") == "raven:dev"}


def port_of(listen: str) -> int:
    return parse_hostport(listen)[1]


# --- the Compose specification ---------------------------------------------------------------


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    parsed = PyCompose.from_json(json.dumps(compose))
    parsed.validate()  # every network/volume a service uses is defined at the top level
    assert set(parsed.service_names()) == set(services(compose))


def test_the_spec_parser_rejects_what_compose_would(compose: dict[str, Any]) -> None:
    """The validator used above is not a rubber stamp."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["networks"] = {"no-such-network": {}}
    with pytest.raises(ValueError, match="no-such-network"):
        PyCompose.from_json(json.dumps(broken)).validate()
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["ports"] = ["not-a-port"]
    with pytest.raises(ValueError):
        PyCompose.from_json(json.dumps(broken))


def test_every_service_names_an_image(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        assert svc.get("image"), f"{name}: no image"
        if svc["image"] == "raven:dev":
            assert svc["build"]["context"] == "."


# --- files ------------------------------------------------------------------------------------


def test_every_mounted_file_exists_or_is_generated(compose: dict[str, Any]) -> None:
    gen = load_gen_keys()
    generated_names = {p.name for p in (COMPOSE_DIR / "templates").glob("*.yaml")}
    key_names = {f"{n}.key" for n in gen.KEY_NAMES}
    named_volumes = set(compose.get("volumes", {}))
    checked = 0
    for name, svc in services(compose).items():
        for source, _target in binds(svc):
            if source in named_volumes:
                continue
            assert source.startswith("./"), f"{name}: {source} is neither ./path nor a volume"
            rel = Path(source[2:])
            if rel.parts[:2] == ("compose", "generated"):
                assert rel.name in generated_names, f"{name}: nothing renders {source}"
            elif rel.parts[:2] == ("compose", "keys"):
                assert rel.name in key_names, f"{name}: gen_keys.py makes no {source}"
            else:
                assert (ROOT / rel).exists(), f"{name}: {source} does not exist"
            checked += 1
    assert checked >= 10


def test_private_keys_are_not_in_the_tree() -> None:
    ignored = (COMPOSE_DIR / ".gitignore").read_text().split()
    assert "keys/" in ignored and "generated/" in ignored
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert "compose/keys" in dockerignore and "*.key" in dockerignore


def test_dockerfile_copies_existing_sources_and_runs_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M)
    sources = [s for line in copies for s in line.split()]
    assert "pyproject.toml" in sources
    for src in sources:
        if src != "README.md":  # the lead's README; required by pyproject's `readme`
            assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["raven"\]$', text, re.M)
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split()}  # type: ignore[union-attr]
    assert {10262, 10263, 10264, 10265, 10266, 10267, 9400} <= exposed
    assert re.search(r"apt-get install -y --no-install-recommends iproute2", text), "L3 runs `ip`"
    health = re.search(r"^HEALTHCHECK .*\n\s+CMD (\[.+\])$", text, re.M)
    assert health is not None
    probe = json.loads(health.group(1))
    compile(probe[2], "HEALTHCHECK", "exec")  # the probe is valid Python
    assert all(f"{p}" in probe[2] for p in (10265, 10266, 10267, 9400))


def test_keygen_has_the_capabilities_its_writes_need(compose: dict[str, Any]) -> None:
    """Root without DAC_OVERRIDE cannot write into ./compose, which the host user owns."""
    keygen = compose["services"]["keygen"]
    assert keygen["user"] == "0:0" and keygen["cap_drop"] == ["ALL"]
    assert set(keygen["cap_add"]) == {"CHOWN", "DAC_OVERRIDE", "FOWNER"}


# --- networks: Prometheus cannot reach the edge -----------------------------------------------


def test_prometheus_shares_no_network_with_the_edge(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    cloud_side = service_networks(svcs["prometheus"])
    edge = [n for n in svcs if n.startswith(("agent-", "edge-gpu-"))]
    assert len(edge) >= 6
    for name in edge:
        assert not service_networks(svcs[name]) & cloud_side, f"Prometheus can reach {name}"
    for net in ("site-a", "site-b"):
        assert compose["networks"][net].get("internal") is True


def test_gpu_nodes_are_reachable_only_through_their_agent(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    for site in ("a", "b"):
        agent_nets = service_networks(svcs[f"agent-site-{site}"])
        assert agent_nets == {"wan", f"site-{site}"}
    for name, svc in svcs.items():
        if name.startswith("edge-gpu-"):
            nets = service_networks(svc)
            assert len(nets) == 1 and next(iter(nets)).startswith("site-"), name
            assert svc["hostname"] == name
            assert service_networks(svcs["gateway"]).isdisjoint(nets)


# --- configs load and agree with each other ---------------------------------------------------


def test_rendered_configs_load_with_the_real_config_classes(generated: Path) -> None:
    gw = load_gateway_config(generated / "generated" / "gateway.yaml")
    by_name = {a.name: a for a in gw.agents}
    assert set(by_name) == {"site-a", "site-b"}
    for site in ("a", "b"):
        agent = load_agent_config(generated / "generated" / f"agent-site-{site}.yaml")
        pub = keys.encode_key(keys.public_key(keys.read_private_key_file(agent.private_key_file)))
        assert by_name[f"site-{site}"].public_key == pub
        gw_pub = keys.public_key(keys.read_private_key_file(gw.private_key_file))
        assert agent.gateway_public_key == keys.encode_key(gw_pub)
        for node in agent.nodes:
            assert by_name[f"site-{site}"].may_serve(node)


def test_gen_keys_keeps_keys_mode_0600_and_renews_on_force(tmp_path: Path) -> None:
    gen = load_gen_keys()
    shutil.copytree(COMPOSE_DIR / "templates", tmp_path / "templates")
    first = gen.generate(tmp_path)
    for name in gen.KEY_NAMES:
        mode = stat.S_IMODE((tmp_path / "keys" / f"{name}.key").stat().st_mode)
        assert mode == 0o600
    assert gen.generate(tmp_path) == first
    renewed = gen.generate(tmp_path, force=True)
    assert renewed["GATEWAY_PUBLIC_KEY"] != first["GATEWAY_PUBLIC_KEY"]
    text = (tmp_path / "generated" / "agent-site-a.yaml").read_text()
    assert renewed["GATEWAY_PUBLIC_KEY"] in text and "/etc/raven/keys/agent-site-a.key" in text


def test_key_files_in_configs_are_the_mounted_ones(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    pairs = {"gateway": "gateway.yaml"} | {f"agent-site-{s}": f"agent-site-{s}.yaml" for s in "ab"}
    for svc_name, template in pairs.items():
        cfg = yaml.safe_load(
            (COMPOSE_DIR / "templates" / template)
            .read_text()
            .replace("${KEY_DIR}", "/etc/raven/keys")
        )
        targets = {t for _s, t in binds(svcs[svc_name])}
        assert cfg["private_key_file"] in targets, svc_name
        config_target = next(t for s, t in binds(svcs[svc_name]) if s.endswith(template))
        argv = svcs[svc_name]["command"]
        assert argv[argv.index("--config") + 1] == config_target


def test_ports_agree_between_compose_configs_and_prometheus(
    compose: dict[str, Any], generated: Path
) -> None:
    svcs = services(compose)
    gw = load_gateway_config(generated / "generated" / "gateway.yaml")
    agents = [load_agent_config(generated / "generated" / f"agent-site-{s}.yaml") for s in "ab"]
    for agent in agents:
        host, port = parse_hostport(agent.gateway)
        assert host == "gateway" and port == port_of(gw.tunnel_listen)
    published = {int(p.split(":")[1]) for p in svcs["gateway"]["ports"]}
    assert published == {port_of(gw.proxy.http_listen), port_of(gw.admin_listen)}
    socat = svcs["proxy-ports"]["command"][0]
    assert svcs["proxy-ports"]["network_mode"] == "service:gateway"
    assert set(re.findall(r"TCP:127\.0\.0\.1:(\d+)", socat)) == {str(port_of(gw.proxy.http_listen))}

    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    proxy = f"http://gateway:{port_of(gw.proxy.http_listen)}"
    assert jobs["gpu-proxy"]["proxy_url"] == proxy
    assert jobs["gpu-http-sd"]["proxy_url"] == proxy
    sd_url = jobs["gpu-http-sd"]["http_sd_configs"][0]["url"]
    assert sd_url.startswith(f"http://gateway:{port_of(gw.admin_listen)}/api/v1/targets?port=")
    assert jobs["raven-gateway"]["static_configs"][0]["targets"] == [
        f"gateway:{port_of(gw.admin_listen)}"
    ]
    path_relabel = jobs["gpu-path"]["relabel_configs"]
    assert path_relabel[-1]["replacement"] == f"gateway:{port_of(gw.proxy.http_listen)}"
    assert path_relabel[0]["replacement"] == "/proxy/${1}/metrics"

    # DNS mode: every forwarded port is a port Prometheus scrapes and the agents allow.
    dns_ports = {int(p) for p in re.findall(r"TCP-LISTEN:(\d+)", socat)}
    scraped = {int(t.split(":")[1]) for t in jobs["gpu-dns"]["static_configs"][0]["targets"]}
    assert scraped <= dns_ports
    for agent in agents:
        assert scraped <= set(agent.allowed_ports)

    # Every GPU node is served by exactly one agent, authorised, and scraped in each mode.
    nodes = {n for a in agents for n in a.nodes}
    assert nodes == {n for n in svcs if n.startswith("edge-gpu-")}
    for job in ("gpu-dns", "gpu-proxy", "gpu-path"):
        targets = jobs[job]["static_configs"][0]["targets"]
        assert {t.split(":")[0] for t in targets} == nodes, job
    for agent in agents:
        for _node, address in agent.nodes.items():
            assert address in svcs and service_networks(svcs[address]) <= service_networks(
                svcs[f"agent-{agent.name}"]
            )


def test_dns_path_hosts_file_reaches_coredns_and_prometheus_uses_it(
    compose: dict[str, Any],
) -> None:
    svcs = services(compose)
    argv = svcs["coredns-hosts"]["command"]
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
    gw_ip = svcs["gateway"]["networks"]["cloud"]["ipv4_address"]
    assert opts["gateway-address"] == gw_ip
    assert opts["registry-url"] == "http://gateway:10265"
    output = Path(opts["output"])
    gen_volume = next(s for s, t in binds(svcs["coredns-hosts"]) if t == str(output.parent))
    corefile = (COMPOSE_DIR / "Corefile").read_text()
    hosts_path = Path(re.search(r"hosts (\S+) \{", corefile).group(1))  # type: ignore[union-attr]
    dns_volume = next(s for s, t in binds(svcs["coredns"]) if t.startswith(str(hosts_path.parent)))
    assert gen_volume == dns_volume and gen_volume in compose["volumes"]
    assert hosts_path.name == output.name == "tunnel-nodes"
    assert re.search(r"reload 300ms\s+fallthrough", corefile)
    assert svcs["prometheus"]["dns"] == [svcs["coredns"]["networks"]["cloud"]["ipv4_address"]]
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    admin = opts["admin-listen"].rsplit(":", 1)[1]
    assert jobs["raven-coredns-hosts"]["static_configs"][0]["targets"] == [f"coredns-hosts:{admin}"]


def test_grafana_provisioning_matches_the_stack(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    ds = yaml.safe_load(
        (COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in svcs["prometheus"]["ports"]
    prov = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/raven.yaml").read_text())
    path = prov["providers"][0]["options"]["path"]
    source = next(s for s, t in binds(svcs["grafana"]) if t == path)
    dashboards = list((ROOT / source[2:]).glob("*.json"))
    assert dashboards, "no dashboard JSON is provisioned"


# --- command lines ----------------------------------------------------------------------------


def test_every_raven_command_line_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    parser = build_parser()
    seen = set()
    for name, svc in raven_services(compose).items():
        if "command" not in svc:
            continue
        argv = svc["command"]
        argv = shlex.split(argv) if isinstance(argv, str) else list(argv)
        args = parser.parse_args(argv)
        seen.add(args.command)
        assert callable(args.func), name
    assert seen == {"gateway", "agent", "gpu-exporter", "coredns-hosts"}


def test_keygen_service_writes_into_the_mounted_compose_folder(compose: dict[str, Any]) -> None:
    svc = services(compose)["keygen"]
    assert svc["profiles"] == ["setup"]
    entry = svc["entrypoint"]
    base = entry[entry.index("--dir") + 1]
    assert ("./compose", base) in binds(svc)
    assert entry[entry.index("--owner") + 1] == "10001:10001"
    script = (COMPOSE_DIR / "gen-keys.sh").read_text()
    assert "--profile setup run --rm keygen" in script


def test_gen_keys_overrides_let_the_same_configs_run_natively(tmp_path: Path) -> None:
    gen = load_gen_keys()
    shutil.copytree(COMPOSE_DIR / "templates", tmp_path / "templates")
    argv = ["--dir", str(tmp_path), "--set", f"KEY_DIR={tmp_path / 'keys'}"]
    argv += ["--set", "GATEWAY_HOST=127.0.0.1", "--set", "EDGE_GPU_1_ADDRESS=127.0.0.11"]
    assert gen.main(argv) == 0
    agent = load_agent_config(tmp_path / "generated" / "agent-site-a.yaml")
    assert agent.gateway == "127.0.0.1:10262"
    assert agent.nodes["edge-gpu-1"] == "127.0.0.11"
    assert agent.nodes["edge-gpu-2"] == "edge-gpu-2"
    assert keys.read_private_key_file(agent.private_key_file)
    with pytest.raises(SystemExit):
        gen.main(["--dir", str(tmp_path), "--set", "NO_EQUALS_SIGN"])


def test_healthchecks_probe_the_admin_ports_of_the_configs(
    compose: dict[str, Any], generated: Path
) -> None:
    svcs = services(compose)
    gw = load_gateway_config(generated / "generated" / "gateway.yaml")
    expected = {"gateway": (port_of(gw.admin_listen), "/readyz")}
    for site in "ab":
        agent = load_agent_config(generated / "generated" / f"agent-site-{site}.yaml")
        expected[f"agent-site-{site}"] = (port_of(agent.admin_listen), "/readyz")
    argv = svcs["coredns-hosts"]["command"]
    admin = next(a for a in argv if a.startswith("--admin-listen="))
    expected["coredns-hosts"] = (port_of(admin.split("=", 1)[1]), "/healthz")
    for name, (port, path) in expected.items():
        probe = " ".join(svcs[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}{path}" in probe, name
