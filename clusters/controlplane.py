"""One local Kubernetes cluster: etcd, kube-apiserver and kube-controller-manager as
processes on loopback, with their PKI, kubeconfig, logs and data under one directory; a
worker also runs kube-scheduler, the JobSet controller and kwok (``clusters.worker_stack``).

kube-controller-manager runs a deliberate subset of controllers. Every cluster has the
garbage collector (ownerReference cascading deletion) and the namespace controller; a manager
the ClusterRole aggregation controller (view, edit and admin take in the remote view's
rules). A worker adds what running pods needs: the job controller, node lifecycle (kwok
renews each Node's Lease, so its Nodes stay Ready and lose the apiserver's not-ready taint;
a Node whose kwok stops turns NotReady as a real one would), taint eviction, pod garbage
collection (pods of a deleted Node go away) and PVC protection (it takes
``kubernetes.io/pvc-protection`` off a claim no pod uses; without it the claims JobSet makes
from ``volumeClaimPolicies`` hold their namespace in Terminating for ever).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from clusters import kueue, nodes, processes, worker_stack
from clusters.binaries import ControlPlaneBinaries
from clusters.machine_load import Deadline
from clusters.pki import FRONT_PROXY_CLIENT, ClusterPKI

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
_EVERY_CLUSTER_CONTROLLERS = "garbage-collector-controller,namespace-controller"
KCM_CONTROLLERS = {
    # The view, edit and admin ClusterRoles take in the rules of ClusterRoles labelled to
    # aggregate to them (the remote view's, manifests/remote-api), as on any cluster.
    "manager": _EVERY_CLUSTER_CONTROLLERS + ",clusterrole-aggregation-controller",
    "worker": _EVERY_CLUSTER_CONTROLLERS + ",job-controller,node-lifecycle-controller,"
                                           "taint-eviction-controller,"
                                           "pod-garbage-collector-controller,"
                                           "persistentvolumeclaim-protection-controller",
}
# Ports a worker's extra components listen on (kept in the harness state per cluster).
WORKER_PORTS = ("kube-scheduler", "jobset-webhook", "jobset-health", "kwok")


def components(role: str, with_kueue: bool = False) -> tuple[str, ...]:
    """Every process of a cluster of ``role`` (``with_kueue``: Kueue too), in start
    order."""
    extra = (kueue.COMPONENT,) if with_kueue else ()
    if role == "worker":
        return (*CONTROL_PLANE, *worker_stack.WORKER_COMPONENTS, *extra)
    return (*CONTROL_PLANE, *extra)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready; the message carries its log tail."""


# Ports handed out by this process, so two calls never give the same one before either
# component has bound it.
_handed_out: set[int] = set()
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_LISTEN_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in _EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def listen_port_candidates() -> list[int]:
    """Ports outside the kernel's ephemeral range. A port picked inside that range can be
    taken by any outgoing connection (an apiserver's to etcd, a client's) between the pick
    and the component's bind; one outside it cannot."""
    low, high = _ephemeral_range()
    return [*range(_LOWEST_LISTEN_PORT, low), *range(high + 1, 65536)]


def free_port(address: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range, not handed out before
    by this process."""
    candidates = listen_port_candidates()
    for port in random.sample(candidates, min(2000, len(candidates))):
        if port not in _handed_out and port_is_free(port, address):
            _handed_out.add(port)
            return port
    # No room outside the ephemeral range (an unusual kernel setting): let the kernel pick.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
        return True


@dataclass
class ControlPlane:
    """Paths, command lines and probes for one cluster. Holds no process state itself:
    PIDs live in the harness state file so any later command can find them."""

    name: str
    directory: Path
    kubeconfig_path: Path
    bind_address: str
    apiserver_port: int
    etcd_client_port: int
    etcd_peer_port: int
    controller_manager_port: int
    role: str = "worker"
    ports: dict[str, int] | None = None
    # Kueue's MultiKueue dispatcherName when the cluster runs Kueue; None: no Kueue.
    kueue_dispatcher: str | None = None
    # The job kinds its Kueue manages (Kueue's integration names, ``kueue.INTEGRATIONS``).
    kueue_integrations: tuple[str, ...] = kueue.INTEGRATIONS

    def port(self, name: str) -> int:
        return (self.ports or {})[name]

    @property
    def pki(self) -> ClusterPKI:
        return ClusterPKI(self.directory / "pki")

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://{self.bind_address}:{self.etcd_client_port}"

    def log_file(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    # --- preparation --------------------------------------------------------------

    def prepare(self) -> None:
        """Create PKI (once; a restart reuses it) and write the kubeconfig."""
        if not self.pki.exists():
            self.pki.generate(self.name, self.bind_address)
        self.pki.ensure_front_proxy()
        self.write_kubeconfig()

    def write_kubeconfig(self) -> None:
        """Admin kubeconfig with certificate data embedded, so it can go into a Secret as is."""
        import base64

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": self.server,
                "certificate-authority-data": b64(self.pki.ca_cert),
            }}],
            "users": [{"name": f"{self.name}-admin", "user": {
                "client-certificate-data": b64(self.pki.admin_cert),
                "client-key-data": b64(self.pki.admin_key),
            }}],
            "contexts": [{"name": self.name, "context": {
                "cluster": self.name, "user": f"{self.name}-admin",
            }}],
            "current-context": self.name,
            "preferences": {},
        }
        self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.kubeconfig_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(self.kubeconfig_path)

    # --- command lines --------------------------------------------------------------

    def argv(self, component: str, binaries: ControlPlaneBinaries) -> list[str]:
        if component == "etcd":
            peer = f"http://{self.bind_address}:{self.etcd_peer_port}"
            return [
                str(binaries.etcd),
                f"--name={self.name}",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.name}={peer}",
                "--unsafe-no-fsync",  # test data: durability across power loss is not wanted
                "--log-level=warn",
            ]
        if component == "kube-apiserver":
            pki = self.pki
            return [
                str(binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.directory / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki.service_account_pub}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                "--disable-admission-plugins=ServiceAccount",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                # Nothing here can route to a Service IP; do not maintain the kubernetes
                # Service endpoints with a loopback address.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *self._aggregation_flags(),
                *self._audit_flags(),
            ]
        if component == "kube-controller-manager":
            return [
                str(binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--controllers={KCM_CONTROLLERS[self.role]}",
                "--leader-elect=false",
                f"--bind-address={self.bind_address}",
                f"--secure-port={self.controller_manager_port}",
                # Same serving certificate as the apiserver (SANs cover the bind address), so
                # the readiness probe can verify it against the cluster CA.
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
                # No front proxy here: do not look up its client CA in kube-system.
                "--authentication-skip-lookup=true",
                "--use-service-account-credentials=false",
                # The default 20 QPS makes each namespace deletion (a list and a
                # deletecollection per resource type) take seconds, and test namespaces queue.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ]
        if component == "kube-scheduler":
            return [
                str(binaries.kube_scheduler),
                "--config="
                f"{worker_stack.write_scheduler_config(self.directory, self.kubeconfig_path)}",
                f"--bind-address={self.bind_address}",
                f"--secure-port={self.port('kube-scheduler')}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
                "--authentication-skip-lookup=true",
                "--v=1",
            ]
        if component == "jobset-controller":
            config = worker_stack.write_jobset_config(
                self.directory / "jobset", self.pki.serving_cert, self.pki.serving_key,
                self.port("jobset-webhook"), self.port("jobset-health"), self.bind_address)
            return [str(binaries.jobset_controller), f"--kubeconfig={self.kubeconfig_path}",
                    f"--config={config}", "--zap-log-level=info"]
        if component == "kwok":
            return [
                str(binaries.kwok),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--config={self._write_kwok_config()}",
                f"--manage-nodes-with-annotation-selector={nodes.KWOK_SELECTOR}",
                f"--server-address={self.bind_address}:{self.port('kwok')}",
                # HTTPS, as a kubelet serves: the apiserver reaches a Node's kubelet port
                # (pods/log) over TLS only.
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                "--node-lease-duration-seconds=40",
            ]
        if component == kueue.COMPONENT:
            config = kueue.write_config(self.kueue_dir, self.kueue_configuration())
            return [str(binaries.kueue), f"--kubeconfig={self.kubeconfig_path}",
                    f"--config={config}", "--zap-log-level=2"]
        raise ValueError(f"unknown component {component!r}")

    @property
    def kwok_logs_file(self) -> Path:
        """What kwok serves as every container's log, in the CRI log format (``<RFC 3339
        time> stdout F <line>``), followed as it grows. The apiserver asks kwok for it only
        for a Node whose address and kubelet port are kwok's (a test's own Node: the
        harness's Nodes have no address, so their pods' logs are refused before any
        connection is made)."""
        return self.directory / "kwok" / "container.log"

    def _write_kwok_config(self) -> Path:
        """The worker stack's kwok configuration, with kwok's kubelet debugging handlers on
        (containerLogs) and every container's log served from ``kwok_logs_file``."""
        documents = list(yaml.safe_load_all(
            worker_stack.write_kwok_config(self.directory).read_text()))
        for document in documents:
            if document.get("kind") == "KwokConfiguration":
                document.setdefault("options", {})["enableDebuggingHandlers"] = True
        self.kwok_logs_file.parent.mkdir(parents=True, exist_ok=True)
        self.kwok_logs_file.touch()
        documents.append({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs",
            "metadata": {"name": "every-container"},
            "spec": {"logs": [{"logsFile": str(self.kwok_logs_file),
                               "previousLogsFile": str(self.kwok_logs_file),
                               "follow": True}]}})
        path = self.kwok_logs_file.parent / "kwok-with-logs.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        return path

    def _aggregation_flags(self) -> list[str]:
        """The aggregation layer, as kubeadm sets it up: requests proxied to an aggregated
        API server (an APIService) carry the user in X-Remote-* headers, trusted there
        because they come with the front proxy's client certificate. Routing stays on the
        Service (no --enable-aggregator-routing): an endpoint may not be a loopback address,
        and an ExternalName Service naming this machine is how a test reaches a server
        running here (the ``remote_view`` fixture of tests/dispatcher/test_remote_view.py)."""
        pki = self.pki
        return [f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-username-headers=X-Remote-User",
                f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
                f"--proxy-client-key-file={pki.front_proxy_client_key}"]

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log (clusters running Kueue only): one JSON line per write
        to a TrainJob, JobSet or Kueue object, and per request for a Secret, with who
        made it (user and User-Agent)."""
        return self.directory / "logs" / "audit.log"

    def _audit_flags(self) -> list[str]:
        # Where Kueue and this project's components act on the same objects, tests must
        # tell their writes apart; the request metrics do not say who made a request.
        if self.kueue_dispatcher is None:
            return []
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata",
                       "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                       "resources": [{"group": "trainer.kubeflow.org"},
                                     {"group": "jobset.x-k8s.io"},
                                     {"group": "kueue.x-k8s.io"}]},
                      # Every request for a Secret, reads too: the dispatcher must read
                      # only its own, those MultiKueueClusters name, and never Kueue's.
                      {"level": "Metadata",
                       "resources": [{"group": "", "resources": ["secrets"]}]},
                      {"level": "None"}],
        }, sort_keys=False))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-maxbackup=1"]

    def kueue_configuration(self) -> dict:
        return kueue.configuration(self.kueue_dir, self.ports or {}, self.bind_address,
                                   self.kueue_dispatcher or kueue.DISPATCHER_ALL_AT_ONCE,
                                   tuple(self.kueue_integrations))

    @property
    def kueue_dir(self) -> Path:
        return self.directory / "kueue"

    @property
    def kueue_url(self) -> str:
        """Where the apiserver calls Kueue's webhooks and CRD conversion."""
        return f"https://{self.bind_address}:{self.port('kueue-webhook')}"

    # --- probes -------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str, timeout: float = 2.0, port: int | None = None) -> tuple[int, str]:
        """GET ``path`` on the apiserver (or another of the cluster's secure ``port``s) as
        admin; (status, body). Raises OSError when nothing answers."""
        conn = http.client.HTTPSConnection(
            self.bind_address, port or self.apiserver_port, context=self._tls_context(),
            timeout=timeout,
        )
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    def apiserver_ready(self) -> bool:
        return self._probe("/readyz", self.apiserver_port)

    def controller_manager_healthy(self) -> bool:
        return self._probe("/healthz", self.controller_manager_port)

    def scheduler_healthy(self) -> bool:
        return self._probe("/healthz", self.port("kube-scheduler"))

    def jobset_ready(self) -> bool:
        # Ready once its webhook server serves with the certificates.
        return worker_stack.http_ok(self.bind_address, self.port("jobset-health"), "/readyz")

    def kwok_healthy(self) -> bool:
        return self._probe("/healthz", self.port("kwok"))

    def healthy(self, component: str) -> bool:
        """The readiness probe of ``component``."""
        return {
            "etcd": self.etcd_healthy,
            "kube-apiserver": self.apiserver_ready,
            "kube-controller-manager": self.controller_manager_healthy,
            "kube-scheduler": self.scheduler_healthy,
            "jobset-controller": self.jobset_ready,
            "kwok": self.kwok_healthy,
            kueue.COMPONENT: self.kueue_ready,
        }[component]()

    def kueue_ready(self) -> bool:
        # Ready once its webhook server serves with the certificates.
        return worker_stack.http_ok(self.bind_address, self.port("kueue-health"), "/readyz")

    def listen_port(self, component: str) -> int:
        return {
            "etcd": self.etcd_client_port,
            "kube-apiserver": self.apiserver_port,
            "kube-controller-manager": self.controller_manager_port,
        }.get(component) or self.port({"jobset-controller": "jobset-webhook",
                                       kueue.COMPONENT: "kueue-webhook"}.get(component, component))

    def _probe(self, path: str, port: int) -> bool:
        try:
            status, body = self.get(path, port=port)
        except (OSError, ssl.SSLError, http.client.HTTPException):
            return False
        return status == 200 and body.strip() == "ok"

    def etcd_healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.bind_address, self.etcd_client_port, timeout=2)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            return response.status == 200 and json.loads(response.read()).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def version(self) -> dict:
        status, body = self.get("/version")
        if status != 200:
            raise ControlPlaneError(f"{self.name}: GET /version answered {status}: {body[:200]}")
        return json.loads(body)


def wait_until(
    what: str,
    probe,
    timeout: float,
    *,
    alive=None,
    log_file: Path | None = None,
    interval: float = 0.1,
) -> None:
    """Poll ``probe`` until true. Fail early if ``alive()`` turns false (the process died),
    and fail with the component's log tail either way. ``timeout`` is what an idle machine
    needs; a busy one stretches it by its load (``Deadline``)."""
    deadline = Deadline(timeout)
    while True:
        if probe():
            return
        if alive is not None and not alive():
            tail = processes.log_tail(log_file) if log_file else ""
            raise ControlPlaneError(
                f"{what}: process exited before it was ready. Log tail:\n{tail}")
        if deadline.passed():
            tail = processes.log_tail(log_file) if log_file else ""
            raise ControlPlaneError(
                f"{what}: not ready after {deadline.waited()}. Log tail:\n{tail}")
        time.sleep(interval)
