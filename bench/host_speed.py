"""How fast the machine's CPU is during a run: a fixed piece of single-threaded work,
timed in CPU time.

The benchmark's targets are absolute (milliseconds, CPU milliseconds per job), and on a
shared host the same code can cost a third more CPU in one hour than in the next with no
time stolen by the hypervisor (slower clocks, caches shared with other tenants). CPU time
does not count the turns other processes take on the cores, but it grows when each cycle
does less. It is measured while the run's clusters are down, so what it shows is mostly
the host, not this machine's own load (a busy core sibling or a shared cache still count),
and two runs' figures are read in its light. The work is what the dispatcher does most per
job: encode and decode a TrainJob-sized object, copy and compare dicts, format strings.

Such a host also changes speed within a run: for a few seconds at a time, every ten
seconds to a minute, the same work takes 60-75 % longer. So during the dispatcher's
scenarios a probe (``python -m bench.host_speed``, its own process, so that it takes no
turn of the benchmark's interpreter lock) times a small slice of the work twice a second,
and each CPU window (``bench.footprint.CpuAccount``) reports the share of its readings
when the host was slow: more than ``SLOW`` times the fastest reading so far.

That work keeps a few small objects in a core's own caches, and runs seen 25 % dearer in
every process group showed no slowdown in it: the clusters' processes walk far more
memory, and a host whose other tenants take the shared cache slows them alone. So each
reading also reads bytes at random places in a buffer larger than a core's own cache
(``cache_reader``): a few tens of nanoseconds each while the shared cache holds the
buffer, up to the memory's latency when other tenants take the cache or the memory bus.
Each CPU window reports the median nanoseconds per read (``host_cache_read_ns``).
"""

from __future__ import annotations

import contextlib
import operator
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from clusters.processes import spawn, terminate

ROUNDS = 4000
REPEATS = 5
# The probe: a slice of the work (about 1.3 ms of CPU on a fast host) every half second.
PROBE_ROUNDS = 200
PROBE_INTERVAL = 0.5
SLOW = 1.3
# The random reads: a 4 MiB buffer (past the 0.5-2 MiB a core keeps to itself, inside a
# shared cache of 16-32 MiB, which it evicts little of), one byte in a random 64-byte line
# at a time; a strided walk would be the prefetcher's, not the cache's.
READ_BUFFER = 4 * 2**20
LINE = 64
READS = 50_000


def _object(index: int) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": f"job-{index:05d}", "namespace": "reference",
                     "labels": {"team": "reference", "index": str(index)},
                     "annotations": {"placed-on": f"worker-{index % 4}"}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "managedBy": "reference",
                 "trainer": {"numNodes": 2, "args": [f"--step={i}" for i in range(8)],
                             "resourcesPerNode": {"requests": {"cpu": "2", "memory": "4Gi"}}}},
        "status": {"conditions": [{"type": t, "status": "False", "reason": "Reference"}
                                  for t in ("Created", "Suspended", "Complete", "Failed")]},
    }


def reference_work(rounds: int = ROUNDS) -> int:
    """The work, returning a checksum so that none of it is optimised away."""
    total = 0
    for index in range(rounds):
        decoded = orjson.loads(orjson.dumps(_object(index)))
        copied = {**decoded, "metadata": {**decoded["metadata"], "resourceVersion": str(index)}}
        total += len(f"{copied['metadata']['namespace']}/{copied['metadata']['name']}")
        total += copied != decoded
    return total


def reference_ms(repeats: int = REPEATS) -> float:
    """CPU milliseconds of ``reference_work``, the least of ``repeats`` (the least is the
    host's speed; the others add whatever interrupted the thread)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        reference_work()
        best = min(best, time.thread_time() - started)
    return round(best * 1000, 2)


def cache_reader(size: int = READ_BUFFER, reads: int = READS) -> Callable[[], float]:
    """A timer of ``reads`` reads of one byte at random lines of a ``size``-byte buffer,
    returning CPU nanoseconds per read (the reads run in C, one ``itemgetter`` call: the
    time is the memory's more than the interpreter's)."""
    buffer = bytearray(size)
    places = random.Random(0)
    read = operator.itemgetter(*(places.randrange(0, size, LINE) for _ in range(reads)))

    def timed() -> float:
        started = time.thread_time()
        read(buffer)
        return (time.thread_time() - started) * 1e9 / reads
    return timed


def probe(path: Path, interval: float = PROBE_INTERVAL) -> None:
    """The probe's loop: one line per reading appended to ``path``: wall time, CPU ms of
    the slice, 1 if slow (over ``SLOW`` times the fastest reading so far) else 0, CPU ns
    per read of the cache reads."""
    fastest = float("inf")
    pace = threading.Event()
    cache_read = cache_reader()
    with path.open("a") as out:
        while True:
            started = time.thread_time()
            reference_work(PROBE_ROUNDS)
            ms = (time.thread_time() - started) * 1000
            fastest = min(fastest, ms)
            read_ns = cache_read()
            out.write(f"{time.time():.3f} {ms:.3f} {int(ms > SLOW * fastest)} {read_ns:.1f}\n")
            out.flush()
            pace.wait(interval)  # a sampling period, not a wait for something


class Probe:
    """The probe process while ``running``; ``seen_between(since, until)`` reads its file."""

    current: Probe | None = None

    def __init__(self, path: Path):
        self.path = path
        self.pid: int | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[Probe]:
        """Start the probe (tied to this process: it ends with it) and make it the one CPU
        windows read; stop it on the way out."""
        self.path.write_text("")
        self.pid = spawn([sys.executable, "-m", "bench.host_speed", str(self.path)],
                         self.path.with_suffix(".log"), tied_to_parent=True)
        Probe.current = self
        try:
            yield self
        finally:
            Probe.current = None
            terminate(self.pid, self.path.parent, grace=5.0)

    def readings(self, since: float, until: float) -> list[Reading]:
        """The readings taken between the wall times ``since`` and ``until``."""
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) in (3, 4) and since <= float(parts[0]) <= until:
                out.append(Reading(float(parts[1]), parts[2] == "1",
                                   float(parts[3]) if len(parts) == 4 else None))
        return out


class Reading(NamedTuple):
    ms: float  # CPU ms of the slice of reference work
    slow: bool  # over ``SLOW`` times the fastest slice so far
    read_ns: float | None  # CPU ns per cache read (None: a probe before it read any)


@dataclass(frozen=True)
class HostReadings:
    """What the probe saw in a window."""

    slow_share: float
    readings: int
    cache_read_ns: float | None  # the cache reads' median


def seen_between(since: float, until: float) -> HostReadings | None:
    """The running probe's readings between ``since`` and ``until`` (wall times): the
    share when the host was slow, how many there were, the cache reads' median; None
    without a probe or a reading."""
    if Probe.current is None:
        return None
    readings = Probe.current.readings(since, until)
    if not readings:
        return None
    reads = [r.read_ns for r in readings if r.read_ns is not None]
    return HostReadings(sum(r.slow for r in readings) / len(readings), len(readings),
                        round(statistics.median(reads), 1) if reads else None)


if __name__ == "__main__":
    probe(Path(sys.argv[1]))
