"""Throwaway certificate authorities and certificates for TLS tests, made with `cryptography`.

    pki = make_pki(tmp_path)   # .ca, .other_ca, .server_cert, .server_key, .client_cert, .client_key
    # the server certificate names 127.0.0.1 and localhost; everything expires in two days

Keys are EC P-256 (fast to make), written as unencrypted PEM with mode 600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    """the CA that signed the server and client certificates"""
    other_ca: Path
    """a CA that signed nothing here (the wrong CA)"""
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
                 *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (CN "federation-wrapper")
    signed by it, and an unrelated CA; PEM files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = Pki(*(directory / name for name in ("ca.crt", "other-ca.crt", "server.crt", "server.key", "client.crt",
                                                 "client.key")))
    ca_key, other_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    certificates = {
        paths.ca: _certificate("test CA", ca_key, "test CA", ca_key, ca=True),
        paths.other_ca: _certificate("other CA", other_key, "other CA", other_key, ca=True),
        paths.server_cert: _certificate("localhost", server_key, "test CA", ca_key, server=True),
        paths.client_cert: _certificate("federation-wrapper", client_key, "test CA", ca_key),
    }
    for path, certificate in certificates.items():
        path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, paths.server_key)
    _write_key(client_key, paths.client_key)
    return paths
