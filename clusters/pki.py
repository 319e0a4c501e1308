"""Throwaway PKI for one local cluster: a CA, the apiserver's serving certificate, an admin
client certificate (organisation ``system:masters``) and the service-account signing key;
plus client certificates for any other user, e.g. a ServiceAccount, so RBAC bindings can be
exercised exactly as shipped. The aggregation layer has a CA of its own (the front proxy's,
as kubeadm makes it): the client certificate the apiserver presents to an aggregated API
server, which trusts the user headers of requests signed by that CA only.

ECDSA P-256 keys: the apiserver accepts them everywhere and they are generated in
milliseconds, which matters for bringing several clusters up quickly.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from controller_kit import certificates
from controller_kit.certificates import cert_pem, key_pem, new_key

__all__ = ["FRONT_PROXY_CLIENT", "CertificateAuthority", "ClusterPKI", "cert_pem",
           "client_kubeconfig", "key_pem", "service_account_user"]

# The common name of the apiserver's front-proxy client certificate: the one name
# --requestheader-allowed-names lets assert a user (kubeadm's).
FRONT_PROXY_CLIENT = "front-proxy-client"


def service_account_user(namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    """The user name and groups the apiserver gives ServiceAccount ``namespace/name``.

    The x509 authenticator takes the user from the certificate's CN and the groups from its
    organisations, and RBAC matches a ServiceAccount subject by exactly this user name, so a
    client certificate with these values is that ServiceAccount to every RoleBinding."""
    return (f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
             "system:authenticated"))


def client_kubeconfig(cluster: str, server: str, ca: bytes, user: str, cert: bytes,
                      key: bytes) -> dict[str, Any]:
    """A kubeconfig with every certificate embedded (no file references), so it can be
    stored in a Secret as it is."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }


class CertificateAuthority(certificates.CertificateAuthority):
    """The shared CA, able to write a kubeconfig for any user it certifies."""

    def user_kubeconfig(self, cluster: str, server: str, user: str,
                        groups: tuple[str, ...] = ()) -> dict[str, Any]:
        """A kubeconfig for ``server`` that authenticates as ``user`` in ``groups``."""
        key, cert = self.issue(user, organizations=groups, client=True)
        return client_kubeconfig(cluster, server, cert_pem(self.cert), user, cert_pem(cert),
                                 key_pem(key))


@dataclass(frozen=True)
class ClusterPKI:
    """File locations of one cluster's PKI material."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    @property
    def front_proxy_ca_key(self) -> Path:
        return self.directory / "front-proxy-ca.key"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.directory / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.directory / "front-proxy-client.key"

    def front_proxy_authority(self) -> CertificateAuthority:
        """The front proxy's CA: what an aggregated API server trusts user headers from."""
        return CertificateAuthority.load(self.front_proxy_ca_cert, self.front_proxy_ca_key)

    def ensure_front_proxy(self) -> None:
        """The front proxy's CA and the apiserver's client certificate under it
        (``FRONT_PROXY_CLIENT``), made once; PKI made before they existed gets them on its
        next start."""
        if self.front_proxy_ca_cert.is_file() and self.front_proxy_client_cert.is_file():
            return
        ca = CertificateAuthority.create("front-proxy-ca")
        key, cert = ca.issue(FRONT_PROXY_CLIENT, client=True)
        for path, data in ((self.front_proxy_ca_key, key_pem(ca.key)),
                           (self.front_proxy_client_key, key_pem(key)),
                           (self.front_proxy_ca_cert, cert_pem(ca.cert)),
                           (self.front_proxy_client_cert, cert_pem(cert))):
            path.write_bytes(data)
            if path.suffix == ".key":
                path.chmod(0o600)

    @property
    def service_account_key(self) -> Path:
        return self.directory / "service-account.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "service-account.pub"

    def certificate_authority(self) -> CertificateAuthority:
        return CertificateAuthority.load(self.ca_cert, self.ca_key)

    def exists(self) -> bool:
        return all(
            p.is_file()
            for p in (self.ca_cert, self.admin_cert, self.serving_cert, self.service_account_key)
        )

    def generate(self, cluster_name: str, bind_address: str,
                 extra_dns_names: tuple[str, ...] = ()) -> None:
        """Write a fresh CA and every certificate and key the cluster needs
        (``extra_dns_names``: more names the apiserver answers to, e.g. a container's)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create(f"{cluster_name}-ca")
        serving_key, serving = ca.issue(
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default",
                       "kubernetes.default.svc", *extra_dns_names),
            ip_addresses=tuple(dict.fromkeys((bind_address, "127.0.0.1", "10.0.0.1"))),
            server=True,
        )
        admin_key, admin = ca.issue("admin", organizations=("system:masters",), client=True)
        sa_key = new_key()
        files = {
            self.ca_cert: cert_pem(ca.cert),
            self.ca_key: key_pem(ca.key),
            self.serving_cert: cert_pem(serving),
            self.serving_key: key_pem(serving_key),
            self.admin_cert: cert_pem(admin),
            self.admin_key: key_pem(admin_key),
            self.service_account_key: key_pem(sa_key),
            self.service_account_pub: sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        }
        for path, data in files.items():
            path.write_bytes(data)
            if path.suffix == ".key":
                path.chmod(0o600)
        self.ensure_front_proxy()
