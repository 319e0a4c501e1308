"""The certificate the remote view serves, which the aggregator verifies against the
APIService's ``caBundle`` for the name ``<service>.<namespace>.svc``.

Either given (``--remote-api-cert-dir``: ``tls.crt`` and ``tls.key``, e.g. from
cert-manager; the caBundle is then the issuer's to inject), or made by the dispatcher
itself as the operator makes its webhook's, by the same rule
(``controller_kit.ca_rotation``): a Secret in its namespace holds a CA (``ca.crt``,
newest first, and ``ca.key``) and the serving certificate it signed (``tls.crt``,
``tls.key``); every replica keeps that Secret right (writes are conditional on its
resourceVersion, so two replicas never overwrite each other), copies ``ca.crt`` into the
APIService's caBundle and only then writes the pair into a private directory of its own.
A serving certificate falling due is renewed under the newest CA only once the caBundle
has held that CA for the settle time (the aggregator takes a changed APIService up through
its watch), so nothing is served that the aggregator does not trust yet. Either way the
pair is served by ``controller_kit.serving_certificate.ServingCertificate`` over that
directory (read again when it changes; a broken pair keeps the previous one)."""

from __future__ import annotations

import base64
import datetime
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.ca_rotation import (
    CA_CRT,
    TLS_CRT,
    TLS_KEY,
    Hosts,
    Plan,
    decode,
    fingerprint,
    plan,
    read_bundle,
    settle_time,
    write_served_files,
)
from controller_kit.certificates import issued_at
from controller_kit.kubeclient import describe_error
from controller_kit.writes import MERGE_PATCH, request_json

log = logging.getLogger(__name__)

SERVING_VALIDITY = datetime.timedelta(days=365)
COMMON_NAME = "trainjob-dispatcher-remote-api"
# At least this often every replica looks at the Secret and the APIService again; sooner
# when something falls due, and every few seconds until it has served a pair.
SYNC_SECONDS = 60.0
# While the APIService is not installed: a team applies manifests/remote-api once the
# dispatcher serves, and the aggregator trusts nothing until the CA is injected.
ABSENT_SECONDS = 5.0
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


def hosts_of(service: str, namespace: str) -> tuple[str, ...]:
    """The names the aggregator and in-cluster clients reach the Service by."""
    return Hosts.for_service(service, namespace).dns_names


def next_step(data: Mapping[str, bytes], hosts: tuple[str, ...], now: datetime.datetime,
              trusted: Collection[str] | None,
              validity: datetime.timedelta = SERVING_VALIDITY) -> Plan:
    """The rotation rule's next step for the Secret's ``data``. ``trusted``: the
    fingerprints of the CAs the APIService's caBundle has held for the settle time (None:
    there is no APIService, nothing verifies through it); a CA is settled once among them
    and made at least the settle time ago."""
    settle = settle_time(validity).total_seconds()

    def settled(ca: x509.Certificate) -> bool:
        if trusted is not None and fingerprint(ca) not in trusted:
            return False
        return (now - issued_at(ca)).total_seconds() >= settle

    return plan(data, Hosts(hosts), validity, now, settled, common_name=COMMON_NAME,
                validity_source=f"{validity.days} days")


class SecretCertificate:
    """The Secret ``namespace/secret`` kept (module docstring), its CA injected into
    APIService ``apiservice``, its pair written into ``directory`` (a private temporary
    one, removed by ``stop``) once injected. ``synced`` is set once a pair was written."""

    def __init__(self, api: client.ApiClient, namespace: str, secret: str,
                 hosts: tuple[str, ...], apiservice: str,
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                     datetime.UTC),
                 validity: datetime.timedelta = SERVING_VALIDITY):
        self.api, self.namespace, self.secret = api, namespace, secret
        self.hosts, self.apiservice, self._clock = hosts, apiservice, clock
        self.validity = validity
        self.directory = Path(tempfile.mkdtemp(prefix="remote-view-certificate-"))
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._said = ""
        self._served: tuple[bytes, bytes] | None = None
        # When each CA was first seen in the APIService's caBundle (monotonic).
        self._bundled_since: dict[str, float] = {}

    @property
    def where(self) -> str:
        return f"Secret {self.namespace}/{self.secret}"

    def start(self) -> SecretCertificate:
        wait = self.sync()
        threading.Thread(target=self._run, args=(wait,), name="remote-view-certificate",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, wait: float) -> None:
        while not self._stop.wait(wait):
            wait = self.sync()

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            self._said = message
            log.log(level, "remote view: %s", message)

    def sync(self) -> float:
        """One pass: the Secret right, its CA in the APIService's caBundle, then served.
        Returns the seconds until the next pass."""
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"
        try:
            apiservice = self._apiservice()
            try:
                secret = request_json(self.api, "GET", path, None)
            except ApiException as err:
                if err.status != 404:
                    raise
                secret = None
            data = decode((secret or {}).get("data"))
            step = next_step(data, self.hosts, self._clock(), self._trusted(apiservice),
                             self.validity)
            if step.data is not None:
                body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": self.secret, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/managed-by":
                                                "trainjob-dispatcher"}},
                        "data": {k: base64.b64encode(v).decode()
                                 for k, v in step.data.items()}}
                try:
                    if secret is None:
                        request_json(self.api, "POST",
                                     f"/api/v1/namespaces/{self.namespace}/secrets", body)
                    else:
                        body["metadata"]["resourceVersion"] = \
                            secret["metadata"]["resourceVersion"]
                        request_json(self.api, "PUT", path, body)
                except ApiException as err:
                    if err.status == 409:
                        return 0.5  # another replica wrote it first: read what it wrote
                    raise
                log.info("remote view: %s written: %s", self.where, step.reason)
                data = step.data
            elif step.reason:
                log.debug("remote view: %s: %s", self.where, step.reason)
            if apiservice is not None:
                self._inject(apiservice, data[CA_CRT])
            self._serve(data[TLS_CRT], data[TLS_KEY])
            self._say(logging.DEBUG, "")
            return min(SYNC_SECONDS if apiservice is not None else ABSENT_SECONDS,
                       step.recheck_in)
        except Exception as err:  # noqa: BLE001 - retried on the next pass
            self._say(logging.WARNING, f"cannot keep the serving certificate in {self.where}: "
                                       f"{describe_error(err)}")
            return 2.0 if not self.synced.is_set() else SYNC_SECONDS

    def _apiservice(self) -> dict | None:
        try:
            return request_json(self.api, "GET", f"{APISERVICES}/{self.apiservice}", None)
        except ApiException as err:
            if err.status != 404:
                raise
        self._say(logging.INFO, f"APIService {self.apiservice} is not installed: kubectl "
                                "reaches the remote view once manifests/remote-api is applied")
        return None

    def _trusted(self, apiservice: dict | None) -> set[str] | None:
        """The CAs the aggregator trusts by now: in the caBundle for the settle time (None
        without an APIService: nothing verifies the certificate through it)."""
        if apiservice is None:
            return None
        try:
            bundle = base64.b64decode((apiservice.get("spec") or {}).get("caBundle") or "")
        except ValueError:
            bundle = b""
        bundled = {fingerprint(cert) for cert in read_bundle(bundle)}
        now = time.monotonic()
        self._bundled_since = {fp: self._bundled_since.get(fp, now) for fp in bundled}
        settle = settle_time(self.validity).total_seconds()
        return {fp for fp, since in self._bundled_since.items() if now - since >= settle}

    def _inject(self, apiservice: dict, bundle: bytes) -> None:
        wanted = base64.b64encode(bundle).decode()
        if (apiservice.get("spec") or {}).get("caBundle") != wanted:
            request_json(self.api, "PATCH", f"{APISERVICES}/{self.apiservice}",
                         {"spec": {"caBundle": wanted}}, content_type=MERGE_PATCH)
            log.info("remote view: the CA of the serving certificate injected into "
                     "APIService %s", self.apiservice)

    def _serve(self, chain: bytes, key: bytes) -> None:
        """The pair into the directory, both files swapped in at once (a reader never sees
        a new certificate with an old key)."""
        if self._served != (chain, key):
            write_served_files(self.directory, {TLS_CRT: chain, TLS_KEY: key})
            self._served = (chain, key)
        self.synced.set()
