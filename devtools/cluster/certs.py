"""Certificates and keys for one local cluster, made fresh by every ``cluster-up`` (the
``cryptography`` package; nothing of it is committed): one CA that signs the API server's
serving certificate and every client certificate, and the ServiceAccount signing key.

Client certificates carry the identity the API server's x509 authenticator reads: the
common name is the user, each organization a group (``system:masters`` for the admin).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = dt.timedelta(days=30)
SERVICE_IP = "10.0.0.1"
"""The ``kubernetes`` Service's ClusterIP in ``--service-cluster-ip-range=10.0.0.0/24``."""
NODE_IP = "10.244.0.1"
"""The node's address in the cluster's network namespace (``devtools.cluster.network``'s
bridge): the API server and the kubelet are reached there too."""

SERVING_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local")


@dataclass(frozen=True)
class Identity:
    """A client certificate's file name and who it says it is."""

    file: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "jobfence-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("controller-manager", "system:kube-controller-manager")
SCHEDULER = Identity("scheduler", "system:kube-scheduler")
"""kube-scheduler's identity."""
KUBELET_CLIENT = Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client")
"""The API server's identity towards a kubelet (``kubectl logs``, ``exec``)."""


def node(name: str) -> Identity:
    """A kubelet's identity: the Node authorizer and NodeRestriction judge it."""
    return Identity(f"node-{name}", f"system:node:{name}", ("system:nodes",))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    path.chmod(mode)


class Authority:
    """The cluster's CA, written to ``directory`` as ca.crt/ca.key (or read from there)."""

    @classmethod
    def load(cls, directory: Path) -> Authority:
        """The CA a cluster already has (to issue one more identity: another node)."""
        ca = cls.__new__(cls)
        ca.dir = directory
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        ca.key = key
        ca.cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        return ca

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.key = _key()
        now = dt.datetime.now(dt.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jobfence-local-ca")])
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + VALID_FOR)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(
                         digital_signature=True, key_cert_sign=True, crl_sign=True,
                         content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, encipher_only=False,
                         decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        _write(directory / "ca.crt", self.cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(directory / "ca.key", _pem_key(self.key))

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def _issue(self, subject: x509.Name, *, server: bool, names: tuple[str, ...] = (),
               ips: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject)
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + VALID_FOR)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(
                       [ExtendedKeyUsageOID.SERVER_AUTH if server
                        else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if names or ips:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [*(x509.DNSName(n) for n in names),
                 *(x509.IPAddress(ipaddress.ip_address(i)) for i in ips)]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def serving(self, file: str = "apiserver") -> tuple[Path, Path]:
        """The API server's serving certificate: 127.0.0.1 (where every client reaches it,
        in-cluster configuration included) and the names of the ``kubernetes`` Service."""
        crt, key = self._issue(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            server=True, names=SERVING_NAMES, ips=("127.0.0.1", SERVICE_IP, NODE_IP))
        return self._save(file, crt, key)

    def kubelet_serving(self, node: str) -> tuple[Path, Path]:
        """A node's serving certificate (127.0.0.1 and the node's IP, where the API server
        reaches it for ``kubectl logs`` and ``exec``)."""
        crt, key = self._issue(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]),
            server=True, names=(node, "localhost"), ips=("127.0.0.1", NODE_IP))
        return self._save(f"kubelet-{node}", crt, key)

    def serving_for(self, file: str, names: tuple[str, ...]) -> tuple[Path, Path]:
        """Another local server's serving certificate (127.0.0.1 and ``names``)."""
        crt, key = self._issue(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])]),
                               server=True, names=names, ips=("127.0.0.1",))
        return self._save(file, crt, key)

    def client(self, who: Identity) -> tuple[Path, Path]:
        subject = x509.Name([
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in who.groups),
            x509.NameAttribute(NameOID.COMMON_NAME, who.user)])
        crt, key = self._issue(subject, server=False)
        return self._save(who.file, crt, key)

    def _save(self, file: str, crt: bytes, key: bytes) -> tuple[Path, Path]:
        _write(self.dir / f"{file}.crt", crt, 0o644)
        _write(self.dir / f"{file}.key", key)
        return self.dir / f"{file}.crt", self.dir / f"{file}.key"


def service_account_key(directory: Path) -> Path:
    """The key that signs ServiceAccount tokens (RSA: what every token verifier accepts);
    the API server verifies with its public half, read from the same file."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = directory / "sa.key"
    _write(path, key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.TraditionalOpenSSL,
                                   serialization.NoEncryption()))
    return path
