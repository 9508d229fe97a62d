"""A throwaway PKI for tests: a CA, server certificates for 127.0.0.1, client certificates (cryptography)."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_pair(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    """`path`.crt and `path`.key (PEM); returns (cert, key)."""
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".crt")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_cert(subject: str, key, issuer_key, issuer_name: x509.Name | None, ca: bool, server: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    return b.sign(issuer_key, hashes.SHA256())


def server_pki(directory: Path, name: str = "server") -> dict[str, Path | str]:
    """A CA and a server certificate it signed for 127.0.0.1: paths, and the server cert's SHA-256 pin."""
    ca_key = new_key()
    ca = make_cert(f"{name} test CA", ca_key, ca_key, None, ca=True, server=False)
    ca_crt, _ = write_pair(directory / f"{name}-ca", ca_key, ca)
    key = new_key()
    cert = make_cert("127.0.0.1", key, ca_key, ca.subject, ca=False, server=True)
    crt, key_path = write_pair(directory / name, key, cert)
    pin = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return {"ca": ca_crt, "cert": crt, "key": key_path, "pin": pin}
