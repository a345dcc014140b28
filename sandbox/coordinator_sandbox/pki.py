"""A throw-away certificate authority for the sandbox clusters.

One CA signs every certificate of a sandbox: the kube-apiservers' serving certificate
and the client certificates of its users. etcd has a CA of its own, whose only client is
the kube-apiserver: a user's certificate of the cluster's CA must not open etcd, which
would bypass RBAC. Sharing the CA across clusters is deliberate:
a context re-pointed at another sandbox cluster still authenticates, which is exactly
what identity-mismatch tests need.

Every certificate starts being valid two days in the past, so that processes run under
``faketime`` with a clock minutes (or hours) off still accept them.

The certificates are made with ``cryptography``, which only the sandbox needs: a
dependency of the coordinator-sandbox distribution, not of coordinator. Where it cannot be
imported, importing the sandbox fails with a :class:`~coordinator.errors.UsageError`
that says so. (trustme, made
for test CAs, does not fit: a leaf gets one organization, where a client certificate needs
one per RBAC group, and every leaf is a client and server certificate at once.)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.errors import UsageError

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as err:
    raise UsageError(
        "The sandbox makes its certificates with the Python package 'cryptography', which cannot be "
        f"imported here ({err}). It comes with the coordinator-sandbox distribution: install that "
        "again (in a checkout of coordinator: `pip install ./sandbox`). "
        "Everything but `coordinator sandbox` works without it."
    ) from err

BACKDATE = dt.timedelta(days=2)
CA_LIFETIME = dt.timedelta(days=3650)
LEAF_LIFETIME = dt.timedelta(days=825)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        write_private(key_path, self.key_pem)
        write_private(cert_path, self.cert_pem, mode=0o644)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: quick to generate, and accepted by Go's TLS stack and Python's ssl alike.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def new_ca(common_name: str = "coordinator-sandbox-ca") -> KeyPair:
    """A self-signed CA allowed to sign leaf certificates only."""
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    subject = _name(common_name)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    server: bool = False,
    client_too: bool = False,
) -> KeyPair:
    """A leaf certificate signed by ``ca``.

    For a client certificate, Kubernetes reads the user name from the common name and
    the groups from the organizations. ``server=True`` makes a serving certificate for
    the given DNS names and IP addresses; with ``client_too`` it may also authenticate
    as a client (etcd's peer listener checks the certificate of a peer that dials in).
    """
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the sandbox CA key is not an EC key")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client_too or not server:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + LEAF_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def new_signing_key() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of a key for signing service-account tokens."""
    key = _new_key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _key_pem(key), public


def write_private(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` with ``mode`` from the first byte (no window of 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
