"""Helpers shared by the deployment tests (kustomize, Helm; tests/unit/test_deploy_common.py
tests them).

- :func:`validate_object`: a Kubernetes object against the official JSON schemas shipped by
  `kubernetes-validate` (strict: unknown fields are errors); ServiceMonitor, PodMonitor,
  PrometheusRule and ScrapeConfig against the Prometheus Operator CRD schemas vendored in
  tests/fixtures/crds/ (strict too).
- :func:`pod_security_violations`: the Pod Security Standards "restricted" profile (baseline
  included) for a pod spec.
- :func:`strategic_merge`: the part of Kubernetes' strategic merge patch that our patches use
  (maps merge; lists of containers/volumes/... merge on their patch merge key; other lists are
  replaced). Anything else is not implemented.
- :func:`check_workloads`: the security, probe and resource rules every Raven workload follows.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

from raven import keys

ROOT = Path(__file__).resolve().parents[2]
#: Kubernetes version the manifests are validated against (kubernetes-validate's schemas).
K8S_VERSION = "1.30.0"

#: Patch merge keys of the lists our patches touch (from the Kubernetes API's
#: x-kubernetes-patch-merge-key); other lists are replaced, as strategic merge does.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}

#: The Prometheus Operator CRD schemas, vendored (tests/fixtures/crds/README.md names the source
#: and version), keyed by (apiVersion, kind).
CRD_DIR = ROOT / "tests" / "fixtures" / "crds"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.json",
    ("monitoring.coreos.com/v1alpha1", "ScrapeConfig"): "scrapeconfig.json",
}


@functools.cache
def crd_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CRD_DIR / name).read_text())
    return schema


#: What the API server's validation adds to the JSON schemas (which do not encode it):
#: port names are IANA service names, object names DNS-1123 (subdomains; labels for Services).
_PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def validate_object(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not a valid Kubernetes object of its kind."""
    crd = CRD_SCHEMAS.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if crd is not None:
        jsonschema.validate(obj, crd_schema(crd))
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},
            K8S_VERSION,
            strict=True,
        )  # the metadata, against ObjectMeta
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    _api_server_rules(obj)


def _api_server_rules(obj: dict[str, Any]) -> None:
    name = obj["metadata"]["name"]
    pattern = _DNS_LABEL if obj["kind"] in {"Service", "Namespace"} else _DNS_SUBDOMAIN
    assert pattern.match(name), f"{obj['kind']} name {name!r} is not a valid DNS name"
    ports: list[dict[str, Any]] = []
    if obj["kind"] == "Service":
        ports = obj["spec"].get("ports", [])
    elif obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}:
        spec = obj["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            ports += c.get("ports", [])
            assert _DNS_LABEL.match(c["name"]), f"container name {c['name']!r}"
    for p in ports:
        if "name" in p:
            assert _PORT_NAME.match(p["name"]), f"{name}: port name {p['name']!r} is invalid"


def strategic_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Apply ``patch`` to a copy of ``base`` (the subset of strategic merge described above)."""
    out = copy.deepcopy(base)
    _merge_into(out, patch)
    return out


def _merge_into(base: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if key.startswith("$"):
            raise NotImplementedError(f"strategic merge directive {key} is not supported here")
        current = base.get(key)
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            _merge_into(current, value)
        elif isinstance(value, list) and isinstance(current, list) and key in MERGE_KEYS:
            merge_key = MERGE_KEYS[key]
            by_key = {item[merge_key]: item for item in current}
            for item in value:
                if item[merge_key] in by_key:
                    _merge_into(by_key[item[merge_key]], item)
                else:
                    current.append(copy.deepcopy(item))
        else:
            base[key] = copy.deepcopy(value)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec(obj)["containers"] if c["name"] == name)


def is_l3_container(c: dict[str, Any]) -> bool:
    return "NET_ADMIN" in c.get("securityContext", {}).get("capabilities", {}).get("add", [])


#: The only workload that runs as root (see deploy/kustomize/gpu-exporter/daemonset.yaml).
GPU_EXPORTER = "raven-gpu-exporter"


def check_workloads(objs: list[dict[str, Any]], *, l3: bool) -> None:
    """Security contexts, probes, resources and key handling of every workload."""
    for w in workloads(objs):
        name = w["metadata"]["name"]
        spec = pod_spec(w)
        pod_sc = spec.get("securityContext", {})
        gpu = name == GPU_EXPORTER or name.endswith(("-gpu-exporter-cloud", "-gpu-exporter-edge"))
        if gpu and spec.get("hostPID"):  # root: pod-resources and other pods' /proc, as dcgm
            assert pod_sc.get("runAsUser") == 0, name
        else:
            assert pod_sc.get("runAsNonRoot") is True, name
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            where = f"{name}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            res = c["resources"]
            assert res["requests"]["cpu"] and res["requests"]["memory"], where
            assert res["limits"]["memory"], where
            added = set(sc["capabilities"].get("add", []))
            if c in spec.get("initContainers", []):
                assert not added and c["name"] == "key-permissions", where
                assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
                continue
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", where
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", where
            if is_l3_container(c):
                assert l3, f"{where}: NET_ADMIN outside the L3 variant"
                assert added == {"NET_ADMIN"}, where
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert "/dev/net/tun" in mounts, where
                tun = next(v for v in spec["volumes"] if v["name"] == "dev-net-tun")
                assert tun["hostPath"] == {"path": "/dev/net/tun", "type": "CharDevice"}
            else:
                assert not added, f"{where}: L7 needs no capability"
                assert gpu or sc.get("runAsUser", 10001) != 0, where
        for v in spec.get("volumes", []):
            if "secret" in v:  # read by the init container only (fsGroup), never by the app
                assert v["secret"]["defaultMode"] == 0o440, f"{name}: secret {v['name']}"
                assert pod_sc.get("fsGroup") == pod_sc.get("runAsGroup"), name
            if "hostPath" in v and gpu:
                assert v["hostPath"]["path"] == "/var/lib/kubelet/pod-resources", name
                mount = next(
                    m for c in spec["containers"] for m in c["volumeMounts"]
                    if m["name"] == v["name"]
                )  # fmt: skip
                assert mount["readOnly"] is True, f"{name}: pod-resources mounted read-write"
            elif "hostPath" in v:
                assert l3 and v["name"] == "dev-net-tun", f"{name}: hostPath {v['name']}"
        if spec.get("initContainers"):
            check_key_copy(w)


def check_key_copy(w: dict[str, Any]) -> None:
    """The non-root init container copies the Secret's key (and the admin token, if any) to a
    memory emptyDir, mode 0600, owned by the running user (Raven refuses a key others can
    read)."""
    spec = pod_spec(w)
    init = spec["initContainers"][0]
    app = spec["containers"][0]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    app_mounts = {m["name"]: m["mountPath"] for m in app["volumeMounts"]}
    sources = [f"{init_mounts['key-secret']}/private.key"]
    if "admin-token" in init_mounts:
        sources.append(f"{init_mounts['admin-token']}/admin.token")
    assert init["command"] == ["install", "-m", "0600", "-t", init_mounts["keys"], *sources]
    keys_vol = next(v for v in spec["volumes"] if v["name"] == "keys")
    assert keys_vol["emptyDir"]["medium"] == "Memory"
    assert init_mounts["keys"] == app_mounts["keys"]
    assert not {"key-secret", "admin-token"} & set(app_mounts), "the app reads the 0600 copies"


#: Volume types Pod Security "restricted" allows.
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def pod_security_violations(spec: dict[str, Any]) -> list[str]:
    """Where ``spec`` breaks the Pod Security Standards "restricted" profile (v1.30; it
    includes "baseline"): host namespaces, privileged, capabilities, hostPath and other volume
    types, hostPort, runAsNonRoot, runAsUser 0, seccomp, privilege escalation."""
    out: list[str] = []
    pod_sc = spec.get("securityContext", {})
    out += [f"{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    for v in spec.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind not in _RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {kind}")
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        where = c["name"]
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        caps = sc.get("capabilities", {})
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: adds {caps['add']}")
        if "ALL" not in caps.get("drop", []):
            out.append(f"{where}: does not drop ALL capabilities")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{where}: hostPort")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation is not false")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile {seccomp}")
    return out


def fill_placeholders(text: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    assert "REPLACE_WITH_" not in text, "a placeholder has no test value"
    return text


def placeholder_keys() -> dict[str, str]:
    """Fresh public keys for every REPLACE_WITH_* placeholder of the manifests."""
    return {
        f"REPLACE_WITH_{name}_PUBLIC_KEY": keys.encode_key(
            keys.public_key(keys.generate_private_key())
        )
        for name in ("GATEWAY", "SITE_A", "SITE_B")
    }


def kubectl() -> str | None:
    """A kubectl with built-in kustomize, when this machine has one (used for cross-checks)."""
    path = shutil.which("kubectl")
    if path is None:
        return None
    try:
        subprocess.run([path, "kustomize", "--help"], capture_output=True, check=True, timeout=30)
    except (subprocess.SubprocessError, OSError):
        return None
    return path
