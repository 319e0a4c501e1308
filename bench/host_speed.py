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
"""

from __future__ import annotations

import time

import orjson

ROUNDS = 4000
REPEATS = 5


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
