"""Throwaway certificates for tests and benchmarks (a test CA, certificates it signs,
self-signed ones), written as PEM files. Made with ``cryptography``; nothing leaves the run."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TestCa:
    """A CA: its key, its certificate, and the PEM file of the certificate (a CA bundle)."""

    __test__ = False  # not a pytest test class

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    pem: Path

    def issue(self, dns: str, directory: Path) -> tuple[Path, Path]:
        """A certificate for ``dns`` signed by this CA: (certificate PEM, key PEM)."""
        return _write(directory, dns, self.key, self.cert.subject, ca=False)


def _write(
    directory: Path, dns: str, issuer_key: ec.EllipticCurvePrivateKey | None,
    issuer: x509.Name | None, *, ca: bool,
) -> tuple[Path, Path]:  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
    )  # fmt: skip
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    cert_path, key_path = directory / f"{dns}.pem", directory / f"{dns}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


def self_signed(directory: Path, dns: str) -> tuple[Path, Path]:
    """A certificate for ``dns`` that is its own CA (its PEM is the client's CA file)."""
    return _write(directory, dns, None, None, ca=True)


def make_ca(directory: Path, name: str) -> TestCa:
    cert_path, key_path = self_signed(directory, name)
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return TestCa(key, x509.load_pem_x509_certificate(cert_path.read_bytes()), cert_path)
