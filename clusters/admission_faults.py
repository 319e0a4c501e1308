"""Real API errors on demand, for fault-injection tests.

A harness cluster's kube-apiserver is made to refuse chosen requests by a validating
admission webhook served from the test process: the apiserver itself answers the client
with the status code the webhook gives (429, 500, 503, ...), exactly as it would when
overloaded or broken, so the client code under test sees real responses from a real
apiserver. The first ``count`` matching requests are refused; later ones are allowed.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes import client

from clusters.machine_load import Deadline

REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
           504: "Timeout"}


@dataclass
class Seen:
    """One admission request the webhook answered."""

    at: float
    operation: str
    namespace: str
    name: str
    refused: bool


@dataclass
class AdmissionFaults:
    """Refuse the first ``count`` ``operations`` on ``resource`` (e.g. ``trainjobs`` or
    ``trainjobs/status``) in ``namespace`` of cluster ``cluster`` with HTTP ``code``.

    Use as a context manager: the webhook is registered on enter and removed on exit."""

    harness: object  # clusters.local.LocalClusters
    cluster: object  # clusters.pytest_plugin.Cluster
    directory: Path
    namespace: str
    resource: str
    operations: tuple[str, ...]
    code: int
    count: int
    group: str = "trainer.kubeflow.org"
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = f"faults-{uuid.uuid4().hex[:10]}.harness.test"
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._probed = threading.Event()

    @property
    def refused(self) -> int:
        with self._lock:
            return sum(1 for s in self.seen if s.refused)

    @property
    def allowed(self) -> int:
        with self._lock:
            return sum(1 for s in self.seen if not s.refused)

    def _answer(self, review: dict) -> dict:
        request = review.get("request") or {}
        if (request.get("resource") or {}).get("resource") == "configmaps":
            self._probed.set()  # see wait_active
            return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": request.get("uid", ""), "allowed": True}}
        with self._lock:
            refuse = sum(1 for s in self.seen if s.refused) < self.count
            self.seen.append(Seen(time.monotonic(), request.get("operation", ""),
                                  request.get("namespace", ""), request.get("name", ""),
                                  refuse))
        response: dict = {"uid": request.get("uid", ""), "allowed": not refuse}
        if refuse:
            response["status"] = {
                "code": self.code, "reason": REASONS.get(self.code, "InternalError"),
                "message": f"injected fault: {self.code} for {request.get('operation')} "
                           f"{self.resource} {request.get('namespace')}/{request.get('name')}"}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": response}

    def __enter__(self) -> AdmissionFaults:
        ca_file = self.harness.issue_serving_certificate(self.cluster.name, self.directory)
        answer = self._answer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                reply = json.dumps(answer(json.loads(body))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                return

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / "tls.crt", self.directory / "tls.key")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, name="admission-faults",
                         daemon=True).start()
        port = self._server.server_address[1]
        client.AdmissionregistrationV1Api(self.cluster.api).create_validating_webhook_configuration(
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": self.name},
             "webhooks": [{
                 "name": self.name,
                 "clientConfig": {"url": f"https://127.0.0.1:{port}/",
                                  "caBundle": base64.b64encode(ca_file.read_bytes()).decode()},
                 "rules": [{"apiGroups": [self.group], "apiVersions": ["*"],
                            "operations": list(self.operations),
                            "resources": [self.resource], "scope": "Namespaced"},
                           # A harmless probe target: see wait_active.
                           {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["configmaps"], "scope": "Namespaced"}],
                 "namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": self.namespace}},
                 "failurePolicy": "Fail",
                 "sideEffects": "None",
                 "admissionReviewVersions": ["v1"],
                 "timeoutSeconds": 5,
             }]})
        self.wait_active()
        return self

    def wait_active(self, timeout: float = 30) -> None:
        """Return once the apiserver calls the webhook (it loads new configurations
        asynchronously): dry-run ConfigMap creates reach it without storing anything."""
        core = client.CoreV1Api(self.cluster.api)
        body = {"metadata": {"name": "admission-faults-probe"}}
        deadline = Deadline(timeout)
        while not self._probed.is_set():
            if deadline.passed():
                raise TimeoutError(f"webhook {self.name} not called by cluster "
                                   f"{self.cluster.name} within {deadline.waited()}")
            core.create_namespaced_config_map(self.namespace, body, dry_run="All")
            self._probed.wait(0.1)

    def __exit__(self, *exc) -> None:
        try:
            client.AdmissionregistrationV1Api(
                self.cluster.api).delete_validating_webhook_configuration(self.name)
        finally:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
