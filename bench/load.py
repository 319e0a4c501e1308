"""Load generation: API calls from a pool of threads, each thread with its own client per
cluster (no shared connection pool or client-side rate limit), as a burst or paced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import writes
from controller_kit.kubeclient import api_client
from trainjob import constants as c

RUNTIME = "bench-torch"
# The pods of one job on that runtime: a dataset and a model initializer and one trainer.
PODS_PER_JOB = 3
RETRIES = 5
# What warming a client sends: a question the apiserver answers without storing anything.
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
ACCESS_REVIEW = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                 "spec": {"resourceAttributes": {"verb": "get", "group": c.TRAINER_GROUP,
                                                 "resource": c.TRAINJOBS}}}

Call = Callable[[client.CustomObjectsApi], object]


@dataclass
class LoadRun:
    """Wall-clock (time.time) start and end of every call, in submission order."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    retries: int = 0

    @property
    def first_start(self) -> float:
        return min(self.starts)

    @property
    def last_end(self) -> float:
        return max(self.ends)

    def rate(self) -> float:
        """Completed calls per second, first start to last end."""
        span = self.last_end - self.first_start
        return len(self.ends) / span if span > 0 else float("nan")


class LoadRunner:
    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self._local = threading.local()
        self._clients: list[client.ApiClient] = []
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="bench-load")

    def _custom(self, kubeconfig: Path) -> client.CustomObjectsApi:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if kubeconfig not in clients:
            api = api_client(kubeconfig)
            with self._lock:
                self._clients.append(api)
            clients[kubeconfig] = client.CustomObjectsApi(api)
        return clients[kubeconfig]

    def run(self, calls: list[tuple[Path, Call]], rate: float | None = None) -> LoadRun:
        """Run each call against the cluster of its kubeconfig: all at once (``rate`` None:
        as fast as the pool goes) or call i at ``i / rate`` seconds after the start."""
        result = LoadRun(starts=[0.0] * len(calls), ends=[0.0] * len(calls))
        retries = [0] * len(calls)
        origin = time.monotonic() + 0.05

        def one(index: int) -> None:
            if rate:
                delay = origin + index / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the arrivals is the point of this scenario
            kubeconfig, call = calls[index]
            custom = self._custom(kubeconfig)
            result.starts[index] = time.time()
            for attempt in range(RETRIES):
                try:
                    call(custom)
                    break
                except ApiException as err:
                    if err.status == 409 and attempt > 0:
                        break  # the failed-looking earlier attempt did go through
                    # Overload answers are retried; anything else is a benchmark error.
                    if err.status not in (429, 500, 503, 504) or attempt == RETRIES - 1:
                        raise
                    retries[index] += 1
                    time.sleep(0.1 * (attempt + 1))
            result.ends[index] = time.time()

        for future in [self.pool.submit(one, i) for i in range(len(calls))]:
            future.result()
        result.retries = sum(retries)
        return result

    def warm(self, kubeconfigs: list[Path]) -> None:
        """Give every thread of the pool its client for each cluster and its connection
        open (one access review each, which the apiserver answers and stores nowhere): a
        timed step then does not pay for the benchmark's own clients (kubeconfig, TLS
        context and handshake for each thread and cluster) on the machine it measures."""
        everyone = threading.Barrier(self.concurrency)

        def warm_one() -> None:
            everyone.wait(timeout=60)  # one task per thread: each waits for the others
            for kubeconfig in kubeconfigs:
                writes.request_json(self._custom(kubeconfig).api_client, "POST",
                                    ACCESS_REVIEWS, ACCESS_REVIEW)

        for future in [self.pool.submit(warm_one) for _ in range(self.concurrency)]:
            future.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for api in self._clients:
                api.close()


def trainjob(name: str, *, multikueue: bool = True) -> dict:
    """A small torch TrainJob (3 pods of 100m cpu from the runtime), for the dispatcher when
    ``multikueue``, else a plain one (what the ceiling runs create)."""
    spec: dict = {"runtimeRef": {"name": RUNTIME},
                  "trainer": {"numNodes": 1,
                              "resourcesPerNode": {"requests": {"cpu": "100m"}}}}
    if multikueue:
        spec["managedBy"] = c.MANAGED_BY_MULTIKUEUE
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name}, "spec": spec}


def create_call(namespace: str, body: dict) -> Call:
    # The project's own write path: the load generator shares the machine it measures.
    def call(custom: client.CustomObjectsApi) -> object:
        return writes.create(custom.api_client, c.TRAINER_GROUP, c.TRAINER_VERSION,
                             namespace, c.TRAINJOBS, body)
    return call


def creates(kubeconfig: Path, namespace: str, names: list[str], *, multikueue: bool = True,
            submit: Callable[[dict], dict] | None = None) -> list[tuple[Path, Call]]:
    """Create calls for ``names``; ``submit`` turns the dispatcher's TrainJob into what
    another dispatcher is given (e.g. Kueue's queue-name label instead of managedBy)."""
    bodies = [trainjob(name, multikueue=multikueue) for name in names]
    return [(kubeconfig, create_call(namespace, submit(body) if submit else body))
            for body in bodies]
