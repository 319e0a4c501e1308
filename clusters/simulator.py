"""JobSet progress simulator: plays the JobSet controller and the kubelets in the local
harness, where neither runs.

For every JobSet on one harness worker it writes the status a real JobSet would reach:
when it is not suspended, its replicated jobs become active (one "pod" per count) and,
``run_seconds`` later, Completed. A suspended JobSet shows its jobs suspended. It only ever
writes JobSet *status*, and only on clusters of a harness state directory: it takes a
state directory and a cluster name, never an arbitrary kubeconfig, so it cannot be pointed
at a real cluster by accident.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.local import LocalClusters
from trainjob import constants as c
from trainjob.informer import Informer
from trainjob.kubeclient import api_client

log = logging.getLogger(__name__)


class JobSetSimulator:
    def __init__(self, state_dir: Path | str, cluster: str, run_seconds: float = 8.0):
        harness = LocalClusters(state_dir)
        known = {record.name for record in harness.load().clusters}
        if cluster not in known:
            raise ValueError(f"{cluster!r} is not a cluster of the harness in {state_dir} "
                             f"(clusters: {sorted(known) or 'none'}); the simulator only "
                             "runs inside the harness")
        self.cluster = cluster
        self.run_seconds = run_seconds
        self.api = api_client(harness.kubeconfig(cluster))
        self.custom = client.CustomObjectsApi(self.api)
        self.jobsets = Informer(f"simulator/{cluster}/jobsets", functools.partial(
            self.custom.list_cluster_custom_object, c.JOBSET_GROUP, c.JOBSET_VERSION,
            c.JOBSETS))
        self.jobsets.add_handler(lambda *_: self._wake.set())
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._started: dict[tuple[str, str], float] = {}
        self._thread = threading.Thread(target=self._run, name=f"simulator-{cluster}",
                                        daemon=True)

    def start(self) -> JobSetSimulator:
        self.jobsets.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.jobsets.stop()
        self._thread.join(5)
        self.api.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Wake on any JobSet change, and at least every half second to finish jobs on time.
            self._wake.wait(0.5)
            self._wake.clear()
            for jobset in self.jobsets.list():
                try:
                    self._step(jobset)
                except ApiException as err:
                    if err.status not in (404, 409):
                        log.warning("simulator %s: %s", self.cluster, err)

    def _step(self, jobset: dict) -> None:
        meta, spec = jobset["metadata"], jobset.get("spec") or {}
        status = jobset.get("status") or {}
        key = (meta["namespace"], meta["name"])
        if any(x.get("type") in (c.JOBSET_COMPLETED, c.JOBSET_FAILED) and x.get("status") == "True"
               for x in status.get("conditions") or []):
            return
        jobs = spec.get("replicatedJobs") or []
        counts = {j["name"]: int(j.get("replicas", 1)) * int(
            ((j.get("template") or {}).get("spec") or {}).get("parallelism", 1)) for j in jobs}
        if spec.get("suspend"):
            self._started.pop(key, None)
            desired = {"replicatedJobsStatus": [
                {"name": n, "ready": 0, "succeeded": 0, "failed": 0, "active": 0,
                 "suspended": count} for n, count in counts.items()]}
        else:
            started = self._started.setdefault(key, time.monotonic())
            if time.monotonic() - started >= self.run_seconds:
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                desired = {
                    "replicatedJobsStatus": [
                        {"name": n, "ready": 0, "succeeded": count, "failed": 0, "active": 0,
                         "suspended": 0} for n, count in counts.items()],
                    "conditions": [{"type": c.JOBSET_COMPLETED, "status": "True",
                                    "reason": "AllJobsCompleted",
                                    "message": "jobset completed (simulated)",
                                    "lastTransitionTime": now}],
                }
            else:
                desired = {"replicatedJobsStatus": [
                    {"name": n, "ready": count, "succeeded": 0, "failed": 0, "active": count,
                     "suspended": 0} for n, count in counts.items()]}
        if all(status.get(k) == v for k, v in desired.items()):
            return
        written = self.custom.patch_namespaced_custom_object_status(
            c.JOBSET_GROUP, c.JOBSET_VERSION, meta["namespace"], c.JOBSETS, meta["name"],
            {"status": desired}, field_manager="jobset-simulator",
            _content_type="application/merge-patch+json")
        self.jobsets.observe(written)
