"""Secure metrics against a real kube-apiserver: the dispatcher and the training operator
started as their shipped Deployments start them (``--metrics-secure``, every interface with
``::``, the probes on a port of their own), scraped with ServiceAccount tokens the
apiserver issued (TokenRequest) and judges (TokenReview, SubjectAccessReview).

The operator runs as its shipped identity (manifests/operator/rbac.yaml and
metrics-rbac.yaml), so its ``metrics-auth`` ClusterRole is shown to be enough; the reader is
bound to the shipped ``metrics-reader`` ClusterRole of each process."""

from __future__ import annotations

import http.client
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from clusters.controlplane import free_port
from clusters.crds import manifests_dir
from clusters.pki import service_account_user
from clusters.testing import apiserver_writes, ipv6_loopback, plain_get
from controller_kit.certificates import CertificateAuthority, cert_pem, key_pem

MISSING_CONFIG = "no-such-multikueue-config"  # the dispatcher places nothing here
REVIEWS = {("authentication.k8s.io", "tokenreviews"),
           ("authorization.k8s.io", "subjectaccessreviews")}


@dataclass(frozen=True)
class Shipped:
    cluster: str
    base: str  # manifests/<base>
    run_as_shipped_identity: bool


PROCESSES = {
    "dispatcher": Shipped("manager", "dispatcher", False),
    "training_operator": Shipped("worker-1", "operator", True),
}


IPV6 = ipv6_loopback()


def _documents(base: str, file: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((manifests_dir() / base / file).read_text()) if d]


class ClusterRbac:
    """Creates cluster-scoped RBAC objects and deletes, at the end, those it created."""

    def __init__(self, api: client.ApiClient):
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.created: list[dict] = []

    def create(self, document: dict) -> None:
        create = (self.rbac.create_cluster_role if document["kind"] == "ClusterRole"
                  else self.rbac.create_cluster_role_binding)
        try:
            create(document)
            self.created.append(document)
        except ApiException as err:
            if err.status != 409:
                raise

    def delete_created(self) -> None:
        for document in reversed(self.created):
            delete = (self.rbac.delete_cluster_role if document["kind"] == "ClusterRole"
                      else self.rbac.delete_cluster_role_binding)
            delete(document["metadata"]["name"])


@pytest.fixture
def rbac(multicluster):
    made: list[ClusterRbac] = []

    def on(cluster) -> ClusterRbac:
        made.append(ClusterRbac(cluster.api))
        return made[-1]

    yield on
    for objects in made:
        objects.delete_created()


def _serving_certificate(directory: Path) -> Path:
    """tls.crt and tls.key for loopback, IPv4 and IPv6, in ``directory``; the CA's file."""
    authority = CertificateAuthority.create("metrics test CA")
    key, cert = authority.issue("metrics", dns_names=("localhost",),
                                ip_addresses=("127.0.0.1", "::1"), server=True)
    directory.mkdir()
    (directory / "tls.crt").write_bytes(cert_pem(cert))
    (directory / "tls.key").write_bytes(key_pem(key))
    ca = directory.parent / "ca.crt"
    ca.write_bytes(cert_pem(authority.cert))
    return ca


def _token(cluster, namespace: str, account: str) -> str:
    cluster.core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account)))
    return cluster.core.create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token


def _get(port: int, path: str, *, ca: Path, token: str | None = None,
         host: str = "127.0.0.1") -> tuple[int, dict[str, str], str]:
    """GET over HTTPS, verifying the served certificate against ``ca``."""
    conn = http.client.HTTPSConnection(host, port, timeout=10,
                                       context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("module", sorted(PROCESSES))
def test_only_a_bound_reader_scrapes_and_the_probes_need_no_token(
        module, multicluster, namespace, rbac, run_dispatcher, run_operator, tmp_path):
    shipped = PROCESSES[module]
    cluster = multicluster[shipped.cluster]
    objects = rbac(cluster)
    metrics_rbac = _documents(shipped.base, "metrics-rbac.yaml")
    reader_role = next(d for d in metrics_rbac if d["metadata"]["name"].endswith("-reader"))
    objects.create(reader_role)
    objects.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{namespace}-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": reader_role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    target = cluster
    if shipped.run_as_shipped_identity:
        identity = _documents(shipped.base, "rbac.yaml") + [
            d for d in metrics_rbac if d is not reader_role]
        for document in identity:
            objects.create(document)
        subject = next(d for d in identity if d["metadata"]["name"].endswith("-metrics-auth")
                       and d["kind"] == "ClusterRoleBinding")["subjects"][0]
        user, groups = service_account_user(subject["namespace"], subject["name"])
        path = multicluster.harness.issue_user_kubeconfig(
            cluster.name, user, groups, tmp_path / "identity.kubeconfig")
        target = SimpleNamespace(name=cluster.name, kubeconfig=path)
    reader, stranger = (_token(cluster, namespace, "reader"),
                        _token(cluster, namespace, "stranger"))
    ca = _serving_certificate(tmp_path / "certs")
    probe_port = free_port()
    args = ["--metrics-secure", "--metrics-host", "::", "--metrics-cert-dir",
            str(tmp_path / "certs"), "--health-probe-host", "::", "--health-probe-port",
            str(probe_port)]
    if module == "dispatcher":
        dashboard = free_port()
        process = run_dispatcher(target, *args, "--multikueue-config", MISSING_CONFIG,
                                 "--dashboard-port", str(dashboard))
    else:
        process = run_operator(target, *args, "--namespace", namespace)
    port = process.metrics_port

    # No token, a token the apiserver does not accept, a token of someone not bound.
    code, headers, body = _get(port, "/metrics", ca=ca)
    assert (code, headers.get("WWW-Authenticate")) == (401, 'Bearer realm="metrics"'), body
    assert "no bearer token" in body
    code, _, body = _get(port, "/metrics", ca=ca, token="not-a-token")
    assert code == 401 and "not valid" in body, (code, body)
    code, _, body = _get(port, "/metrics", ca=ca, token=stranger)
    assert code == 403, (code, body)
    assert f"system:serviceaccount:{namespace}:stranger may not get" in body, body
    assert stranger not in body

    # The bound reader gets Prometheus text, on IPv4 and IPv6 alike; a second scrape within
    # the cache's time asks the apiserver nothing.
    code, headers, body = _get(port, "/metrics", ca=ca, token=reader)
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version="), (
        code, headers, body[:300])
    families = {family.name for family in text_string_to_metric_families(body)}
    assert "controller_runtime_reconcile" in families and "workqueue_depth" in families, (
        sorted(families)[:40])
    reviews = apiserver_writes(cluster, REVIEWS, verbs=("POST",))
    hosts = ("127.0.0.1", "::1") if IPV6 else ("127.0.0.1",)
    for host in hosts:
        assert _get(port, "/metrics", ca=ca, token=reader, host=host)[0] == 200, host
    assert apiserver_writes(cluster, REVIEWS, verbs=("POST",)) == reviews, (
        "expected cached decisions: no TokenReview or SubjectAccessReview for a scrape "
        "repeated within the cache's time")

    # Nothing is served in plain HTTP on the metrics port.
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        plain_get(port, "/metrics")

    # The probes: plain, no token, on their own port, both address families.
    for host in hosts:
        assert plain_get(probe_port, "/healthz", host)[0] == 200, host
        assert plain_get(probe_port, "/readyz", host)[0] == 200, host
        assert plain_get(probe_port, "/metrics", host)[0] == 404, host

    if module == "dispatcher":
        # The dashboard keeps a listener of its own: on the metrics listener the reader may
        # not get / (403), and /api/state, which default RBAC lets every authenticated user
        # get (system:discovery: /api/*), is not there (404).
        assert (plain_get(dashboard, "/")[0], plain_get(dashboard, "/api/state")[0]) == (
            200, 200)
        assert _get(port, "/", ca=ca, token=reader)[0] == 403
        assert _get(port, "/api/state", ca=ca, token=reader)[0] == 404
