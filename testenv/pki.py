"""Certificates and keys for the local control plane: a throwaway CA, the API server's
serving certificate, an admin client certificate (O=system:masters) and the
ServiceAccount signing key pair. Everything is written once into the control plane's
folder and lives only as long as it does."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    is_ca: bool = False,
    usage: ExtendedKeyUsageOID | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def create_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpuops-testenv-ca")
    ca = _issue(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, is_ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _issue(
        subject=_name("kube-apiserver"),
        key=serving_key,
        issuer=ca_name,
        issuer_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _issue(
        subject=_name("gpuops-testenv-admin", "system:masters"),
        key=admin_key,
        issuer=ca_name,
        issuer_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = Pki(
        ca_cert=folder / "ca.crt",
        serving_cert=folder / "apiserver.crt",
        serving_key=folder / "apiserver.key",
        admin_cert=folder / "admin.crt",
        admin_key=folder / "admin.key",
        sa_public_key=folder / "sa.pub",
        sa_private_key=folder / "sa.key",
    )
    pki.ca_cert.write_bytes(_pem_cert(ca))
    pki.serving_cert.write_bytes(_pem_cert(serving))
    pki.serving_key.write_bytes(_pem_key(serving_key))
    pki.admin_cert.write_bytes(_pem_cert(admin))
    pki.admin_key.write_bytes(_pem_key(admin_key))
    pki.sa_private_key.write_bytes(_pem_key(sa_key))
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key_file in (pki.serving_key, pki.admin_key, pki.sa_private_key):
        key_file.chmod(0o600)
    return pki
