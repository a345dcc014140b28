"""Throwaway certificates for tests of TLS: a CA, and keys and certificates it signs."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def signed(
    name: str, issuer: tuple[Any, x509.Certificate] | None = None, *, ip: str | None = None
) -> tuple[bytes, bytes, Any, x509.Certificate]:
    """A fresh key and certificate for ``name``: the certificate and the key as PEM, the key
    and the certificate as objects. Self-signed as a CA when ``issuer`` (its key and
    certificate) is None; ``ip``: an IP address the certificate is valid for."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    signer_key, signer = issuer if issuer else (key, None)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer.subject if signer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False)
    cert = builder.sign(signer_key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, key, cert
