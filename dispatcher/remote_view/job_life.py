"""A job's life on its worker for the dashboard: its Pods, its Events and the last lines of
a Pod's log, read with the remote view's own code (``copies`` finds the copy,
``worker_reads`` reads the worker, ``items`` shapes Pods and Events), so the dashboard and
the aggregated API say the same thing about a job.

Every read goes to a worker's apiserver, so each is bounded: only one job at a time (the
one asked about, never the whole list), at most ``max_reads`` such reads and
``max_log_reads`` log reads at once (beyond: 429 with the reason), each request within
``worker_reads``' timeouts, a log read within ``LOG_DEADLINE_SECONDS``, and at most the
last ``LOG_BYTES`` of at most ``MAX_TAIL_LINES`` lines returned."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from dispatcher.remote_view import items
from dispatcher.remote_view.copies import Copy, CopyLocator, CopyProblem, Keeping
from dispatcher.remote_view.worker_reads import WorkerAnswer, WorkerReads
from dispatcher.workers.cluster import WorkerCluster

DEFAULT_TAIL_LINES = 100
MAX_TAIL_LINES = 1000
# What is returned of a log: its last 64 KiB, from a line's start. The worker is asked for
# at most LOG_READ_BYTES (its limitBytes), so a log of long lines still ends where it ends.
LOG_BYTES = 64 * 1024
LOG_READ_BYTES = 1024 * 1024
LOG_CHUNK = 64 * 1024
# A worker that sends nothing for this long ends a log read (its read timeout), and a
# log read ends after this long whatever comes (the rest is said to be cut).
LOG_IDLE_SECONDS = 10.0
LOG_DEADLINE_SECONDS = 15.0
MAX_LOG_READS = 4
MAX_READS = 8
# The newest Events of a job shown; the count of older ones is said.
MAX_EVENTS = 200


class LifeProblem(Exception):
    """Nothing to show: ``code`` as HTTP says it (404 no such job or Pod, 429 too many
    reads at once, 503/504 the worker cannot be reached or did not answer, or the worker's
    own refusal), the message naming the job, Pod or worker and why."""

    def __init__(self, code: int, message: str, name: str = "", kind: str = ""):
        super().__init__(message)
        self.code, self.name, self.kind = code, name, kind


class JobLife:
    """``job(namespace, name)``: the job's Pods and Events on its worker.
    ``log(namespace, name, pod, container, tail_lines)``: the end of one of its Pods' log."""

    def __init__(self, trainjob: Callable[[str, str], dict | None],
                 trainjobs: Callable[[], list[dict]],
                 workers: Callable[[], list[WorkerCluster]], *,
                 max_reads: int = MAX_READS, max_log_reads: int = MAX_LOG_READS,
                 keeping: Keeping | None = None):
        self.locator = CopyLocator(trainjob, trainjobs, workers, keeping)
        # Clients of the dashboard's own (a pool and timeouts each): the remote view's
        # are sized for its streams, the reconciles' never carry a read for a person.
        self.reads = WorkerReads(LOG_IDLE_SECONDS)
        self.max_reads, self.max_log_reads = max_reads, max_log_reads
        self._reads = threading.BoundedSemaphore(max_reads)
        self._log_reads = threading.BoundedSemaphore(max_log_reads)

    def close(self) -> None:
        self.reads.close()

    def _copy(self, namespace: str, name: str) -> Copy:
        try:
            return self.locator.find(namespace, name)
        except CopyProblem as problem:
            raise LifeProblem(problem.code, str(problem), name, "TrainJob") from None

    def job(self, namespace: str, name: str) -> dict:
        """The copy's worker, its Pods (TrainJobPods, by name) and the newest of its
        Events (TrainJobEvents, oldest first)."""
        if not self._reads.acquire(blocking=False):
            raise LifeProblem(429, f"TrainJob {namespace}/{name}: {self.max_reads} reads "
                                   "of jobs on their workers are under way already, the "
                                   "most the dashboard makes at once; retry in a moment",
                              name, "TrainJob")
        try:
            copy = self._copy(namespace, name)
            worker = copy.worker.name
            try:
                pods = self.reads.pods(copy)
                events = self.reads.events(copy)
            except WorkerAnswer as answer:
                raise LifeProblem(answer.code, str(answer), name, "TrainJob") from None
        finally:
            self._reads.release()
        found = sorted((items.event_item(event, name, worker) for event in events),
                       key=lambda e: _when(e["lastTimestamp"]))
        return {"namespace": namespace, "name": name, "worker": worker,
                "pods": sorted((items.pod_item(pod, name, worker) for pod in pods),
                               key=lambda p: p["metadata"]["name"]),
                "events": found[-MAX_EVENTS:],
                "eventsOmitted": max(0, len(found) - MAX_EVENTS)}

    def log(self, namespace: str, name: str, pod: str, container: str | None,
            tail_lines: int = DEFAULT_TAIL_LINES) -> dict:
        """The last ``tail_lines`` lines of ``pod``'s log (of ``container``; the Pod's only
        one when None), at most the last LOG_BYTES of them; ``truncated`` when less than
        asked was returned. Only a Pod of the job's copy is read."""
        if not self._log_reads.acquire(blocking=False):
            raise LifeProblem(429, f"Pod {namespace}/{pod}: {self.max_log_reads} logs are "
                                   "being read for the dashboard already, the most it reads "
                                   "at once; retry in a moment", pod, "Pod")
        try:
            copy = self._copy(namespace, name)
            options: dict[str, object] = {"tailLines": tail_lines,
                                          "limitBytes": LOG_READ_BYTES}
            if container:
                options["container"] = container
            try:
                if not self.reads.pods(copy, pod):
                    raise LifeProblem(404, f"Pod {namespace}/{pod}: not one of the Pods of "
                                           f"TrainJob {copy.key} on worker "
                                           f"{copy.worker.name}", pod, "Pod")
                upstream = self.reads.open_log(copy, pod, options)
            except WorkerAnswer as answer:
                raise LifeProblem(answer.code, str(answer), pod, "Pod") from None
            try:
                text, truncated = last_bytes(upstream, LOG_BYTES,
                                             time.monotonic() + LOG_DEADLINE_SECONDS)
            finally:
                try:
                    upstream.release_conn()
                except Exception:  # noqa: BLE001 - best effort: the read is over either way
                    pass
        finally:
            self._log_reads.release()
        return {"namespace": namespace, "name": name, "worker": copy.worker.name,
                "pod": pod, "container": container or "", "tailLines": tail_lines,
                "text": text, "truncated": truncated}


def _when(stamp: str | None) -> datetime:
    """An Event's time, to order by: a lastTimestamp is whole seconds, an eventTime has
    microseconds, so their texts do not sort as their times do."""
    try:
        return datetime.fromisoformat(stamp) if stamp else datetime.min.replace(tzinfo=UTC)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


def last_bytes(stream, keep: int, deadline: float) -> tuple[str, bool]:
    """The end of ``stream`` (``read1``-able) up to ``keep`` bytes, begun at a line's
    start, and whether anything was left out: cut here, cut by the worker at
    LOG_READ_BYTES, or not read by ``deadline`` (then what came so far)."""
    kept, total, cut = bytearray(), 0, False
    while True:
        if time.monotonic() >= deadline:
            cut = True
            break
        try:
            data = stream.read1(LOG_CHUNK)
        except Exception:  # noqa: BLE001 - the worker went silent: what came is shown
            cut = True
            break
        if not data:
            break
        total += len(data)
        kept += data
        if len(kept) > keep:
            del kept[:len(kept) - keep]
            cut = True
    if cut and total > len(kept):
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:
            del kept[:newline + 1]
    return kept.decode(errors="replace"), cut or total >= LOG_READ_BYTES
