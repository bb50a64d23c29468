"""raven.kube.client's credentials: kubeconfig and in-cluster parsing, refused setups, the
token file re-read per request, TLS material loaded into the SSL context."""

from __future__ import annotations

import base64
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raven.kube.client import (
    ApiConfig,
    KubeConfigError,
    in_cluster_config,
    kubeconfig_config,
    load_config,
)
from tests.helpers.kube import write_kubeconfig


def self_signed(name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_kubeconfig_with_ca_data_client_certificate_and_token(tmp_path: Path) -> None:
    ca, _ = self_signed("cluster-ca")
    cert, key = self_signed("user")
    path = write_kubeconfig(
        tmp_path,
        {
            "server": "https://10.0.0.1:6443/",
            "certificate-authority-data": base64.b64encode(ca).decode(),
        },
        {
            "token": "t0ken",
            "client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key).decode(),
        },
    )
    cfg = kubeconfig_config(path)
    assert cfg.server == "https://10.0.0.1:6443"
    assert cfg.bearer() == "t0ken"
    ctx = cfg.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "cluster-ca"),),)]


def test_kubeconfig_files_relative_to_it_and_token_file_reread(tmp_path: Path) -> None:
    ca, _ = self_signed("cluster-ca")
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "token").write_text("first\n")
    path = write_kubeconfig(
        tmp_path,
        {"server": "https://api.example:6443", "certificate-authority": "ca.crt"},
        {"tokenFile": "token"},
    )
    cfg = kubeconfig_config(path)
    assert cfg.ca_data == ca
    assert cfg.bearer() == "first"
    (tmp_path / "token").write_text("rotated\n")  # a projected token the kubelet refreshed
    assert cfg.bearer() == "rotated"


def test_plain_http_and_insecure(tmp_path: Path) -> None:
    assert ApiConfig("http://127.0.0.1:8080").ssl_context() is False
    path = write_kubeconfig(
        tmp_path, {"server": "https://h:6443", "insecure-skip-tls-verify": True}, {}
    )
    ctx = kubeconfig_config(path).ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("cluster", "user", "context", "message"),
    [
        ({"server": "https://h"}, {"exec": {"command": "aws"}}, None, "exec and auth-provider"),
        ({"server": "https://h"}, {"auth-provider": {"name": "gcp"}}, None, "not supported"),
        ({"server": "ftp://h"}, {}, None, "not an http"),
        ({"server": "https://h"}, {}, "nope", "no context named 'nope'"),
        ({"server": "https://h"}, {}, "other", "no cluster named 'missing'"),
        ({"server": "https://h", "certificate-authority": "absent.crt"}, {}, None, "absent.crt"),
    ],
)
def test_kubeconfig_refusals_name_the_file_and_the_reason(
    tmp_path: Path,
    cluster: dict[str, object],
    user: dict[str, object],
    context: str | None,
    message: str,
) -> None:
    path = write_kubeconfig(tmp_path, cluster, user)
    with pytest.raises(KubeConfigError, match=f"cannot load credentials from {path}: .*{message}"):
        kubeconfig_config(path, context)


def test_garbage_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    for text in ("[1, 2", "- a list", ""):
        path = tmp_path / "config"
        path.write_text(text)
        with pytest.raises(KubeConfigError, match="cannot load credentials"):
            load_config(str(path))


def test_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST is not set"):
        in_cluster_config(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="token is missing"):
        in_cluster_config(tmp_path)
    (tmp_path / "token").write_text("sa-token")
    ca, _ = self_signed("kube-ca")
    (tmp_path / "ca.crt").write_bytes(ca)
    cfg = in_cluster_config(tmp_path)
    assert cfg.server == "https://[fd00::1]:443"
    assert cfg.bearer() == "sa-token"
    assert isinstance(cfg.ssl_context(), ssl.SSLContext)
