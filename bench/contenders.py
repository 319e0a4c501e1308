"""The four ways of dispatching TrainJobs the comparison runs on the same Kueue clusters,
with the same jobs: how each is switched on and how a job is submitted to it.

* A: Kueue MultiKueue with its AllAtOnce dispatcher (every worker gets a copy; the first
  to admit keeps it);
* B: Kueue MultiKueue with its Incremental dispatcher (a few workers first, more later);
* C: Kueue MultiKueue with this project as its external dispatcher (``--mode kueue``):
  Kueue reserves quota, copies and syncs; this dispatcher names the worker;
* D: this dispatcher on its own (standalone), beside the same Kueue, which leaves its jobs
  alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import constrained
from bench.environment import STANDALONE_ORIGIN, BenchClusters
from clusters import kueue, kueue_queues
from trainjob import constants as c

# The dispatcherName the manager's Kueue waits for in C, and this dispatcher's name there.
EXTERNAL_DISPATCHER = "trainjob-dispatcher.io/capacity"


@dataclass(frozen=True)
class Contender:
    key: str
    title: str
    # The manager Kueue's multiKueue.dispatcherName; None: whichever it runs with (D's jobs
    # are not Kueue's, so its dispatcher does not matter).
    kueue_dispatcher: str | None
    # This dispatcher's --mode, or None when none of ours runs.
    mode: str | None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The job kinds this contender dispatches: behind Kueue, whatever Kueue's
        integrations queue (the benchmark's mix: TrainJobs and batch Jobs); standalone,
        TrainJobs only (a batch Job given ``managedBy: kueue.x-k8s.io/multikueue`` would
        stay on the manager, which runs no job controller, and nothing would copy it)."""
        if self.mode == "standalone":
            return (constrained.TRAINJOB,)
        return constrained.KINDS

    def submit(self, body: dict) -> dict:
        """The job (a TrainJob, or with Kueue a batch Job) as a user of this contender
        writes it."""
        if self.mode == "standalone":
            body["spec"]["managedBy"] = c.MANAGED_BY_MULTIKUEUE
            return body
        # Kueue's users name a LocalQueue; Kueue sets managedBy itself (on a batch Job
        # too: its webhook, for a queue whose ClusterQueue has the MultiKueue check).
        body["spec"].pop("managedBy", None)
        body["metadata"].setdefault("labels", {})[
            kueue_queues.QUEUE_NAME_LABEL] = kueue_queues.LOCAL_QUEUE
        return body

    def dispatcher_args(self) -> tuple[str, ...]:
        if self.mode == "kueue":
            return ("--mode", "kueue", "--dispatcher-name", EXTERNAL_DISPATCHER)
        # Kueue on the manager labels its copies with origin multikueue; ours must differ.
        return ("--origin", STANDALONE_ORIGIN)


CONTENDERS = {
    "A": Contender("A", "Kueue AllAtOnce", kueue.DISPATCHER_ALL_AT_ONCE, None),
    "B": Contender("B", "Kueue Incremental", kueue.DISPATCHER_INCREMENTAL, None),
    "C": Contender("C", "Kueue + this dispatcher (--mode kueue)", EXTERNAL_DISPATCHER,
                   "kueue"),
    "D": Contender("D", "this dispatcher standalone", None, "standalone"),
}


def engage(env: BenchClusters, contender: Contender, workers: list[str],
           placement_policy: str, extra_args: tuple[str, ...] = ()) -> None:
    """Switch the clusters to ``contender``: the manager's Kueue restarted with its
    dispatcherName when that changes, and this dispatcher started in its mode, if any
    (with ``extra_args`` too)."""
    env.stop_dispatcher()
    if contender.kueue_dispatcher is not None:
        env.use_kueue_dispatcher(contender.kueue_dispatcher)
    if contender.mode is not None:
        env.start_dispatcher(workers, placement_policy,
                             (*contender.dispatcher_args(), *extra_args))
