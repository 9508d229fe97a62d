"""A simulated service's HTTPS certificate as Redfish shows and rotates it: Certificate, GenerateCSR, ReplaceCertificate.

A real BMC lets an operator read its HTTPS certificate (`CertificateString`,
`Fingerprint`: what a client pins) and rotate it: `CertificateService.GenerateCSR`
makes a new key on the BMC and returns a signing request; the operator's CA
signs it; `ReplaceCertificate` installs the result. The simulator does the
same for real: the new certificate is what every new TLS handshake presents
(the server's SSL context is reloaded in place; open connections keep the old
one), so a client's pin or CA file meets a rotation as it would in the field.
A certificate whose key is neither the pending CSR's nor the current one is
refused.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from sim.redfish.pki import ServerCert

CURVES = {"TPM_ECC_NIST_P256": ec.SECP256R1, "TPM_ECC_NIST_P384": ec.SECP384R1}
RSA_BITS = (2048, 3072, 4096)
SUBJECT_FIELDS = {"CommonName": NameOID.COMMON_NAME, "Organization": NameOID.ORGANIZATION_NAME,
                  "OrganizationalUnit": NameOID.ORGANIZATIONAL_UNIT_NAME, "City": NameOID.LOCALITY_NAME,
                  "State": NameOID.STATE_OR_PROVINCE_NAME, "Country": NameOID.COUNTRY_NAME,
                  "Email": NameOID.EMAIL_ADDRESS}


class CertificateRefused(ValueError):
    """A GenerateCSR or ReplaceCertificate request the service refuses: (Base message key, message)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _name(name: x509.Name) -> dict[str, str]:
    out = {}
    for field, oid in SUBJECT_FIELDS.items():
        attrs = name.get_attributes_for_oid(oid)
        if attrs:
            out[field] = str(attrs[0].value)
    return out


def _write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


class HttpsCertificate:
    """The certificate one service serves; `context` is the SSL context its listener uses (reloaded on replace)."""

    def __init__(self, cert: ServerCert, collection_uri: str):
        self.cert_file, self.key_file = cert.cert_file, cert.key_file
        self.collection_uri = collection_uri
        self.uri = f"{collection_uri}/1"
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        self._pending: Any = None  # the private key of the last GenerateCSR, until a certificate for it is installed
        self.replaced = 0

    def _chain(self) -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates(self.cert_file.read_bytes())

    def resource(self) -> dict[str, Any]:
        leaf = self._chain()[0]
        return {"@odata.type": "#Certificate.v1_9_0.Certificate", "Id": "1", "Name": "HTTPS certificate",
                "CertificateString": self.cert_file.read_text(), "CertificateType": "PEM",
                "CertificateUsageTypes": ["Web"], "Issuer": _name(leaf.issuer), "Subject": _name(leaf.subject),
                "ValidNotBefore": _iso(leaf.not_valid_before_utc), "ValidNotAfter": _iso(leaf.not_valid_after_utc),
                "SerialNumber": leaf.serial_number.to_bytes((leaf.serial_number.bit_length() + 7) // 8 or 1,
                                                             "big").hex(":").upper(),
                "Fingerprint": leaf.fingerprint(hashes.SHA256()).hex(":").upper(),
                "FingerprintHashAlgorithm": "TPM_ALG_SHA256", "@odata.id": self.uri}

    def generate_csr(self, body: dict[str, Any]) -> dict[str, Any]:
        """CertificateService.GenerateCSR: a new key on the service, and the CSR for it (PEM)."""
        target = (body.get("CertificateCollection") or {}).get("@odata.id") if isinstance(
            body.get("CertificateCollection"), dict) else None
        if target != self.collection_uri:
            raise CertificateRefused("ActionParameterValueNotInList", "CertificateCollection: this service only holds "
                                     f"the certificates of {self.collection_uri}")
        if not isinstance(body.get("CommonName"), str) or not body["CommonName"]:
            raise CertificateRefused("ActionParameterMissing", "The action GenerateCSR requires the parameter "
                                     "CommonName to be present in the request body.")
        algorithm = body.get("KeyPairAlgorithm", "TPM_ALG_ECDSA")
        if algorithm in ("TPM_ALG_ECDSA", "TPM_ALG_ECC"):
            curve = CURVES.get(body.get("KeyCurveId", "TPM_ECC_NIST_P256"))
            if curve is None:
                raise CertificateRefused("ActionParameterValueNotInList", f"KeyCurveId: one of {', '.join(CURVES)}")
            key: Any = ec.generate_private_key(curve())
        elif algorithm == "TPM_ALG_RSA":
            bits = body.get("KeyBitLength", 2048)
            if bits not in RSA_BITS:
                raise CertificateRefused("ActionParameterValueNotInList", f"KeyBitLength: one of {RSA_BITS}")
            key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        else:
            raise CertificateRefused("ActionParameterValueNotInList", "KeyPairAlgorithm: TPM_ALG_ECDSA or TPM_ALG_RSA")
        subject = [x509.NameAttribute(oid, str(body[f])) for f, oid in SUBJECT_FIELDS.items()
                   if isinstance(body.get(f), str) and body[f]]
        builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(subject))
        sans: list[x509.GeneralName] = []
        for alt in body.get("AlternativeNames") or []:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(alt)))
            except ValueError:
                sans.append(x509.DNSName(str(alt)))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        csr = builder.sign(key, hashes.SHA256())
        self._pending = key
        return {"CSRString": csr.public_bytes(serialization.Encoding.PEM).decode(),
                "CertificateCollection": {"@odata.id": self.collection_uri}}

    def replace(self, body: dict[str, Any]) -> None:
        """CertificateService.ReplaceCertificate: install a certificate for the pending (or current) key."""
        uri = body.get("CertificateUri", {}).get("@odata.id") if isinstance(body.get("CertificateUri"), dict) else None
        if uri != self.uri:
            raise CertificateRefused("ActionParameterValueNotInList", f"CertificateUri: this service holds {self.uri}")
        if body.get("CertificateType") not in ("PEM", "PEMchain"):
            raise CertificateRefused("ActionParameterValueNotInList", "CertificateType: PEM or PEMchain")
        try:
            chain = x509.load_pem_x509_certificates(str(body.get("CertificateString", "")).encode())
        except ValueError:
            raise CertificateRefused("ActionParameterValueFormatError", "CertificateString: not a PEM certificate") from None
        current = serialization.load_pem_private_key(self.key_file.read_bytes(), password=None)
        leaf_key = chain[0].public_key().public_bytes(serialization.Encoding.DER,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)
        for key in (self._pending, current):
            if key is not None and key.public_key().public_bytes(
                    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == leaf_key:
                break
        else:
            raise CertificateRefused("ActionParameterValueError", "CertificateString: the certificate is not for the "
                                     "key of the last GenerateCSR (nor the current key)")
        _write_atomically(self.key_file, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()), 0o600)
        _write_atomically(self.cert_file, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain))
        self.context.load_cert_chain(str(self.cert_file), str(self.key_file))  # new handshakes present it
        self._pending = None
        self.replaced += 1
