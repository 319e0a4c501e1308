"""Where a TrainJob's worker is chosen: eligibility, the job's needs on each worker, each
worker's room (Node room, pod-by-pod packing, Kueue quota), then the one choice
(``chooser.place_trainjob``) with the reservation made in the same step.

A reservation keeps a placed job's footprint counted on its worker until its pods show up
(``WorkerCapacity`` then counts the pods instead). The Placer owns the one writer of
reservations and Kueue quota holds (``reservations.Reservations``, its ``reservations``):
it reserves there when it places, re-makes reservations from the footprint recorded on
each copy (so they survive a restart of the dispatcher), and drops them when the job no
longer needs the room; Kueue mode's nominator holds and releases through the same object.
Nothing writes them another way.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from decimal import Decimal

from cachetools import LRUCache
from kubernetes.utils.quantity import parse_quantity

from dispatcher.placement import cluster_selector, footprint
from dispatcher.placement.chooser import describe_reasons, place_trainjob, shortfalls
from dispatcher.placement.need import Need
from dispatcher.placement.policy import POLICIES, Candidate
from dispatcher.placement.reservations import Reservations
from dispatcher.room.capacity import WARM_WAIT_SECONDS
from dispatcher.workers.cluster import WorkerCluster
from dispatcher.workers.registry import WorkerRegistry
from trainjob import conditions, runtime_ref
from trainjob import constants as c
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info

# The informer cache on a worker that holds each kind of runtime.
_RUNTIME_RESOURCES = {c.TRAININGRUNTIME_KIND: c.TRAININGRUNTIMES,
                      c.CLUSTERTRAININGRUNTIME_KIND: c.CLUSTERTRAININGRUNTIMES}

log = logging.getLogger(__name__)

JobKey = tuple[str, str]
# Jobs waiting to be warmed ahead (``Placer.warm_ahead``): beyond these the oldest are
# dropped (a burst at a start lists every job; their placements warm what they need).
WARM_AHEAD_QUEUED = 64


NeedOf = Callable[[WorkerCluster], tuple[str | None, Need | None]]


class Placer:
    def __init__(self, registry: WorkerRegistry, policy: str):
        self.registry = registry
        self.policy = POLICIES[policy]
        self.reservations = Reservations(registry)
        # Workers that are not candidates for a job, and why: a same-named TrainJob that is
        # not our copy is there (never touched; for good: generation None), or the worker's
        # apiserver refused the copy (until the job's spec changes: its generation). In
        # memory only: after a restart such a worker may be chosen once more, and the same
        # refusal or same-named object excludes it again.
        self.excluded: dict[JobKey, dict[str, tuple[int | None, str]]] = {}
        # A job's need on a runtime, by (job content digest, runtime digest): building it
        # is most of a placement's CPU; workers usually hold the same runtime, and jobs
        # are often made from one template (a sweep, a benchmark), so one build serves
        # them all, and a retried placement.
        self._needs: LRUCache = LRUCache(maxsize=4096)
        # Runtime digests by (worker, runtime uid, runtime resourceVersion).
        self._digests: LRUCache = LRUCache(maxsize=1024)
        self._cache_lock = threading.Lock()
        # Jobs seen and not yet warmed ahead (each with how to warm it), whether a thread
        # is warming them, and the last thread started (all under ``_cache_lock``).
        self._ahead: collections.deque[tuple[JobKey, Callable[[], None]]] = \
            collections.deque(maxlen=WARM_AHEAD_QUEUED)
        self._warming_ahead = False
        self._warmer: threading.Thread | None = None
        # The job the warming thread works on now, and what its end is told by: a
        # placement of that job waits for it (``_own_warming``) rather than scoring the
        # same Nodes beside it.
        self._warming_job: JobKey | None = None
        self._warmed_one = threading.Condition(self._cache_lock)

    # --- warming ahead -----------------------------------------------------------------

    def warm_ahead(self, raw: dict) -> None:
        """Work out the job's needs and score each selected worker's Nodes for its pod
        shapes (``WorkerCapacity.warm``) on a thread of its own, as soon as the job is
        seen: its placement then finds its need known and its heaps warm (or waits for
        the ones being scored, holding nothing), and the first job of a shape costs its
        placement no more than the rest. Returns at once; the thread ends when no job is
        left queued."""
        meta = raw["metadata"]
        key = (meta.get("namespace") or "", meta["name"])

        def warm() -> None:
            content = content_digest(raw)
            self._warm(cluster_selector.selector_of(meta.get("annotations")),
                       lambda worker: self.need_on(raw, worker, content))
        self._queue_warming(key, warm)

    def warm_need_ahead(self, key: JobKey,
                        sized: Callable[[], tuple[Need | str | None, str | None]]) -> None:
        """``warm_ahead`` for a job whose need is known without a runtime, the same on
        every worker (Kueue mode: a Workload's podSets, as ``place_need`` takes it).
        ``sized()``, called on the warming thread, gives the need (None, or a string
        saying why it cannot be sized: nothing to warm) and the job's cluster selector."""
        def warm() -> None:
            need, selector = sized()
            if isinstance(need, Need):
                self._warm(selector, self._known_need(key, need, {}))
        self._queue_warming(key, warm)

    def _queue_warming(self, key: JobKey, warm: Callable[[], None]) -> None:
        with self._cache_lock:
            self._ahead.append((key, warm))
            if self._warming_ahead:
                return
            self._warming_ahead = True
            self._warmer = thread = threading.Thread(
                target=self._warm_queued, name="placer-warm-ahead", daemon=True)
        thread.start()

    def threads(self) -> list[threading.Thread | None]:
        """The warming thread, while one runs or since the last one ended (its process's
        manager watches it: its ending is no death, its raising is)."""
        with self._cache_lock:
            return [self._warmer]

    def _warm_queued(self) -> None:
        while True:
            with self._cache_lock:
                if not self._ahead:
                    self._warming_ahead = False
                    return
                key, warm = self._ahead.popleft()
                self._warming_job = key
            try:
                warm()
            except Exception:  # its placement works it all out again and says what fails
                log.debug("warming ahead for %s/%s", *key, exc_info=True)
            finally:
                with self._cache_lock:
                    self._warming_job = None
                    self._warmed_one.notify_all()

    def _own_warming(self, key: JobKey) -> None:
        """Before a job's decision: its warming ahead, still queued, is dropped (the
        decision warms what it needs itself); one under way is waited for, at most
        ``WARM_WAIT_SECONDS``. The job's need and heaps are then ready, and the first job
        of a shape costs its decision no more than the rest even when its reconcile
        starts with its warming, from the same informer event."""
        with self._cache_lock:
            kept = [entry for entry in self._ahead if entry[0] != key]
            if len(kept) < len(self._ahead):
                self._ahead.clear()
                self._ahead.extend(kept)
            self._warmed_one.wait_for(lambda: self._warming_job != key,
                                      timeout=WARM_WAIT_SECONDS)

    def _warm(self, selector: str | None, need_of: NeedOf) -> None:
        """Score the pod shapes of the job's need on each worker its cluster selector
        selects and it is eligible on."""
        registered = {worker.name: worker for worker in self.registry.snapshot()}
        selected = cluster_selector.select(selector, registered,
                                           lambda name: self.registry.labels(name))
        if isinstance(selected, cluster_selector.Unplaceable):
            return
        for name in selected:
            _, need = need_of(registered[name])
            if need is not None:
                registered[name].capacity.warm(need.each_pod, need.node_selector,
                                               need.tolerations)

    # --- choosing ----------------------------------------------------------------------

    def place(self, raw: dict, skip: dict[str, str] | None = None,
              content: bytes | None = None) -> tuple[WorkerCluster, Need] | str:
        """Choose a worker and reserve the job's room there; or say why nothing fits.
        ``raw``: the TrainJob as the API returns it; the workers in ``skip`` are not
        candidates (the reason given is reported: the waiting line holds them);
        ``content``: its ``content_digest``, when the caller has it already."""
        key = (raw["metadata"].get("namespace") or "", raw["metadata"]["name"])
        content = content or content_digest(raw)  # the same for every worker: digested once
        skip = skip or {}
        return self._place(key, lambda worker: (skip[worker.name], None)
                           if worker.name in skip else self.need_on(raw, worker, content),
                           cluster_selector.selector_of(raw["metadata"].get("annotations")))

    def place_need(self, key: JobKey, need: Need, skip: dict[str, str],
                   selector: str | None = None) -> tuple[WorkerCluster, Need] | str:
        """``place`` for a job whose needs are known already (a Kueue Workload's podSets),
        the same on every worker; the workers in ``skip`` are not candidates (the reason
        given is reported), nor those ``selector`` (the job's cluster selector) leaves out."""
        return self._place(key, self._known_need(key, need, skip), selector)

    def _known_need(self, key: JobKey, need: Need, skip: dict[str, str]) -> NeedOf:
        """``need`` on every worker the job is eligible on and ``skip`` does not name."""
        def need_of(worker: WorkerCluster) -> tuple[str | None, Need | None]:
            problem = skip.get(worker.name) or self._ineligible(key, None, worker)
            return (problem, None) if problem else (None, need)
        return need_of

    def _place(self, key: JobKey, need_of: NeedOf,
               selector: str | None = None) -> tuple[WorkerCluster, Need] | str:
        self._own_warming(key)
        registered = {worker.name: worker for worker in self.registry.snapshot()}
        # Only the workers the job's cluster selector matches are candidates; one that
        # matches none, or does not parse, waits saying so (an ``Unplaceable`` reason).
        selected = cluster_selector.select(selector, registered,
                                           lambda name: self.registry.labels(name))
        if isinstance(selected, cluster_selector.Unplaceable):
            return selected
        workers = {name: worker for name, worker in registered.items() if name in selected}
        decision = self._decide(key, workers, need_of)
        left_out = sorted(registered.keys() - selected)
        if isinstance(decision, str) and left_out:
            return f"{decision}; not selected by cluster selector {selector!r}: " \
                   f"{', '.join(left_out)}"
        return decision

    def _decide(self, key: JobKey, workers: dict[str, WorkerCluster],
                need_of: NeedOf) -> tuple[WorkerCluster, Need] | str:
        # What the job needs on each worker depends on the job and that worker's runtime,
        # not on reservations: worked out before the ledgers are held, which only counting
        # room needs. Choose and reserve holding the ledgers of the workers whose room the
        # choice reads (those it is eligible on), and only those: concurrent placements
        # that read a common worker each see the other's reservation there, or a burst
        # piles onto one worker; those that read none in common do not wait on each other.
        asked = {name: need_of(worker) for name, worker in workers.items()}
        # The Nodes scored for a pod shape no kept heap serves yet, before the ledgers
        # and each worker's picture are held: the decision then only brings those heaps
        # up to date (``WorkerCapacity.warm``), and the first job of a shape holds them
        # no longer than the rest.
        for name, (_, need) in asked.items():
            if need is not None:
                workers[name].capacity.warm(need.each_pod, need.node_selector,
                                            need.tolerations)
        with self.reservations.deciding(name for name, (_, need) in asked.items()
                                        if need is not None):
            decision = self._choose(key, workers, asked)
            if isinstance(decision, str):
                return decision
            worker, need, plan = decision
            self.reservations.reserve(worker, key, need, plan)
        if plan and log.isEnabledFor(logging.DEBUG):
            log.debug("%s/%s pods expected on %s: %s", *key, worker.name,
                      {node: {r: str(a) for r, a in amounts.items()}
                       for node, amounts in plan.items()})
        return worker, need

    def _choose(self, key: JobKey, workers: dict[str, WorkerCluster],
                asked: dict[str, tuple[str | None, Need | None]]
                ) -> tuple[WorkerCluster, Need, dict | None] | str:
        """The worker for the job, its need there and where its pods were packed (the
        reservation's per-Node plan); or why nothing fits."""
        if not workers:
            return "no worker cluster is registered"
        candidates, needs, plans, unread = [], {}, {}, []
        # Workers with room in sum whose pods are not packed yet: packing is most of a
        # choice's CPU, so only the worker the policy picks is packed (then the next one
        # if its pods do not fit), unless quota is weighed too (Kueue mode: a pod that
        # fits on no Node is the reason given before the quota's).
        unpacked: dict[str, Candidate] = {}
        for worker in workers.values():
            problem, need = asked[worker.name]
            if need is None:
                candidates.append(Candidate(worker.name, worker.order, {}, problem))
                continue
            # Needs can differ per worker (each has its own copy of the runtime): each
            # worker is weighed against its own.
            needs[worker.name] = need
            free = worker.capacity.free(need.node_selector, need.tolerations)
            short = shortfalls(need.requests, need.pods, free)
            lazy = not short and (need.queue is None or worker.quota is None)
            if not short and not lazy:
                # Room in sum: each pod must also fit on one Node.
                problem = self._pack(worker, need, plans)
            if problem is None:
                problem, free, unknown = _quota_room(key, worker, need, free, short)
                if unknown:
                    unread.append(f"{worker.name}: {problem}")
            excluded_nodes = ""
            if problem is None and short:
                # Say which rule keeps Nodes out, not only what the rest lack.
                excluded_nodes = worker.capacity.excluded_by_rules(
                    need.node_selector, need.tolerations) or ""
            candidate = Candidate(worker.name, worker.order, free, problem,
                                  need.requests, need.pods, excluded_nodes)
            candidates.append(candidate)
            if lazy:
                unpacked[worker.name] = candidate
        while True:
            # Each eligible candidate carries its own need: no job-wide totals to give.
            placement = place_trainjob({}, 0, candidates, self.policy)
            chosen = placement.cluster
            if chosen not in unpacked:
                break
            unpacked.pop(chosen).problem = self._pack(workers[chosen], needs[chosen], plans)
            if chosen in plans:
                break
        if chosen is None:
            return describe_reasons(placement.reasons)
        if unread:
            # A worker whose Nodes have room and whose Kueue queues are still being read
            # may be the better fit: decide once they are read (moments after a start or a
            # reconnect; the end of that first list looks at waiting jobs again).
            return "; ".join(unread)
        log.debug("%s/%s candidates: %s", *key,
                  {cand.name: placement.reasons.get(cand.name) or {
                      k: str(v) for k, v in cand.free.items()} for cand in candidates})
        return workers[chosen], needs[chosen], plans.get(chosen)

    @staticmethod
    def _pack(worker: WorkerCluster, need: Need, plans: dict) -> str | None:
        """Pack the job's pods on the worker's Nodes: the plan goes into ``plans``, or
        the reason they do not all fit is returned."""
        plan = worker.capacity.pack(need.each_pod, need.node_selector, need.tolerations)
        if isinstance(plan, str):
            return plan
        plans[worker.name] = plan
        return None

    def need_on(self, raw: dict, worker: WorkerCluster,
                content: bytes | None = None) -> tuple[str | None, Need | None]:
        """(None, what the job ``raw`` needs there) when ``worker`` is eligible, else (why
        not, None). ``content``: the job's content digest, when the caller has it already."""
        meta = raw["metadata"]
        namespace, name = meta.get("namespace") or "", meta["name"]
        problem = self._ineligible((namespace, name), meta.get("generation"), worker)
        if problem:
            return problem, None
        try:
            key, runtime = runtime_ref.find((raw.get("spec") or {}).get("runtimeRef") or {},
                                            namespace,
                                            lambda kind, ns, name: worker.cache(
                                                _RUNTIME_RESOURCES[kind]).get(ns, name))
        except runtime_ref.UnsupportedRuntimeRef as refused:
            return str(refused), None
        if runtime is None:
            return f"{key} not found", None
        need_key = (content or content_digest(raw), self._digest(worker, runtime))
        with self._cache_lock:
            known = self._needs.get(need_key)
        if known is None:
            # The model only now: a job whose need is known is never validated again.
            known = _need(TrainJob.model_validate(raw), runtime)
            if not isinstance(known, str):
                # Only needs: a refusal may name the job, and it is rare anyway.
                with self._cache_lock:
                    self._needs[need_key] = known
        return (known, None) if isinstance(known, str) else (None, known)

    def _digest(self, worker: WorkerCluster, runtime: dict) -> str:
        """What identifies a runtime's content (the same on every worker that holds it)."""
        meta = runtime["metadata"]
        key = (worker.name, meta.get("uid"), meta.get("resourceVersion"))
        with self._cache_lock:
            digest = self._digests.get(key)
        if digest is None:
            content = json.dumps([meta.get("name"), meta.get("labels"),
                                  meta.get("annotations"), runtime.get("spec")],
                                 sort_keys=True, default=str)
            digest = hashlib.blake2b(content.encode(), digest_size=16).hexdigest()
            with self._cache_lock:
                self._digests[key] = digest
        return digest

    def _ineligible(self, key: JobKey, generation: int | None,
                    worker: WorkerCluster) -> str | None:
        """Why ``worker`` cannot take the job whatever it needs, or None."""
        if not worker.active:
            return f"not connected ({worker.reason}: {worker.message})"
        room_unknown = worker.room_unknown()
        if room_unknown:
            return room_unknown
        excluded_for, why = self.excluded.get(key, {}).get(worker.name, (0, ""))
        if why and excluded_for in (None, generation):
            return why
        worker_namespace = worker.cache("namespaces").get("", key[0])
        if worker_namespace is None:
            return f"namespace {key[0]} not found"
        if worker_namespace["metadata"].get("deletionTimestamp"):
            return f"namespace {key[0]} is being deleted"
        return None

    # --- reservations --------------------------------------------------------------------

    def release(self, worker: WorkerCluster | None, key: JobKey) -> bool:
        """The job no longer needs room on ``worker``; True when a reservation went."""
        return self.reservations.release(worker, key)

    def exclude(self, key: JobKey, worker: WorkerCluster, generation: int | None,
                why: str) -> None:
        """Take ``worker`` out of the job's candidates (``generation`` None: for good)."""
        self.excluded.setdefault(key, {})[worker.name] = (generation, why)
        self.release(worker, key)

    def follow_copy(self, worker_name: str, key: JobKey, kind: str,
                    copy: dict | None) -> bool:
        """Reservations follow the copies (the footprint recorded on each), so they
        survive a restart. True when this dropped one (room freed for waiting jobs)."""
        worker = self.registry.get(worker_name)
        if worker is None:
            return False
        if kind == "DELETED" or copy is None or conditions.finished(copy):
            return self.release(worker, key)
        recorded = footprint.read(copy)
        if recorded is None:
            # Not a copy this dispatcher made (Kueue's, in kueue mode): whoever placed the
            # job holds its room; the copy appearing says nothing about it.
            return False
        requests, pods = recorded
        self.reservations.restore(worker, key,
                                  {k: _quantity(v) for k, v in requests.items()}, pods)
        return False

    def forget(self, key: JobKey) -> None:
        self.excluded.pop(key, None)


# Every event of a copy carries its footprint as strings: copies of one template share
# them, and parsing a quantity costs more than the rest of following the copy.
_quantity = functools.lru_cache(maxsize=4096)(parse_quantity)


def content_digest(raw: dict) -> bytes:
    """What a job's need depends on: its spec, labels and annotations (not the placement
    annotation, which placing adds), as the API returned them. Not its name or namespace:
    they name pods and hosts but change no request, count, node selector or toleration.
    Two spellings of one spec digest apart: that only costs working the need out twice."""
    meta = raw.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != c.PLACEMENT_ANNOTATION}
    content = json.dumps([raw.get("spec"), meta.get("labels") or {}, annotations],
                         sort_keys=True)
    return hashlib.blake2b(content.encode(), digest_size=16).digest()


def _need(job: TrainJob, runtime: dict) -> Need | str:
    """What ``job`` asks of a worker holding ``runtime``, or why that runtime is unusable."""
    try:
        info = build_runtime_info(job, TrainingRuntime.model_validate(runtime))
    except Exception as err:  # noqa: BLE001 - a broken runtime excludes this worker only
        return f"runtime {runtime['metadata'].get('name')} unusable: {err}"
    trainers = info.by_role(c.ROLE_TRAINER) or info.pod_sets
    pod_spec = trainers[0].pod_spec if trainers else {}
    totals = info.totals
    each_pod = [pod_set.requests for pod_set in info.pod_sets for _ in range(pod_set.count)]
    return Need(totals.requests, totals.pods, pod_spec.get("nodeSelector"),
                pod_spec.get("tolerations"), each_pod,
                priority_classes=tuple(sorted({pod_set.pod_spec.get("priorityClassName") or ""
                                               for pod_set in info.pod_sets})))


def _quota_room(key: JobKey, worker: WorkerCluster, need: Need, free: dict[str, Decimal],
                short: list[str]) -> tuple[str | None, dict[str, Decimal], bool]:
    """Kueue mode: the worker fits only when its Kueue's quota for the job's queue fits
    too. (why not, Node room, whether that answer is only not known yet) when it does not;
    else (None, the smaller of Node and quota room per resource, so ranking sees what both
    allow, False). Without a quota read (no Kueue API there, or none asked for), the Node
    room alone. ``short``: what the Nodes lack (``shortfalls`` of ``free``), named too."""
    if need.queue is None or worker.quota is None:
        return None, free, False
    verdict = worker.quota.verdict(need.queue, need.requests, need.pods, key)
    if verdict is None:
        return None, free, False
    if verdict.problem is not None:
        nodes = f" (and its Nodes: needs {' and '.join(short)})" if short else ""
        return verdict.problem + nodes, free, verdict.unknown
    return None, {resource: min(amount, verdict.free.get(resource, amount))
                  for resource, amount in free.items()}, False

