"""Throwaway PKI for the envtest-style control plane.

kube-apiserver needs a serving certificate, a CA to verify client certificates against and a
key pair to sign ServiceAccount tokens with; the admin user and kube-controller-manager log in
with client certificates. envtest makes the same "tiny CA" material; this is its Python
equivalent, built with `cryptography` and written as PEM files into the run's directory.

NB: ECDSA P-256 keys throughout — generating them takes microseconds where RSA-2048 takes tens
of milliseconds each, and kube-apiserver accepts ES256 for ServiceAccount token signing.
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

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM private key, both on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the control plane's flags point at."""

    ca: CertPair  # signs the serving certificate and every client certificate
    serving: CertPair  # kube-apiserver's HTTPS certificate (localhost, 127.0.0.1)
    admin: CertPair  # user "lorenz-admin" in group system:masters
    controller_manager: CertPair  # user system:kube-controller-manager, also system:masters
    kubelet_client: CertPair  # kube-apiserver's client cert towards kubelets (system:masters)
    sa_public_key: Path  # --service-account-key-file
    sa_private_key: Path  # --service-account-signing-key-file / --service-account-private-key-file


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, *, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _builder(
    *, subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    # NB: backdated a little, so a freshly minted cert is valid even if a clock is slightly off.
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _leaf(
    *,
    directory: Path,
    stem: str,
    subject: x509.Name,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    san: x509.SubjectAlternativeName | None = None,
) -> CertPair:
    key = _new_key()
    builder = (
        _builder(subject=subject, issuer=ca_cert.subject, public_key=key.public_key())
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
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(cert=directory / f"{stem}.crt", key=directory / f"{stem}.key")
    _write_cert(pair.cert, cert)
    _write_key(pair.key, key)
    return pair


def generate_pki(*, directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Pki:
    """Create a fresh CA, serving and client certificates and SA keys under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_subject = _name("lorenz-test-ca")
    ca_cert = (
        _builder(subject=ca_subject, issuer=ca_subject, public_key=ca_key.public_key())
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
        .sign(ca_key, hashes.SHA256())
    )
    ca = CertPair(cert=directory / "ca.crt", key=directory / "ca.key")
    _write_cert(ca.cert, ca_cert)
    _write_key(ca.key, ca_key)

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    serving = _leaf(
        directory=directory,
        stem="apiserver",
        subject=_name("kube-apiserver"),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=x509.SubjectAlternativeName(names),
    )
    # NB: Kubernetes reads the user name from CN and the groups from O.
    admin = _leaf(
        directory=directory,
        stem="admin",
        subject=_name("lorenz-admin", organizations=("system:masters",)),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    # NB: with --use-service-account-credentials=false every controller acts as this one user,
    # and the garbage collector must delete any kind of object (custom resources included); the
    # bootstrap system:kube-controller-manager role alone does not allow that, so: system:masters.
    controller_manager = _leaf(
        directory=directory,
        stem="controller-manager",
        subject=_name("system:kube-controller-manager", organizations=("system:masters",)),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )

    kubelet_client = _leaf(
        directory=directory,
        stem="apiserver-kubelet-client",
        subject=_name("kube-apiserver-kubelet-client", organizations=("system:masters",)),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )

    sa_key = _new_key()
    sa_private_key = directory / "sa.key"
    sa_public_key = directory / "sa.pub"
    _write_key(sa_private_key, sa_key)
    sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=ca,
        serving=serving,
        admin=admin,
        controller_manager=controller_manager,
        kubelet_client=kubelet_client,
        sa_public_key=sa_public_key,
        sa_private_key=sa_private_key,
    )


def issue_client_cert(
    *, ca: CertPair, directory: Path, stem: str, user: str, groups: tuple[str, ...] = ()
) -> CertPair:
    """A client certificate for `user` in `groups`, signed by the control plane's CA (a
    kubelet's `system:node:<name>` in `system:nodes`, the scheduler's user, ...)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key}: expected an EC private key")
    return _leaf(
        directory=directory,
        stem=stem,
        subject=_name(user, organizations=groups),
        ca_cert=ca_cert,
        ca_key=ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
