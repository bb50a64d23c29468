"""Tests of the deployment tests' own helpers (tests/helpers/deploy.py): the strategic merge,
the validator and the Pod Security checker each catch what they must."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.helpers.deploy import (
    pod_security_violations,
    strategic_merge,
    validate_object,
)


def test_strategic_merge_merges_named_lists_and_replaces_others() -> None:
    base = {
        "spec": {
            "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "nodeSelector": {"k": "v"},
        }
    }
    patch = {
        "spec": {
            "containers": [{"name": "a", "args": ["3"]}, {"name": "c", "image": "y"}],
            "volumes": [{"name": "w", "hostPath": {"path": "/p"}}],
            "nodeSelector": {"site": "s"},
        }
    }
    out = strategic_merge(base, patch)
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["a", "b", "c"]
    assert out["spec"]["containers"][0] == {"name": "a", "image": "x", "args": ["3"]}
    assert [v["name"] for v in out["spec"]["volumes"]] == ["v", "w"]
    assert out["spec"]["nodeSelector"] == {"k": "v", "site": "s"}
    assert base["spec"]["containers"][0]["args"] == ["1", "2"]  # the input is not modified
    with pytest.raises(NotImplementedError):
        strategic_merge(base, {"spec": {"$patch": "delete"}})


def test_validator_rejects_invalid_objects() -> None:
    good = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "n"},
        "spec": {"ports": [{"port": 80}]},
    }
    validate_object(good)
    bad = copy.deepcopy(good)
    bad["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(bad)
    typo = copy.deepcopy(good)
    typo["spec"]["prots"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(typo)
    long_port_name = copy.deepcopy(good)
    long_port_name["spec"]["ports"][0]["name"] = "kubelet-readonly"  # 16 > 15 characters
    with pytest.raises(AssertionError, match="port name"):
        validate_object(long_port_name)
    sm = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"port": "admin"}]},
    }
    validate_object(sm)
    for broken in ({"port": 10265}, {"port": "admin", "intervl": "30s"}):
        bad_sm = copy.deepcopy(sm)
        bad_sm["spec"]["endpoints"] = [broken]
        with pytest.raises(jsonschema.ValidationError):
            validate_object(bad_sm)
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "r", "namespace": "n"},
        "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]},
    }
    validate_object(rule)
    rule["spec"]["groups"][0]["rules"][0]["fro"] = "5m"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(rule)


def test_pod_security_checker_finds_each_violation() -> None:
    ok_container = {
        "name": "c",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    ok = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [ok_container],
        "volumes": [{"name": "s", "secret": {"secretName": "x"}}],
    }
    assert pod_security_violations(ok) == []
    breaks: list[tuple[str, Any]] = [
        ("hostNetwork", lambda p: p.update(hostNetwork=True)),
        ("hostPath", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
        ("adds", lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
            add=["NET_ADMIN"])),
        ("runAsUser 0", lambda p: p["containers"][0]["securityContext"].update(runAsUser=0)),
        ("allowPrivilegeEscalation", lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation")),
        ("seccompProfile", lambda p: p["securityContext"].pop("seccompProfile")),
        ("runAsNonRoot", lambda p: p["securityContext"].pop("runAsNonRoot")),
        ("hostPort", lambda p: p["containers"][0].update(ports=[{"containerPort": 1,
                                                                  "hostPort": 1}])),
    ]  # fmt: skip
    for what, make in breaks:
        pod = copy.deepcopy(ok)
        make(pod)
        found = pod_security_violations(pod)
        assert len(found) == 1 and what in found[0], (what, found)
