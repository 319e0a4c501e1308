"""``python -m bench.anonymous_load``: what an anonymous flood of the dispatcher's secure
metrics port costs the dispatching.

Local clusters from the harness (a manager and one worker, loopback only), the dispatcher
started as its Deployment starts it (``--metrics-secure`` on every interface, the probes on
a port of their own), and two runs of the same steady stream of jobs (``--rate`` jobs/s for
``--seconds``): one quiet, one while the metrics port gets ``--tokens`` requests with
made-up bearer tokens (paced over the stream) and ``--slow`` connections that send their
request a byte at a time (each connecting again once cut, until the stream ends). For
each it prints the reconcile p99 (the dispatcher's ``controller_runtime_reconcile_time_
seconds`` of the dispatch controller) and the dispatch latency p99 (its
``dispatcher_dispatch_latency_seconds``), the dispatcher's CPU seconds per job, the
TokenReviews the manager's apiserver served (its ``apiserver_request_total``) and the
dispatcher's own count, what the flood got back, and the dispatcher's threads at most.

Bounded in count and time: one stream of ``rate x seconds`` jobs per run, at most
``--tokens`` requests and ``--slow`` connections at once; ``--quick`` is a smaller size for
a busy machine. The clusters are removed at the end unless ``--state-dir`` names running
ones (``python -m clusters up``), which are then left running.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import math
import os
import secrets
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from bench.environment import DISPATCHER_NAMESPACE, BenchClusters
from bench.load import LoadRunner, creates
from clusters.controlplane import free_port
from clusters.crds import manifests_dir
from clusters.testing import eventually, request_counts
from dispatcher.metrics import DISPATCH_CONTROLLER
from trainjob import constants as c

log = logging.getLogger("bench.anonymous_load")

READER = "bench-metrics-reader"
TOKENREVIEWS = ("authentication.k8s.io", "tokenreviews", "", "POST")
# A slow connection sends a byte this often: each read gets one long before any read
# timeout, so only a deadline on the whole connection ends it.
DRIP_SECONDS = 0.5
SLOW_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: dispatcher\r\nAuthorization: Bearer slow\r\n"


@dataclass(frozen=True)
class Size:
    rate: float  # jobs per second
    seconds: float  # of the stream
    tokens: int  # requests with made-up tokens, paced over the stream
    slow: int  # slow connections held at once

    @property
    def jobs(self) -> int:
        return int(self.rate * self.seconds)


FULL = Size(rate=10, seconds=20, tokens=1000, slow=100)
QUICK = Size(rate=5, seconds=10, tokens=300, slow=30)


# --- reading the dispatcher ------------------------------------------------------------


class Scraper:
    """Reads the dispatcher's /metrics as a Prometheus bound to its metrics-reader role."""

    def __init__(self, port: int, token: str):
        self.port, self.token = port, token

    def text(self, timeout: float = 10) -> str:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                           context=_unverified())
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
            response = conn.getresponse()
            body = response.read().decode()
            if response.status != 200:
                raise RuntimeError(f"/metrics answered {response.status}: {body[:200]}")
            return body
        finally:
            conn.close()

    def samples(self) -> list:
        text = eventually(self.text, lambda _: True, timeout=60, interval=0.5,
                          expected="the dispatcher's /metrics to answer the reader")
        return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _unverified() -> ssl.SSLContext:
    # The dispatcher's certificate is self-signed, as shipped: nothing to verify it with.
    return ssl._create_unverified_context()


def histogram(samples: list, name: str, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts of one histogram series, by upper bound."""
    return {float(s.labels["le"]): s.value for s in samples
            if s.name == f"{name}_bucket"
            and all(s.labels.get(k) == v for k, v in labels.items())}


def counter(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of what was observed between two readings of a histogram, as
    Prometheus's histogram_quantile interpolates it within its bucket (None: nothing)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # above the largest finite bucket: its bound is all we know
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


# --- the flood -----------------------------------------------------------------------


class Flood:
    """Made-up tokens paced over ``seconds`` and (``slow``) ``size.slow`` connections
    dripping their request, each connecting again half a second after it was cut or
    refused, against the metrics port; what each got back is counted."""

    def __init__(self, port: int, size: Size, slow: bool = True):
        self.port, self.size = port, size
        self.slow_connections = size.slow if slow else 0
        self.answers: Counter = Counter()
        self.slow: Counter = Counter()
        self.held: list[float] = []  # seconds each slow connection was held before its cut
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Flood:
        self._threads = [threading.Thread(target=self._tokens, name="flood-tokens",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._drip, name=f"flood-slow-{i}",
                                           daemon=True)
                          for i in range(self.slow_connections)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _count(self, counter: Counter, outcome: str) -> None:
        with self._lock:
            counter[outcome] += 1

    def _tokens(self) -> None:
        interval = self.size.seconds / max(1, self.size.tokens)
        origin = time.monotonic()
        with ThreadPoolExecutor(16, thread_name_prefix="flood-token") as pool:
            for i in range(self.size.tokens):
                # Paced: request i at i x interval, so the flood lasts as long as the stream.
                if self._stop.wait(max(0.0, origin + i * interval - time.monotonic())):
                    break
                pool.submit(self._one_token)

    def _one_token(self) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10,
                                           context=_unverified())
        try:
            conn.request("GET", "/metrics",
                         headers={"Authorization": f"Bearer {secrets.token_urlsafe(32)}"})
            response = conn.getresponse()
            response.read()
            self._count(self.answers, str(response.status))
        except TimeoutError:
            self._count(self.answers, "timed out")
        except (ssl.SSLError, OSError, http.client.HTTPException):
            self._count(self.answers, "closed unanswered")
        finally:
            conn.close()

    def _drip(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                self._count(self.slow, "not connected")
                self._stop.wait(DRIP_SECONDS)
                continue
            try:
                tls = _unverified().wrap_socket(raw)
            except (ssl.SSLError, OSError):
                raw.close()
                self._count(self.slow, "closed before the handshake")
                self._stop.wait(DRIP_SECONDS)  # then connects again: at most 2 a second
                continue
            # Taken up by a thread of the listener (it did the handshake); as the flood stops
            # and these close, the listener takes up those still in its line, so this count
            # goes on a little after the stop.
            self._count(self.slow, "taken up (handshake done)")
            try:
                for byte in SLOW_REQUEST * 100:
                    if self._stop.wait(DRIP_SECONDS):
                        break
                    tls.sendall(bytes([byte]))
            except (ssl.SSLError, OSError):
                self._count(self.slow, "cut while dripping")
                with self._lock:
                    self.held.append(time.monotonic() - started)
            finally:
                tls.close()
            self._stop.wait(DRIP_SECONDS)


# --- a run ------------------------------------------------------------------------------


def reader_token(api: client.ApiClient) -> str:
    """A ServiceAccount token bound to the shipped metrics-reader ClusterRole."""
    rbac = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    documents = yaml.safe_load_all((manifests_dir() / "dispatcher" / "metrics-rbac.yaml")
                                   .read_text())
    role = next(d for d in documents if d and d["metadata"]["name"].endswith("-reader"))
    for create, body in (
            (rbac.create_cluster_role, role),
            (rbac.create_cluster_role_binding, {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": READER},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": READER,
                              "namespace": DISPATCHER_NAMESPACE}]}),
            (lambda b: core.create_namespaced_service_account(DISPATCHER_NAMESPACE, b),
             {"metadata": {"name": READER}})):
        try:
            create(body)
        except ApiException as err:
            if err.status != 409:
                raise
    return core.create_namespaced_service_account_token(
        READER, DISPATCHER_NAMESPACE, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    ).status.token


def copies(api: client.ApiClient, namespace: str) -> int:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS)
    return len(listed.get("items", []))


def run_stream(env: BenchClusters, scraper: Scraper, size: Size, name: str,
               flood: str | None) -> dict:
    """One stream of jobs, with ``flood`` (None, ``tokens`` or ``tokens+slow``); its
    figures."""
    namespace = f"anon-{name}"
    env.create_namespace(namespace)
    dispatcher = env.dispatcher
    assert dispatcher is not None
    pid = dispatcher.proc.pid
    manager_plane = env.control_plane("manager")
    runner = LoadRunner(8)
    try:
        runner.warm([env.kubeconfig("manager")])
        before = scraper.samples()
        reviews_before = request_counts(manager_plane)[TOKENREVIEWS]
        cpu_before = cpu_seconds(pid)
        threads_before = peak = threads(pid)
        load_at_start = round(os.getloadavg()[0], 1)
        attack = (Flood(dispatcher.metrics_port, size, slow=flood == "tokens+slow").start()
                  if flood else None)
        started = time.monotonic()
        calls = creates(env.kubeconfig("manager"), namespace,
                        [f"{name}-{i}" for i in range(size.jobs)])
        stream = threading.Thread(target=runner.run, args=(calls, size.rate), daemon=True)
        stream.start()
        # Every copy on the worker, each a dispatched job; the flood ends with the stream.
        worker = env.apis[env.worker_names[0]]
        deadline = started + size.seconds + 120
        while copies(worker, namespace) < size.jobs:
            peak = max(peak, threads(pid))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {copies(worker, namespace)} of {size.jobs} "
                                   "jobs dispatched after two minutes")
            if attack is not None and not stream.is_alive():
                attack.stop()
            time.sleep(0.5)  # a poll of the worker, not a wait for anything in particular
        stream.join()
        if attack is not None:
            attack.stop()
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(pid) - cpu_before
        after = scraper.samples()
        reviews = request_counts(manager_plane)[TOKENREVIEWS] - reviews_before
    finally:
        runner.close()
    reconcile = (histogram(before, "controller_runtime_reconcile_time_seconds",
                           controller=DISPATCH_CONTROLLER),
                 histogram(after, "controller_runtime_reconcile_time_seconds",
                           controller=DISPATCH_CONTROLLER))
    latency = (histogram(before, "dispatcher_dispatch_latency_seconds"),
               histogram(after, "dispatcher_dispatch_latency_seconds"))

    def delta(name: str, **labels: str) -> float:
        return counter(after, name, **labels) - counter(before, name, **labels)

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    figures = {
        "flood": flood or "none", "load_average_1m_at_start": load_at_start,
        "jobs": size.jobs, "seconds": round(elapsed, 1),
        "reconciles": int(delta("controller_runtime_reconcile_total",
                                controller=DISPATCH_CONTROLLER)),
        "reconcile_p99_ms": ms(quantile(*reconcile, 0.99)),
        "reconcile_p50_ms": ms(quantile(*reconcile, 0.50)),
        "dispatch_latency_p99_ms": ms(quantile(*latency, 0.99)),
        "dispatch_latency_p50_ms": ms(quantile(*latency, 0.50)),
        "dispatcher_cpu_seconds_per_job": round(cpu / size.jobs, 4),
        "dispatcher_cpu_seconds": round(cpu, 2),
        # The reconcile threads' own CPU (thread_time, summed over every step of every
        # reconcile): what a job costs the dispatching, whatever else the process serves.
        "reconcile_cpu_ms_per_job": round(
            delta("dispatcher_reconcile_step_seconds_sum", clock="cpu") * 1000 / size.jobs, 3),
        "tokenreviews_at_the_apiserver": int(reviews),
        "tokenreviews_by_the_dispatcher": int(delta("metrics_auth_reviews_total",
                                                    review="tokenreview")),
        "connections_dropped": {reason: int(delta("metrics_auth_connections_dropped_total",
                                                  reason=reason))
                                for reason in ("busy", "deadline")},
        "dispatcher_threads": {"before": threads_before, "most": peak},
    }
    if attack is not None:
        held = sorted(attack.held)
        figures["flood_outcome"] = {
            "made_up_token_answers": dict(attack.answers),
            "slow_connections": dict(attack.slow),
            "slow_connection_held_max_s": round(held[-1], 1) if held else None,
        }
    return figures


def measure(env: BenchClusters, size: Size) -> dict:
    token = reader_token(env.apis["manager"])
    probe, dashboard = free_port(), free_port()
    env.start_dispatcher(env.worker_names, "best-fit", (
        "--metrics-secure", "--metrics-host", "::", "--health-probe-port", str(probe),
        "--dashboard-port", str(dashboard)))
    assert env.dispatcher is not None
    scraper = Scraper(env.dispatcher.metrics_port, token)
    runs = [run_stream(env, scraper, size, "quiet", flood=None),
            run_stream(env, scraper, size, "tokens", flood="tokens"),
            run_stream(env, scraper, size, "flooded", flood="tokens+slow")]
    # What the flood cost the process beyond the quiet run, per made-up token sent.
    quiet = runs[0]["dispatcher_cpu_seconds"]
    for run in runs[1:]:
        run["flood_cpu_ms_per_request"] = round(
            (run["dispatcher_cpu_seconds"] - quiet) * 1000 / size.tokens, 2)
    return {"size": asdict(size), "cpu_count": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": runs}


def render(result: dict) -> str:
    runs, size = result["runs"], result["size"]
    rows = [
        ("reconcile p99 (dispatch controller), ms", "reconcile_p99_ms"),
        ("reconcile p50, ms", "reconcile_p50_ms"),
        ("dispatch latency p99, ms", "dispatch_latency_p99_ms"),
        ("dispatch latency p50, ms", "dispatch_latency_p50_ms"),
        ("dispatcher CPU seconds per job", "dispatcher_cpu_seconds_per_job"),
        ("reconcile threads' CPU per job, ms", "reconcile_cpu_ms_per_job"),
        ("TokenReviews at the manager apiserver", "tokenreviews_at_the_apiserver"),
        ("TokenReviews the dispatcher sent", "tokenreviews_by_the_dispatcher"),
        ("load average (1 min) at the start", "load_average_1m_at_start"),
    ]
    jobs = int(size["rate"] * size["seconds"])
    lines = [(f"{size['rate']:g} jobs/s for {size['seconds']:g} s ({jobs} jobs) each run; "
              f"flood: {size['tokens']} made-up tokens, and {size['slow']} slow connections"),
             f"{'':42}" + "".join(f"{run['flood']:>13}" for run in runs)]
    for label, key in rows:
        lines.append(f"{label:42}" + "".join(f"{run[key]!s:>13}" for run in runs))
    lines.append(f"{'flood CPU per made-up token, ms':42}{'':>13}" + "".join(
        f"{run['flood_cpu_ms_per_request']!s:>13}" for run in runs[1:]))
    lines.append(f"{'dispatcher threads at most':42}"
                 + "".join(f"{run['dispatcher_threads']['most']:>13}" for run in runs))
    for run in runs:
        if "flood_outcome" in run:
            outcome = run["flood_outcome"]
            lines.append(f"{run['flood']}: made-up tokens answered "
                         f"{outcome['made_up_token_answers']}; slow connections "
                         f"{outcome['slow_connections']}, held at most "
                         f"{outcome['slow_connection_held_max_s']} s; dropped by the "
                         f"dispatcher {run['connections_dropped']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.anonymous_load",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"the smaller size: {QUICK.rate:g} jobs/s for {QUICK.seconds:g} s, "
                        f"{QUICK.tokens} tokens, {QUICK.slow} slow connections (default: "
                        f"{FULL.rate:g} jobs/s for {FULL.seconds:g} s, {FULL.tokens} tokens, "
                        f"{FULL.slow} slow connections)")
    parser.add_argument("--state-dir", type=Path,
                        help="clusters already running there (python -m clusters up "
                        "--workers 1 or more), left running; default: new ones, removed")
    parser.add_argument("--output", type=Path, help="also write the figures there (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    size = QUICK if args.quick else FULL
    logs = Path(tempfile.mkdtemp(prefix="bench-anonymous-load-"))
    state = args.state_dir or logs / "clusters"
    env = BenchClusters(state, workers=1, log_dir=logs, reuse=args.state_dir is not None)
    try:
        log.info("clusters (%s) ...", state)
        env.up()
        result = measure(env, size)
    finally:
        env.close()
    print(render(result))
    print(f"(dispatcher logs in {logs})")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
