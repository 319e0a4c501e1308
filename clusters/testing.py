"""Test helpers that go with the harness: waiting on a condition with a useful failure,
and running the project's own commands as real processes."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from clusters import processes
from clusters.controlplane import free_port

# The tests and the bench smoke tests read the machine's load from here too.
from clusters.machine_load import (  # noqa: F401
    MOST_STRETCH,
    MOST_WAIT_STRETCH,
    Deadline,
    load_stretch,
    machine_load,
    stretched,
)

T = TypeVar("T")


class ConditionTimeout(AssertionError):
    """Raised by ``eventually``; its message says what was expected and what was last seen."""


class ProcessExited(AssertionError):
    """A process that was waited on has exited: no use waiting any longer."""


def eventually(
    observe: Callable[[], T],
    check: Callable[[T], bool],
    *,
    expected: str,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> T:
    """Call ``observe()`` until ``check`` accepts its result; return that result.

    ``timeout`` is what an idle machine needs; when it has passed on a busy one, the wait
    goes on for as long as the load stretches it (``Deadline``: the load average per CPU,
    at most ``MOST_WAIT_STRETCH`` times): what it waits for must come, so a longer ceiling
    costs nothing when it does. On timeout, fail with ``expected``, how long it waited, the
    machine's load and the last observation (or the last exception ``observe`` raised), so a
    red test explains itself. ``observe`` raising ``ProcessExited`` ends the wait at once.
    """
    deadline = Deadline(timeout)
    last: object = "nothing observed"
    while True:
        try:
            value = observe()
            if check(value):
                return value
            last = value
        except ProcessExited:
            raise
        except Exception as err:  # noqa: BLE001 - the last error is part of the report
            last = f"{type(err).__name__}: {err}"
        if deadline.passed():
            raise ConditionTimeout(
                f"expected {expected} within {deadline.waited()}; last seen: {last!r}")
        time.sleep(interval)


def plain_get(port: int, path: str, host: str = "127.0.0.1",
              timeout: float = 5, ca: Path | None = None) -> tuple[int, str]:
    """GET ``path`` from ``host:port``: the status and the body. Plain HTTP, or HTTPS
    verified against ``ca`` when it is given."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout) if ca is None else \
        http.client.HTTPSConnection(host, port, timeout=timeout,
                                    context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def run_pytest_session(directory: Path, *args: str,
                       timeout: float = 300) -> subprocess.CompletedProcess:
    """A pytest session of its own in ``directory`` (its conftest, its tests), with no ini
    file and no cache, for tests of the project's pytest plugins; ``args`` add the options
    and paths. Run from an xdist worker of the outer session, the inner one would take
    itself for a worker (``PYTEST_XDIST_WORKER``), so those variables are left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null",
         "--rootdir", str(directory), *args],
        cwd=directory, capture_output=True, text=True, timeout=timeout, env=env)


def ipv6_loopback() -> bool:
    """Whether this machine can listen on the IPv6 loopback address."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def holds_for(
    observe: Callable[[], T],
    check: Callable[[T], bool] = lambda _: True,
    *,
    seconds: float,
    expected: str = "the condition to hold",
    interval: float = 0.2,
    stretch: bool = False,
) -> int:
    """Observe every ``interval`` seconds for ``seconds``; every observation must pass
    ``check`` (``observe`` may also assert by itself). The counterpart of ``eventually``
    for "nothing happens": a window of observations, not one glance. With ``stretch`` the
    window is as much longer on a busy machine as the load stretches it (``load_stretch``):
    what would happen within ``seconds`` on an idle one comes later there. Not by default:
    most windows end before the product's next step on time (a job that runs to its end,
    a summary a minute on), which a longer window would wrongly see. Returns how many
    observations were made."""
    started = time.monotonic()
    window = stretched(seconds) if stretch else seconds
    observations = 0
    while True:
        value = observe()
        observations += 1
        elapsed = time.monotonic() - started
        assert check(value), (f"expected {expected} throughout {window:.1f}s; observation "
                              f"{observations} at {elapsed:.1f}s saw: {value!r} "
                              f"({machine_load()})")
        if elapsed >= window:
            return observations
        time.sleep(interval)


# What a controller logs before it ends itself for having lost its Lease (controller_kit.leader):
# the one exit its supervisor is there to undo.
LOST_LEADERSHIP = "lost leadership: stopping"
# What it logs once it has started (controller_kit.service): a process started again that ends
# before this line found its cluster still away.
STARTED = " running; metrics on "
# Starts again while the cluster whose outage cost the Lease is still away, a second apart.
RESTARTS_WHILE_AWAY = 60


class ServiceProcess:
    """A project command (``python -m <module> run ...``) as a separate process, tied to
    the test process (PDEATHSIG), ready once its /readyz answers 200 ok.

    ``supervised``: when it ends itself for having lost its Lease, start it again, as the
    Deployment that runs it would (a loaded machine can stall a short Lease's renewal, an
    apiserver restart does). Started again, it may find that apiserver still away and end
    before it has started: it is started again a second later, up to
    ``RESTARTS_WHILE_AWAY`` times. Any other exit stays for the tests to see."""

    def __init__(self, module: str, kubeconfig: Path, log_file: Path,
                 extra_args: tuple[str, ...], supervised: bool = False):
        self.module = module
        self.kubeconfig = kubeconfig
        self.log_file = log_file
        self.extra_args = extra_args
        self.supervised = supervised
        self.metrics_port = free_port()
        # Where /readyz answers: beside /metrics unless the probes have a port of their own.
        self.probe_port = (int(extra_args[extra_args.index("--health-probe-port") + 1])
                           if "--health-probe-port" in extra_args else self.metrics_port)
        self.proc: subprocess.Popen | None = None
        # Restarts after a lost Lease, by the supervision; whether the running process is
        # one it started, and how many it started since the last lost Lease that ended
        # before they had started.
        self.lease_restarts = 0
        self._relaunched = False
        self._away = 0
        self._stopping = threading.Event()
        self._launching = threading.Lock()
        self._log_start = 0

    def start(self) -> ServiceProcess:
        self._stopping.clear()
        self._relaunched, self._away = False, 0
        self._launch()
        eventually(self.readyz, lambda answer: answer[0] == 200,
                   expected=f"{self.module} /readyz to answer 200 (log: {self.log_file})",
                   timeout=60)
        if self.supervised:
            threading.Thread(target=self._supervise, args=(self.proc,), daemon=True,
                             name=f"supervise-{self.module}").start()
        return self

    def _launch(self) -> None:
        argv = [sys.executable, "-m", self.module, "run",
                "--kubeconfig", str(self.kubeconfig),
                "--metrics-port", str(self.metrics_port), *self.extra_args]
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=processes.die_with_parent)

    def _supervise(self, proc: subprocess.Popen) -> None:
        while True:
            proc.wait()
            with self._launching:
                if self._stopping.is_set() or proc is not self.proc:
                    return
                reason = self._restart_reason()
                if reason is None:
                    return
                why, pause = reason
                self._away = self._away + 1 if pause else 0
                with open(self.log_file, "a") as log:
                    log.write(f"(supervision: exit code {proc.returncode} {why}; starting "
                              "again)\n")
            if self._stopping.wait(pause):
                return
            with self._launching:
                if self._stopping.is_set():
                    return
                self._launch()
                if not self._away:
                    self.lease_restarts += 1
                proc, self._relaunched = self.proc, True

    def _restart_reason(self) -> tuple[str, float] | None:
        """Why the supervision starts the process that ended again, and after what pause;
        None when it does not. Called with ``_launching`` held."""
        seen = self._logged_since_launch()
        if LOST_LEADERSHIP.encode() in seen:
            return "after a lost Lease", 0.0
        if self._relaunched and STARTED.encode() not in seen \
                and self._away < RESTARTS_WHILE_AWAY:
            return "before it started, after a lost Lease", 1.0
        return None

    def started(self) -> bool:
        """Whether the running process has logged that it started: ready, and done with
        what it does once at its start (the first full collection of its caches)."""
        return STARTED.encode() in self._logged_since_launch()

    def _logged_since_launch(self) -> bytes:
        """What the running process (the last one launched) has logged."""
        with open(self.log_file, "rb") as log:
            log.seek(self._log_start)
            return log.read()

    def readyz(self) -> tuple[int, str]:
        if self.proc is not None and self.proc.poll() is not None:
            if self.supervised and not self._stopping.is_set():
                with self._launching:
                    if self._restart_reason() is not None:
                        return 0, "ended; its supervision starts it again"
            raise ProcessExited(
                f"{self.module} exited with {self.proc.returncode}:\n{self.log_tail()}")
        return self.get("/readyz", self.probe_port)

    def get(self, path: str, port: int | None = None) -> tuple[int, str]:
        """GET ``path`` over plain HTTP on loopback, from the metrics port by default."""
        return plain_get(port or self.metrics_port, path)

    def metric(self, metric: str, /, **labels: str) -> float:
        """Sum of a metric's samples from the process's /metrics: every label set, or
        those that have ``labels`` (``name`` among them: the sample name is positional)."""
        _, text = self.get("/metrics")
        return sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples
                   if sample.name == metric
                   and all(sample.labels.get(key) == value for key, value in labels.items()))

    def stop(self, kill: bool = False) -> None:
        with self._launching:
            self._stopping.set()
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            # An orderly stop must come (tests check its exit code): 15 s when idle, as much
            # longer as a busy machine's load says.
            waited = 15 * load_stretch(MOST_WAIT_STRETCH)
            self.proc.wait(waited)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            # In its log, beside the stacks it wrote meanwhile: why it ends there.
            with open(self.log_file, "a") as log:
                log.write(f"(harness: still running {waited:.0f} s after SIGTERM; killed)\n")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


# apiserver_request_total counts requests by verb; kube-apiserver 1.34 reports server-side
# apply as "APPLY" (a plain merge patch is "PATCH"). DELETE is left out by default: the
# namespace controller and the garbage collector delete what earlier tests left behind.
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY")


def apiserver_samples(control_plane, *families: str) -> list:
    """The samples of the named metric families from a cluster's apiserver ``/metrics``."""
    status, text = control_plane.get("/metrics", timeout=10)
    if status != 200:
        raise AssertionError(f"expected apiserver /metrics to answer 200; saw {status}: "
                             f"{text[:200]}")
    # Only a few families are wanted; parsing the whole exposition (megabytes) is slow.
    wanted = "\n".join(line for line in text.splitlines()
                       if line.startswith(families) and not line.startswith("#"))
    return [sample for family in text_string_to_metric_families(wanted + "\n")
            for sample in family.samples]


def request_counts(control_plane) -> Counter:
    """Requests a cluster's apiserver has served so far, from its own /metrics
    (``apiserver_request_total``), by (group, resource, subresource, verb)."""
    counts: Counter = Counter()
    for sample in apiserver_samples(control_plane, "apiserver_request_total{"):
        if sample.name != "apiserver_request_total":
            continue
        labels = sample.labels
        counts[(labels.get("group", ""), labels.get("resource", ""),
                labels.get("subresource", ""), labels["verb"])] += int(sample.value)
    return counts


AUDITED_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def audited_requests(cluster, user_agent: str) -> list[dict]:
    """The cluster's apiserver audit log records (clusters running Kueue keep one) from
    clients whose User-Agent starts with ``user_agent``: one
    ``{verb, resource, subresource, namespace, name, code}`` per request, once it has
    started answering (a watch that is still open counts)."""
    path = cluster.control_plane.audit_log
    found: dict[str, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line the apiserver is still writing
        if not (record.get("userAgent") or "").startswith(user_agent):
            continue
        ref = record.get("objectRef") or {}
        found[record.get("auditID") or line] = {
            "verb": record.get("verb"), "resource": ref.get("resource"),
            "subresource": ref.get("subresource", ""), "namespace": ref.get("namespace", ""),
            "name": ref.get("name", ""), "code": (record.get("responseStatus") or {}).get("code")}
    return list(found.values())


def audited_writes(cluster, user_agent: str) -> list[dict]:
    """``audited_requests`` that write."""
    return [r for r in audited_requests(cluster, user_agent) if r["verb"] in AUDITED_WRITE_VERBS]


def apiserver_writes(cluster, resources: set[tuple[str, str]],
                     verbs: tuple[str, ...] = WRITE_VERBS) -> Counter:
    """Write requests the cluster's apiserver has served so far to the (group, resource)
    pairs in ``resources``, by (resource, subresource, verb), from its own /metrics."""
    counts: Counter = Counter()
    for (group, resource, subresource, verb), n in request_counts(
            cluster.control_plane).items():
        if verb in verbs and (group, resource) in resources:
            counts[(resource, subresource, verb)] += n
    return counts
