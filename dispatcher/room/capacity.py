"""Where a worker's room is counted: what one worker cluster can still run, Node by Node,
kept current by its Node and Pod informers.

Handlers update per-node totals as events arrive, so a placement decision is a walk over
nodes in memory, never a re-list. Jobs the dispatcher has just placed are reserved until
their pods appear, so a burst of decisions sees each other's footprint.

Room is checked twice: in total over the Nodes a job may use, and pod by pod (``pack``):
every pod must fit on one Node, or the scheduler would leave it Pending however much room
the worker has in sum. ``pack`` puts each pod where the worker's scheduler would (its
NodeResourcesFit scoring: LeastAllocated by default, which spreads), and a job placed by
packing keeps its room on those Nodes until its pods take it, so the next decision packs
around it. A prediction that packed where the scheduler spreads let a burst fragment the
Nodes: every job fit on paper, and a large pod found no Node. Last, a job whose pods and
those in flight could strand one another in some order of arrival waits for them to bind
(``arrival``).

Where the pods go is decided in ``packing``, pure, over a snapshot of the picture kept
here (``WorkerCapacity._snapshot``); this module keeps the picture and its caches.
"""

from __future__ import annotations

import ast
import contextlib
import heapq
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from dispatcher.room import arrival, packing
from dispatcher.room.amounts import PODS, fits, format_amount, shift
from dispatcher.room.amounts import accumulate as _accumulate
from dispatcher.room.packing import LEAST_ALLOCATED, Admitted
from dispatcher.room.packing import MOST_ALLOCATED as MOST_ALLOCATED
from dispatcher.room.packing import SCORING_STRATEGIES as SCORING_STRATEGIES
from dispatcher.room.packing import below_zero as _below_zero
from dispatcher.room.packing import rank as _rank
from trainjob import constants as c
from trainjob.runtime.podsets import PodSet, format_quantity

log = logging.getLogger(__name__)

# Names of ``packing`` read here as well: the scoring strategies (by the command line and
# the tests), what the scheduler scores, and the packer and its room (the scale tests hold
# them to a plain reference).
_SCORED = packing.SCORED
_Packer, _Rooms = packing.Packer, packing.Rooms
# Placing one job reads these amounts thousands of times: one object each.
_ZERO = Decimal(0)
_ONE = Decimal(1)
_NOTHING: dict = {}  # read only
DELETED = "DELETED"
# PreferNoSchedule only steers the scheduler; these two keep a pod off the node.
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


class _Change:
    """The kinds of ledger change the index hands the picture in order
    (``WorkerCapacity._catch_up``), dotted so that ``match`` compares them (a bare name
    there would capture anything)."""
    RESERVE, RELEASE = "reserve", "release"


# How long the pods of a just-placed job count as in flight for the check of arrival
# orders: enough for its copy's pods to be made and bound on a busy worker, and a bound on
# how long a job waits for pods that never come (a copy held back on its worker, a
# scheduler that is down). Their room stays held for packing all the same.
ARRIVAL_WINDOW_SECONDS = 30.0
# How many heaps of scored Nodes are kept between placements (one per Nodes' rule set, pod
# shape and kind of room): jobs come in a few shapes, and a kept heap is about 100 bytes a
# Node.
HEAPS_KEPT = 16
# How many heaps scored ahead of a decision (``WorkerCapacity.warm``) wait for the first
# decision of their shape: a job's shapes are warmed just before its placement, so a few
# are enough; more would only hold memory for shapes that went to another worker.
HEAPS_WARMED = 8
# How long ``warm`` waits for a heap another thread is scoring (the placer warms a job's
# shapes when it first sees the job, and again before placing it): longer than scoring
# the largest worker takes, and bounded, for the decision scores the Nodes itself anyway
# when no heap was handed in.
WARM_WAIT_SECONDS = 1.0

JobKey = tuple[str, str]
Resources = dict[str, Decimal]
# What a worker's room is split into, per resource: what its usable Nodes allocate, what
# bound pods use, what placed jobs without pods yet hold, and what is left.
CAPACITY_STATES = ("allocatable", "used", "reserved", "free")


@dataclass
class _Node:
    allocatable: Resources
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    usable: bool


@dataclass
class _PodUse:
    node: str
    job: JobKey | None
    requests: Resources
    # A pod that succeeded: it holds no room on its Node, but it has done its part of its
    # job's reservation, which must not hold that room again while the job runs on.
    finished: bool = False


class WorkerCapacity:
    """Incremental capacity picture of one worker cluster; thread-safe, no API calls.

    Kept as kube-scheduler keeps its cache and snapshot: an index the informer handlers
    count each change into at once, a picture each decision works on alone (brought up to
    date from the index when it is taken), and caches derived from the picture. Every part,
    with its lock and its one rule:

    * **the index** (``_index_lock``, held for a few dict operations, never through a
      decision): what the informer handlers and the ledger's writers (``reserve``,
      ``release``) last said, and the room it adds up to. A handler compares with it (a
      heartbeat, a status change, the same footprint again change nothing), counts the
      change and returns: it never waits for a decision.

      - ``_seen_nodes``: each Node as placement reads it; ``_seen_reserved``: each
        reservation's footprint; ``_seen_pods``: what each bound pod counts for (its
        ``_PodUse``, running or succeeded), the one record per Pod;
      - ``_seen_used`` per Node (requests of its pods that have not finished),
        ``_seen_job_used`` per job and ``_seen_job_node_used`` per (job, Node) (requests
        of the job's pods, finished ones too): changed with ``_seen_pods``, by what was
        recorded for the pod (not by what its last event says), so they cannot drift. A
        Pod event's room is counted once it is here (``pod_event_applied``): every
        decision's picture is brought up to date from these rows;
      - what changed since the picture last took the index in, each an ordered set (a
        dict, in the order of last change): ``_changed_nodes`` (name -> whether the Node
        itself changed, not only its pods' use), ``_changed_pairs`` (job, Node) and
        ``_changed_jobs``; and ``_pending``, the ledger's changes in order.
    * **the picture** (``_lock``, held through a whole decision): ``_nodes``, ``_used``,
      ``_job_used``, ``_job_node_used`` (copies of the index's rows), the **ledger** of
      room held for placed jobs (``_reserved``, ``_reserved_at``, ``_planned``,
      ``_planned_pods``, ``_rules``) and what each reservation still counts for once its
      bound pods are taken off, with its sums (``_counted``, ``_counted_total``,
      ``_planned_counted``, ``_node_planned``, ``_unplanned_total``: worked out again for a
      job, ``_recount``, whenever its reservation or its pods' rows change). Whoever takes
      the picture (``_picture``) first brings it up to date (``_catch_up``): under
      ``_index_lock``, briefly, it copies the changed rows and Nodes and takes the pending
      ledger changes; then, without it, puts the rows in, gives each changed Node a
      generation, recounts each changed job and applies the ledger changes in order. A
      recount reads only the job's final rows and its reservation, so that leaves the
      picture as replaying every change one by one would. A change counted while a
      decision holds the picture leaves that decision's picture as it was; the next taker
      takes it in. A handler that finds ``_lock`` free takes the index in itself
      (``_take_in_if_free``, which never waits): an idle worker's picture stays current,
      so a decision's catch-up holds only what came since the last one, and a handler
      holds ``_lock`` only for that short catch-up. Each change of a Node's room (its
      pods' use, room planned or freed there, the Node itself added, changed or gone)
      gives that Node the worker's next **generation** (``_generations``, in the order
      given: the newest last); ``_changes`` counts the changes taken in.
    * **the derived caches** of the picture, each with its one rule of invalidation:

      - ``_rooms[(node, held)]``: a Node's room; dropped when the Node gets a generation;
      - ``_admitted[rules]``: the usable Nodes a rule set admits; dropped when a Node
        comes, goes or changes what placement reads of it (a heartbeat does not);
      - ``_free_sums[rules]``, ``_heaps[key]``, ``_short``: free room summed over the
        Nodes a rule set admits, Nodes scored per pod shape (at most ``HEAPS_KEPT``), and
        the Nodes holding more room than their bound pods leave; each remembers the
        generation it was brought to, and a reader brings it up to date from the Nodes
        of a newer one (``_changed_since``: ``_generations`` walked from its newest end,
        as the scheduler's snapshot walks its Node list), taking each such Node in or out
        as the current ``_admitted`` says. A placement so rescores and resums only the
        Nodes changed since the last one, and a Node cordoned or relabelled costs its
        own rescoring, not every heap's. (``warm`` hands in the free sum of a rule set
        that has none, summed without the lock from the rooms read at one generation:
        brought up to date from there the same way);
      - ``_warmed[key]``: heaps scored for a pod shape before a decision asks for it
        (``warm``: from the rooms read, under the lock, at one generation, scored
        without it), at most ``HEAPS_WARMED``, the least recently warmed dropped first;
        handed in only while neither ``_heaps`` nor ``_warmed`` has that key (and
        scored by one caller at a time: the others wait for it, ``_warming``), and taken
        into ``_heaps`` by the first decision that asks for it, which brings it up to
        date from its generation as any kept heap (so a Node that changed while it was
        scored is scored again there);
      - ``_totals``: ``totals()`` as of ``_changes`` changes.

      ``check()`` works the index's rows, the picture's rows and sums and each cache out
      afresh (from ``_seen_pods``, the Nodes and the ledger, under both locks) and
      compares; ``drop_caches()`` drops the caches (they are made again when next read).
    """

    # Told, for each Pod change, the seconds from its event reaching ``on_pod`` to its
    # change counted in the index (the handler counts it there itself: no decision is
    # waited for), and to the handler's return (what the informer waited). Set
    # process-wide by the dispatcher's metrics.
    pod_event_applied: Callable[[float], None] | None = None
    pod_event_handled: Callable[[float], None] | None = None

    def __init__(self, name: str = "", scoring: str = LEAST_ALLOCATED,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.scoring = scoring
        self._clock = clock
        self._lock = threading.Lock()
        # The index (see the class docstring).
        self._index_lock = threading.Lock()
        self._seen_nodes: dict[str, _Node] = {}
        self._seen_pods: dict[tuple[str, str], _PodUse] = {}
        self._seen_reserved: dict[JobKey, Resources] = {}
        self._seen_used: dict[str, Resources] = {}
        self._seen_job_used: dict[JobKey, Resources] = {}
        self._seen_job_node_used: dict[tuple[JobKey, str], Resources] = {}
        self._changed_nodes: dict[str, bool] = {}
        self._changed_pairs: dict[tuple[JobKey, str], None] = {}
        self._changed_jobs: dict[JobKey, None] = {}
        self._pending: list[tuple] = []
        # The picture: the index's rows as of the last catch-up (replaced whole, never
        # changed in place: the index changes its own rows in place).
        self._nodes: dict[str, _Node] = {}
        self._used: dict[str, Resources] = {}  # node name -> requests of pods bound there
        self._job_used: dict[JobKey, Resources] = {}  # job -> requests of its bound pods
        self._job_node_used: dict[tuple[JobKey, str], Resources] = {}
        self._reserved: dict[JobKey, Resources] = {}
        # When each reservation was made (or changed): its pods count as in flight for
        # ``ARRIVAL_WINDOW_SECONDS``.
        self._reserved_at: dict[JobKey, float] = {}
        self._window_looked_at = clock()
        # Where a reserved job's pods were packed (node -> requests): the planned room
        # stays taken until the pods take it.
        self._planned: dict[JobKey, dict[str, Resources]] = {}
        self._planned_pods: dict[JobKey, dict[str, list[Resources]]] = {}
        # The nodeSelector and tolerations of a planned job's pods: which Nodes they may
        # still go to, for the check of arrival orders (``_order_problem``).
        self._rules: dict[JobKey, tuple[dict[str, str] | None, list[dict] | None]] = {}
        # What each reservation still counts for, and the sum of those: kept current as
        # reservations and pods change, so a placement does not sum every placed job.
        self._counted: dict[JobKey, Resources] = {}
        self._counted_total: Resources = {}
        # The same split by where it is held: per Node for reservations with a plan (they
        # take room only on their Nodes), and one total for those without (they come off
        # every selection of Nodes).
        self._planned_counted: dict[JobKey, dict[str, Resources]] = {}
        # (Only Nodes where room is held have a row: its keys are the Nodes holding room.)
        self._node_planned: dict[str, Resources] = {}
        self._unplanned_total: Resources = {}
        # ``totals`` as last computed, and the count of changes it saw: a scrape or a
        # dashboard poll between two changes reuses it (read only by callers).
        self._changes = 0
        self._totals: tuple[int, dict[str, Any]] | None = None
        # Each Node's room as ``_room`` works it out, (name, held) -> amounts, kept
        # until a pod, a plan or the Node itself changes there: a placement reads the room
        # of every Node, most of them untouched since the last one.
        self._rooms: dict[tuple[str, bool], Resources] = {}
        # The usable Nodes each rule set admits, until a Node comes, goes or changes its
        # labels, taints or readiness (a heartbeat changes none of them).
        self._admitted: dict[tuple, Admitted] = {}
        # The worker's last generation, and each Node's (see the class docstring): the
        # Nodes in the order of their last change, so that those changed since a given
        # generation are the few at the end. (A Node gone keeps its entry, newer than
        # the caches that counted it, so they take it out.)
        self._generation = 0
        self._generations: dict[str, int] = {}
        # What ``free`` sums, per rule set (and None: every usable Node), kept current
        # Node by Node: summing a thousand Nodes' room at every placement would be most of
        # the placement.
        self._free_sums: dict[tuple | None, _FreeSum] = {}
        # The heaps of Nodes scored for a pod shape kept between placements
        # (``_kept_heap``): a placement scores again only the Nodes whose room changed
        # since the last one of that shape, not every Node.
        self._heaps: dict[tuple, _Kept] = {}
        # Heaps scored ahead of the first decision of their shape (``warm``): that
        # decision brings one up to date instead of scoring every Node while it holds the
        # picture (and the placement its workers' ledgers).
        self._warmed: dict[tuple, _Kept] = {}
        # The keys some ``warm`` is scoring now, and what it sets when it has handed them in.
        self._warming: dict[tuple, threading.Event] = {}
        # The Nodes where more room is held for placed jobs than their bound pods leave
        # (``packing.displaced`` moves their held pods), as of generation ``_short_seen``:
        # with hundreds of jobs in flight, hundreds of Nodes hold room, and a placement
        # would otherwise look at each of them.
        self._short: set[str] = set()
        self._short_seen = 0

    # --- informer handlers ------------------------------------------------------------

    def on_node(self, kind: str, old: dict | None, new: dict | None) -> bool:
        """Node informer handler; whether what placement reads of the Node changed."""
        gone = kind == DELETED or new is None
        obj = old if gone else new
        if obj is None:
            return False
        name = (obj.get("metadata") or {}).get("name") or ""
        node = None if gone else _node_from(new)
        with self._index_lock:
            if node == self._seen_nodes.get(name):
                return False  # a heartbeat: nothing placement reads has changed
            if node is None:
                self._seen_nodes.pop(name, None)
            else:
                self._seen_nodes[name] = node
            _touch(self._changed_nodes, name, True)
        self._take_in_if_free()
        return True

    def on_pod(self, kind: str, old: dict | None, new: dict | None) -> bool:
        """Pod informer handler; whether what the Pod counts for changed (bound, finished,
        gone, resized). The change is counted in the index before it returns, whatever a
        decision holds."""
        received = time.perf_counter()
        obj = new if new is not None else old
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        use = None
        if kind != DELETED and new is not None:
            # A pod's spec rarely changes after it is bound (its status does): its
            # requests, the costly part, are worked out again only when it does. (Read
            # without the lock: one dict look-up, and a stale answer only costs the work.)
            known = self._seen_pods.get(key)
            same = known is not None and old is not None and old.get("spec") == new.get("spec")
            use = _pod_use(new, known.requests if same else None)
        with self._index_lock:
            previous = self._seen_pods.get(key)
            if previous == use:
                return False
            if previous is not None:
                del self._seen_pods[key]
                self._count(previous, -1)
            if use is not None:
                self._seen_pods[key] = use
                self._count(use, +1)
        if self.pod_event_applied is not None:
            self.pod_event_applied(time.perf_counter() - received)
        self._take_in_if_free()
        if self.pod_event_handled is not None:
            self.pod_event_handled(time.perf_counter() - received)
        return True

    def _count(self, use: _PodUse, sign: int) -> None:
        """Count (``sign`` +1) or uncount (-1) what a pod's record says in the index's
        rows, and mark what changed. Called under ``_index_lock``."""
        if not use.finished:
            _add(self._seen_used, use.node, use.requests, sign)
            # (A Node whose own change is not taken in yet stays so marked.)
            _touch(self._changed_nodes, use.node, self._changed_nodes.get(use.node, False))
        if use.job is not None:
            pair = (use.job, use.node)
            _add(self._seen_job_used, use.job, use.requests, sign)
            _add(self._seen_job_node_used, pair, use.requests, sign)
            _touch(self._changed_pairs, pair)
            _touch(self._changed_jobs, use.job)

    @contextlib.contextmanager
    def _picture(self) -> Iterator[None]:
        """Hold the picture for a decision or a read, brought up to date with the index
        first. What the handlers count meanwhile stays in the index (counted there) until
        the next taker, or a handler that finds the picture free, takes it in."""
        with self._lock:
            self._catch_up()
            yield

    def _take_in_if_free(self) -> None:
        """Take the index in now unless a decision holds the picture (whoever takes the
        picture next takes it in first)."""
        if self._lock.acquire(blocking=False):
            try:
                self._catch_up()
            finally:
                self._lock.release()

    def _catch_up(self) -> None:
        """Bring the picture up to date with the index (the class docstring). Called
        under ``_lock``."""
        with self._index_lock:
            taken = self._take_index()
        if taken is not None:
            self._put_in(*taken)

    def _take_index(self) -> tuple | None:
        """What changed in the index since the picture last took it in, copied (its rows
        change in place), and the ledger's pending changes; the index marked as taken in.
        Called under both locks, and quick: a few dict look-ups per change."""
        if not (self._changed_nodes or self._changed_pairs or self._pending):
            return None
        nodes = [(name, node_changed, self._seen_nodes.get(name),
                  _copied(self._seen_used, name))
                 for name, node_changed in self._changed_nodes.items()]
        pairs = [(pair, _copied(self._seen_job_node_used, pair)) for pair in self._changed_pairs]
        jobs = [(job, _copied(self._seen_job_used, job)) for job in self._changed_jobs]
        ledger = self._pending
        self._changed_nodes, self._changed_pairs, self._changed_jobs = {}, {}, {}
        self._pending = []
        return nodes, pairs, jobs, ledger

    def _put_in(self, nodes: list[tuple[str, bool, _Node | None, Resources | None]],
                pairs: list[tuple[tuple[JobKey, str], Resources | None]],
                jobs: list[tuple[JobKey, Resources | None]], ledger: list[tuple]) -> None:
        """Apply what ``_take_index`` took to the picture: the rows replaced, a generation
        for each changed Node (in the order they changed), each changed job recounted from
        its new rows, then the ledger's changes in order. Called under ``_lock``."""
        for name, node_changed, node, used in nodes:
            self._changes += 1
            if node_changed:
                self._admitted.clear()
                _put(self._nodes, name, node)
            _put(self._used, name, used)
            self._forget_room(name)
        for pair, row in pairs:
            _put(self._job_node_used, pair, row)
        for job, row in jobs:
            _put(self._job_used, job, row)
            self._recount(job)
        for change in ledger:
            match change:
                case (_Change.RESERVE, job_key, amounts, planned, rules):
                    self._reserve(job_key, amounts, planned, rules)
                case (_Change.RELEASE, job_key):
                    self._release(job_key)

    def _forget_room(self, node: str, bound: bool = True) -> None:
        """The room kept for ``node`` is out of date: its pods (``bound``) or only the
        room planned there changed."""
        self._rooms.pop((node, True), None)
        if bound:
            self._rooms.pop((node, False), None)
        self._generation += 1
        self._generations.pop(node, None)  # to the end: the newest
        self._generations[node] = self._generation

    def _changed_since(self, generation: int) -> list[str]:
        """The Nodes (or names room was planned on) given a generation newer than
        ``generation``, newest first: the end of ``_generations``, walked back to the first
        Node that is not. Called under the lock."""
        changed = []
        for name, given in reversed(self._generations.items()):
            if given <= generation:
                break
            changed.append(name)
        return changed

    # --- reservations -----------------------------------------------------------------

    def reserve(self, job_key: JobKey, requests: Resources, pods: int,
                planned: dict[str, Resources] | None = None,
                rules: tuple[dict[str, str] | None, list[dict] | None] = (None, None)) -> None:
        """Count a just-placed job's footprint until its pods account for it (idempotent);
        ``planned`` says on which Nodes its pods were packed (a ``packing.Plan`` also says
        how, pod by pod), ``rules`` the nodeSelector and tolerations they were packed by.
        Re-reserving the same footprint without a plan (the copy's events do) keeps the
        plan; a reservation re-made after a restart has none and counts against every
        selection of Nodes. Only ``reservations.Reservations`` calls this and ``release``.
        Never waits for a decision: the copy's informer calls it on every event."""
        amounts = {**requests, PODS: Decimal(pods)}
        with self._index_lock:
            if not planned and self._seen_reserved.get(job_key) == amounts:
                return  # the same footprint again (each event of its copy): nothing moves
            self._seen_reserved[job_key] = amounts
            self._pending.append((_Change.RESERVE, job_key, amounts, planned, rules))
        self._take_in_if_free()

    def _reserve(self, job_key: JobKey, amounts: Resources, planned: dict | None,
                 rules: tuple) -> None:
        """``reserve`` taken in. Called under ``_lock``."""
        if planned:
            self._planned[job_key] = planned
            self._planned_pods[job_key] = dict(getattr(planned, "pods", {}))
            self._rules[job_key] = rules
        elif self._reserved.get(job_key) == amounts:
            return
        else:
            self._forget_plan(job_key)  # another footprint: the plan is not its
        self._reserved[job_key] = amounts
        self._reserved_at[job_key] = self._clock()
        self._recount(job_key)

    def reserved(self, job_key: JobKey) -> bool:
        """Whether the job has a reservation here."""
        with self._index_lock:
            return job_key in self._seen_reserved

    def release(self, job_key: JobKey) -> bool:
        """Stop counting the job's reservation (job finished, deleted or moved); True when
        there was one. Never waits for a decision."""
        with self._index_lock:
            had = self._seen_reserved.pop(job_key, None) is not None
            self._pending.append((_Change.RELEASE, job_key))
        self._take_in_if_free()
        return had

    def _release(self, job_key: JobKey) -> None:
        """``release`` taken in. Called under ``_lock``."""
        self._forget_plan(job_key)
        self._reserved_at.pop(job_key, None)
        if self._reserved.pop(job_key, None) is not None:
            self._recount(job_key)

    def _forget_plan(self, job: JobKey) -> None:
        self._planned.pop(job, None)
        self._planned_pods.pop(job, None)
        self._rules.pop(job, None)

    def window_passed(self) -> bool:
        """Whether the pods of some job stopped counting as in flight since the last call:
        jobs that wait on the order of arrival may fit now, and no event says so."""
        with self._picture():
            since, now = self._window_looked_at, self._clock()
            self._window_looked_at = now
            # In flight at ``since`` (``_order_problem``'s rule), not any longer now.
            return any(since <= at + ARRIVAL_WINDOW_SECONDS < now
                       for at in self._reserved_at.values())

    def _recount(self, job: JobKey) -> None:
        self._changes += 1
        # A reservation shrinks by what the job's bound pods already use: pods that exist
        # but are not yet bound (or not yet created, e.g. the trainer after its
        # initializer) stay covered, and once all pods run the reservation counts nothing.
        previous = self._counted.pop(job, None)
        if previous:
            _accumulate(self._counted_total, previous, -1)
            if job not in self._planned_counted:
                _accumulate(self._unplanned_total, previous, -1)
        for node, amounts in self._planned_counted.pop(job, {}).items():
            _add(self._node_planned, node, amounts, -1)
            self._forget_room(node, bound=False)
        reserved = self._reserved.get(job)
        if reserved is None:
            return
        bound = self._job_used.get(job, {})
        counted = _outstanding(reserved, bound)
        if not counted:
            return
        self._counted[job] = counted
        _accumulate(self._counted_total, counted)
        plan = self._planned.get(job)
        if not plan:
            _accumulate(self._unplanned_total, counted)
            return
        per_node = {node: left for node, amounts in plan.items()
                    if (left := _outstanding(amounts, self._job_node_used.get((job, node), {})))}
        self._planned_counted[job] = per_node
        for node, amounts in per_node.items():
            _add(self._node_planned, node, amounts, 1)
            self._forget_room(node, bound=False)

    def _counted_reservations(self) -> Resources:
        return {resource: amount for resource, amount in self._counted_total.items() if amount}

    # --- reading ----------------------------------------------------------------------

    def free(self, node_selector: dict[str, str] | None = None,
             tolerations: list[dict] | None = None) -> Resources:
        """Free capacity on usable nodes that admit the selector and tolerations, less all
        counted reservations; never negative."""
        with self._picture():
            return self._free(self._admitting(node_selector, tolerations).set,
                              _rules(node_selector, tolerations))

    def pack(self, pods: list[Resources], node_selector: dict[str, str] | None = None,
             tolerations: list[dict] | None = None) -> dict[str, Resources] | str:
        """Where ``pods`` (each one's requests) would go on the Nodes that admit them,
        largest first, each where the worker's scheduler would put it (its ``scoring``);
        or why they cannot all go.

        The pods of placed jobs that are not bound yet hold room on the Nodes they were
        planned on, but the scheduler does not see those holds, and the pods come in no
        order this dispatcher knows (a trainer after its initializers, a copy that Kueue
        makes when its clients get to it). So both ends are checked (``packing.decide``:
        the held pods first, then this job's, whose plan is returned; and this job's first,
        then the held pods wherever room is left), and then the orders of arrival
        (``_order_problem``). Reservations without a plan are counted by ``free``."""
        wanted = packing.largest_first(pods)
        with self._picture():
            found = self._admitting(node_selector, tolerations)
            decision = packing.decide(wanted, self._snapshot(found))
            if isinstance(decision, str):
                return decision
            return self._order_problem(wanted, found) or decision

    def warm(self, pods: list[Resources], node_selector: dict[str, str] | None = None,
             tolerations: list[dict] | None = None,
             wait: float = WARM_WAIT_SECONDS) -> int:
        """Score the Nodes for the pod shapes of ``pods`` that no kept heap serves yet,
        ahead of the decision that packs them (``pack``), without holding the picture
        while scoring: the Nodes' room is read under the lock at one generation, scored
        after letting it go, and the heaps handed in (``_warmed``). That decision then
        brings them up to date from that generation as it does any kept heap, so it
        decides as it would have without them. The heap of the room the scheduler sees
        (``JOB_FIRST``) is warmed too when some admitted Node holds room, and the free
        room summed over the admitted Nodes (``_free_sums``) when their rule set has none
        yet. What another caller is working out now is waited for (at most ``wait``
        seconds, holding nothing), not worked out twice. How many heaps this call handed
        in."""
        shapes = list(dict.fromkeys(tuple(sorted(pod.items()))
                                    for pod in packing.largest_first(pods)))
        sign = packing.sign_of(self.scoring)
        with self._picture():
            # Brought up to date here rather than in the decision (on a worker's first
            # placement: every Node).
            self._short_nodes()
            found = self._admitting(node_selector, tolerations)
            kinds = [True]
            if any(name in found.set for name in self._node_planned):
                kinds.append(False)
            keys = [key for held in kinds for shape in shapes
                    if (key := (held, found.rules, sign, shape)) not in self._heaps
                    and key not in self._warmed]
            # The free room summed over these Nodes, which the placement reads first.
            if found.rules not in self._free_sums:
                keys.append(("free", found.rules))
            others = {id(event): event for key in keys
                      if (event := self._warming.get(key)) is not None}
            keys = [key for key in keys if key not in self._warming]
            done = threading.Event()
            for key in keys:
                self._warming[key] = done
            generation, generations = self._generation, self._generations
            # The kept rooms themselves: never changed, only replaced (``_room``).
            # Per kind of key (held room, the room the scheduler sees, "free": the latter).
            read = {kind: [(name, generations[name], self._room(name, kind is True),
                            self._nodes[name].allocatable) for name in found.names]
                    for kind in {key[0] for key in keys}}
            # (Rows of ``_node_planned`` change in place: copied.)
            planned = {name: dict(self._node_planned[name]) for name in found.names
                       if name in self._node_planned} if "free" in read else {}
        if not keys:
            self._wait_for(others.values(), wait)  # (holding nothing)
            return 0
        handed = 0
        try:
            built: list[tuple[tuple, Any]] = []
            for key in keys:
                if key[0] == "free":
                    sums = _FreeSum(generation)
                    for name, _, room, _ in read["free"]:
                        sums.add(name, _contribution(room, planned.get(name, _NOTHING)))
                    built.append((key, sums))
                    continue
                kept, wanted = _Kept(generation), dict(key[3])
                for name, version, room, allocatable in read[key[0]]:
                    kept.score(name, version, room, allocatable, wanted, sign)
                heapq.heapify(kept.heap)
                built.append((key, kept))
            with self._picture():
                for key, kept in built:
                    if key[0] == "free":
                        self._free_sums.setdefault(key[1], kept)
                        continue
                    if key in self._heaps or key in self._warmed:
                        continue  # a decision got there first
                    self._warmed[key] = kept
                    handed += 1
                    while len(self._warmed) > HEAPS_WARMED:
                        del self._warmed[next(iter(self._warmed))]
        finally:
            with self._lock:
                for key in keys:
                    self._warming.pop(key, None)
            done.set()  # (also when scoring failed: the decision then scores itself)
        self._wait_for(others.values(), wait)
        return handed

    @staticmethod
    def _wait_for(events: Iterable[threading.Event], seconds: float) -> None:
        """Wait until each of ``events`` is set, ``seconds`` at most in all."""
        deadline = time.monotonic() + seconds
        for event in events:
            event.wait(max(deadline - time.monotonic(), 0))

    def _snapshot(self, found: Admitted) -> packing.Snapshot:
        """The picture as a packing over the Nodes ``found`` reads it: the room kept per
        Node, the room placed jobs hold, and the heaps kept between placements (read, and
        brought up to date, as the packing asks). Valid while the lock is held. Called
        under the lock."""
        return packing.Snapshot(
            admitted=found,
            held_room=lambda name: self._room(name, True),
            bound_room=lambda name: self._room(name, False),
            sign=packing.sign_of(self.scoring),
            holds=self._planned_counted,
            holding=self._node_planned.keys(),
            short=self._short_nodes(),
            admitted_for=self._job_admitted,
            kept=self._kept_heap)

    def could_fit(self, pods: list[Resources], node_selector: dict[str, str] | None = None,
                  tolerations: list[dict] | None = None) -> bool:
        """Whether ``pods`` would fit on the usable Nodes that admit them were nothing
        else running: when not, no room that frees here can serve them (the waiting line
        lets others use it). Largest first onto the fullest Node that takes each
        (``packing.fits_on_empty``): a packing heuristic, which may say no where a cleverer
        packing fits, and then the job merely does not hold this worker for itself."""
        with self._picture():
            allocatable = self._admitting(node_selector, tolerations).allocatable
        return packing.fits_on_empty(packing.largest_first(pods), allocatable)

    def _order_problem(self, wanted: list[Resources], admitted: Admitted) -> str | None:
        """Why the job should wait for the pods of jobs placed in the last
        ``ARRIVAL_WINDOW_SECONDS`` to bind: in some order of arrival, its pods and theirs
        could leave one of them without a Node (``arrival``), where neither group could on
        its own. If one could, or the search cannot tell within its budget, waiting would
        not help (its own pods) or could last as long as a held pod stays unbound: packing's
        answer stands. Called under the lock."""
        # The usual case, checked cheaply on the running totals: a usable Node this job
        # may use that could take every pending pod (this job's and every reserved one's)
        # at once, and the same of every Node where reserved pods are planned. What holds
        # for them all holds for those in flight.
        names = admitted.set
        if self._absorbed(wanted, admitted, self._counted_total, self._node_planned.keys()):
            return None
        now = self._clock()
        recent = [job for job, at in self._reserved_at.items()
                  if now - at <= ARRIVAL_WINDOW_SECONDS and job in self._counted]
        if not recent:
            return None
        if len(recent) < len(self._counted) and self._absorbed(
                wanted, admitted, _sum(self._counted[job] for job in recent),
                {name for job in recent for name in self._planned_counted.get(job, _NOTHING)}):
            return None
        usable = [name for name, node in self._nodes.items() if node.usable]
        budget = arrival.Budget()
        most = arrival.most_pods(budget, len(usable)) - len(wanted)
        if most < 0 or self._held_pods_at_least(recent) > most:
            return None  # the search would not get past its first step: not listed
        mine = [arrival.PendingPod(pod, names, names) for pod in wanted]
        held = self._held_pods(recent)
        # The room as kept, not copies: the search copies what it changes.
        room = {name: self._room(name, False) for name in usable}
        stranded = arrival.stranded(held + mine, room, budget)
        if stranded is None or stranded is arrival.UNKNOWN:
            return None
        if (arrival.stranded(mine, room, budget) is not None
                or arrival.stranded(held, room, budget) is not None):
            return None
        # (An equal part of a held lump may be a fraction: said as a request would be.)
        asked = " and ".join(f"{format_amount(r, _round_up(r, a))} {r}"
                             for r, a in sorted(stranded.amounts.items()) if r != PODS and a)
        return ("pods of jobs placed here moments ago are not bound yet: in some order of "
                f"arrival, theirs and this job's could leave a pod of {asked} without a Node "
                "(it waits for them to bind)")

    def _absorbed(self, wanted: list[Resources], admitted: Admitted, held: Resources,
                  holding: Iterable[str]) -> bool:
        """Whether a usable Node of ``admitted`` could take this job's pods and ``held`` at
        once, and so could every Node of ``holding`` (those with held room). Called under
        the lock."""
        pending = _sum([*wanted, held])
        if not fits(admitted.largest, pending):
            return False  # more than any of these Nodes allocates: no need to ask each

        def absorbs(name: str) -> bool:
            node = self._nodes.get(name)
            return node is not None and node.usable and fits(self._room(name, False), pending)

        # The few Nodes holding room first; then the first admitted Node that absorbs ends it.
        return all(absorbs(name) for name in holding) and any(absorbs(name)
                                                              for name in admitted.names)

    def _held_pods(self, jobs: list[JobKey]) -> list[arrival.PendingPod]:
        """The pods the reservations of ``jobs`` still stand for, each free to go to any
        Node its job's rules admit. Those of a reservation without a plan (re-made after a
        restart: its rules are not known) may go anywhere, and their own room is not
        asked. Called under the lock."""
        pods: list[arrival.PendingPod] = []
        for job in jobs:
            per_node = self._planned_counted.get(job)
            nodes = self._job_admitted(job).set if per_node else None
            for node, amounts in (per_node.items() if per_node else [(None, self._counted[job])]):
                pods.extend(arrival.PendingPod(pod, nodes, nodes)
                            for pod in self._outstanding_pods(job, node, amounts))
        return pods

    def _held_pods_at_least(self, jobs: list[JobKey]) -> int:
        """At least as many pods as ``_held_pods(jobs)`` lists, one look per job: a job's
        pods on its Nodes are at least one per Node, and at least the pods it still holds
        room for (a pod bound off its plan leaves its planned Node holding). Called under
        the lock."""
        return sum(max(len(self._planned_counted.get(job, _NOTHING)),
                       _pod_count(self._counted[job])) for job in jobs)

    def _outstanding_pods(self, job: JobKey, node: str | None,
                          amounts: Resources) -> list[Resources]:
        """The pods that ``amounts``, what ``job`` still holds on ``node`` (or in all),
        stands for: those packed there while none of them is bound, or while they are all
        alike; otherwise equal parts (which pods the bound ones were is not known:
        initializers and trainer differ). Called under the lock."""
        count = _pod_count(amounts)
        packed = self._planned_pods.get(job, _NOTHING).get(node) or []
        if len(packed) == count:
            return packed
        if packed and all(pod == packed[0] for pod in packed):
            return [packed[0]] * count
        part = {r: a / count for r, a in amounts.items() if r != PODS}
        part[PODS] = _ONE
        return [part] * count

    def _job_admitted(self, job: JobKey) -> Admitted:
        """The usable Nodes the rules ``job``'s pods were packed by admit. Called under the
        lock."""
        return self._admitting(*self._rules.get(job, (None, None)))

    def _admitting(self, node_selector: dict[str, str] | None,
                   tolerations: list[dict] | None) -> Admitted:
        """The usable Nodes a pod with this nodeSelector and these tolerations may land
        on (kept per rule set). Called under the lock."""
        rules = _rules(node_selector, tolerations)
        found = self._admitted.get(rules)
        if found is None:
            allocatable = {name: node.allocatable for name, node in self._nodes.items()
                           if node.usable and admits(node.labels, node.taints, node_selector,
                                                     tolerations)}
            found = self._admitted[rules] = Admitted.of(rules, allocatable)
        return found

    def _kept_heap(self, held: bool, names: list[str], members: Collection[str],
                   rules: tuple, sign: int
                   ) -> packing.HeapSource:
        """For a packer over the room (``held`` or not) of ``names`` (``members`` as a
        set), the Nodes admitted by ``rules``: given a pod shape, a heap of those Nodes that
        fit it, scored, as of now (a copy, to pop from), and the generations its entries
        name. The heap is kept between placements, and only the Nodes of a newer
        generation than it was brought to are scored again, or taken out when no longer
        members (their old entries stay in it, out of date, until ``compact``). Called
        under the lock."""
        def scored(wanted: Resources) -> tuple[list, dict[str, int]]:
            key = (held, rules, sign, tuple(sorted(wanted.items())))
            generations = self._generations
            kept = self._heaps.pop(key, None)
            if kept is None:
                kept = self._warmed.pop(key, None)
            if kept is None:
                kept = _Kept(self._generation)
                for name in names:
                    kept.score(name, generations[name], self._room(name, held),
                               self._nodes[name].allocatable, wanted, sign)
                heapq.heapify(kept.heap)
            else:
                for name in self._changed_since(kept.generation):
                    if name in members:
                        kept.score(name, generations[name], self._room(name, held),
                                   self._nodes[name].allocatable, wanted, sign, push=True)
                    else:
                        kept.leave(name, generations[name])
                kept.generation = self._generation
                kept.compact()
            self._heaps[key] = kept  # the most recently used last
            if len(self._heaps) > HEAPS_KEPT:
                del self._heaps[next(iter(self._heaps))]
            return list(kept.heap), generations
        return scored

    def _short_nodes(self) -> set[str]:
        """The Nodes holding more room for placed jobs than their bound pods leave (read
        only), brought up to date for the Nodes of a newer generation. Called under the
        lock."""
        for name in self._changed_since(self._short_seen):
            if (name in self._node_planned and name in self._nodes
                    and _below_zero(self._room(name, True))):
                self._short.add(name)
            else:
                self._short.discard(name)
        self._short_seen = self._generation
        return self._short

    def _room(self, name: str, held: bool) -> Resources:
        """A Node's allocatable less its bound pods and (``held``) the room planned there
        for reserved jobs whose pods have not taken it yet (below zero when more is
        planned there than the Node has left), as kept: read only. Called under the
        lock."""
        room = self._rooms.get((name, held))
        if room is None:
            room = dict(self._nodes[name].allocatable)
            shift(room, self._used.get(name, _NOTHING), -1)
            if held:
                shift(room, self._node_planned.get(name, _NOTHING), -1)
            self._rooms[(name, held)] = room
        return room

    def excluded_by_rules(self, node_selector: dict[str, str] | None = None,
                          tolerations: list[dict] | None = None) -> str | None:
        """Which Nodes of this worker cannot take the job's pods at all, by rule and count
        ("Nodes excluded: 2 without label pool=gpu (nodeSelector), 1 with taint
        gpu=true:NoSchedule (not tolerated)"), or None when every Node admits them."""
        rules: Counter[str] = Counter()
        with self._picture():
            for node in self._nodes.values():
                rule = ("not Ready or cordoned" if not node.usable else
                        exclusion(node.labels, node.taints, node_selector, tolerations))
                if rule:
                    rules[rule] += 1
        if not rules:
            return None
        return "Nodes excluded: " + ", ".join(f"{n} {rule}" for rule, n in sorted(rules.items()))

    def _free(self, members: Collection[str], rules: tuple | None) -> Resources:
        """Free room on ``members`` (the Nodes ``rules`` admit now; None: every usable one)
        less all counted reservations, never negative. Called under the lock."""
        sums = self._free_sums.get(rules)
        if sums is None:
            sums = self._free_sums[rules] = _FreeSum(self._generation)
            for name in members:
                sums.add(name, self._contribution(name))
        else:
            for name in self._changed_since(sums.seen):
                if name in members:
                    sums.add(name, self._contribution(name))
                else:
                    sums.remove(name)
            sums.seen = self._generation
        total = dict(sums.total)
        # Reservations without a plan are tied to no Node: they come off every selection.
        for resource, amount in self._unplanned_total.items():
            if resource in total and amount:
                total[resource] -= amount
        return {resource: max(amount, _ZERO) for resource, amount in total.items()}

    def _contribution(self, name: str) -> Resources:
        """What ``name`` adds to ``free``: its room after bound pods, clamped per Node (an
        overcommitted Node must not eat into another's room), less the room planned there,
        which is not clamped (what does not fit on its Node lands on another). Called under
        the lock."""
        return _contribution(self._room(name, False), self._node_planned.get(name, _NOTHING))

    def totals(self) -> dict[str, Any]:
        """Totals over usable nodes: node and reservation counts, and per ``CAPACITY_STATES``
        the amounts by resource. The one computation the dashboard, the status command and
        the capacity metrics all read (``summary``, ``by_resource``)."""
        with self._picture():
            if self._totals is not None and self._totals[0] == self._changes:
                return self._totals[1]  # nothing moved since: a scrape costs nothing
            usable = {name for name, node in self._nodes.items() if node.usable}
            allocatable: Resources = {}
            used: Resources = {}
            for name in usable:
                _accumulate(allocatable, self._nodes[name].allocatable)
                _accumulate(used, self._used.get(name, _NOTHING))
            totals = {
                "nodes": len(self._nodes),
                "usableNodes": len(usable),
                "reservations": len(self._reserved),
                "allocatable": allocatable,
                "used": {r: a for r, a in used.items() if a},
                "reserved": self._counted_reservations(),
                "free": self._free(usable, None),
            }
            self._totals = (self._changes, totals)
            return totals

    def check(self) -> None:
        """Work out every kept sum and cache afresh from the Nodes, the bound pods and the
        reservations, and compare with what is kept: AssertionError naming the first that
        differs (the randomized tests call it after each step). The index and the picture
        are both held meanwhile (the handlers wait: a check is for tests), the picture
        brought up to date, so each is held to the same pods, Nodes and reservations."""
        with self._lock, self._index_lock:
            if (taken := self._take_index()) is not None:
                self._put_in(*taken)
            self._check()

    def _check(self) -> None:
        """``check``. Called under both locks, the picture up to date."""
        def nonzero(table: dict) -> dict:
            return {key: {r: a for r, a in row.items() if a}
                    for key, row in table.items() if any(row.values())}

        used: dict[str, Resources] = {}
        job_used: dict[JobKey, Resources] = {}
        job_node_used: dict[tuple[JobKey, str], Resources] = {}
        for use in self._seen_pods.values():
            if not use.finished:
                _accumulate(used.setdefault(use.node, {}), use.requests)
            if use.job is not None:
                _accumulate(job_used.setdefault(use.job, {}), use.requests)
                _accumulate(job_node_used.setdefault((use.job, use.node), {}), use.requests)
        used, job_used, job_node_used = nonzero(used), nonzero(job_used), nonzero(job_node_used)
        # The index's rows, counted by the handlers, and the picture's copies of them.
        assert used == self._seen_used, f"{self.name}: index: used per Node"
        assert job_used == self._seen_job_used, f"{self.name}: index: used per job"
        assert job_node_used == self._seen_job_node_used, \
            f"{self.name}: index: used per job/Node"
        assert used == self._used, f"{self.name}: used per Node"
        assert job_used == self._job_used, f"{self.name}: used per job"
        assert job_node_used == self._job_node_used, f"{self.name}: used per job/Node"
        assert self._nodes == self._seen_nodes, f"{self.name}: Nodes"
        assert self._reserved == self._seen_reserved, f"{self.name}: reservations"
        counted, planned_counted, node_planned = {}, {}, {}
        counted_total: Resources = {}
        unplanned: Resources = {}
        for job, reserved in self._reserved.items():
            left = _outstanding(reserved, job_used.get(job, {}))
            if not left:
                continue
            counted[job] = left
            _accumulate(counted_total, left)
            plan = self._planned.get(job)
            if not plan:
                _accumulate(unplanned, left)
                continue
            per_node = {node: rest for node, amounts in plan.items() if (rest := _outstanding(
                amounts, job_node_used.get((job, node), {})))}
            planned_counted[job] = per_node
            for node, amounts in per_node.items():
                _accumulate(node_planned.setdefault(node, {}), amounts)
        assert counted == self._counted, f"{self.name}: what each reservation counts"
        assert nonzero({0: counted_total}) == nonzero({0: self._counted_total}), \
            f"{self.name}: the reservations' total"
        assert nonzero({0: unplanned}) == nonzero({0: self._unplanned_total}), \
            f"{self.name}: the unplanned reservations' total"
        assert planned_counted == self._planned_counted, f"{self.name}: planned per job"
        assert nonzero(node_planned) == self._node_planned, f"{self.name}: planned per Node"

        def room(name: str, held: bool) -> Resources:
            fresh = dict(self._nodes[name].allocatable)
            shift(fresh, used.get(name, _NOTHING), -1)
            if held:
                shift(fresh, node_planned.get(name, _NOTHING), -1)
            return fresh

        for (name, held), kept in self._rooms.items():
            assert kept == room(name, held), f"{self.name}: room of {name} (held {held})"
        def admitted_now(rules: tuple | None) -> set[str]:
            """The usable Nodes a ``_rules`` key admits (None: all; a pair: both)."""
            if rules is None:
                return {name for name, node in self._nodes.items() if node.usable}
            if not isinstance(rules[1], str):
                return admitted_now(rules[0]) & admitted_now(rules[1])
            return {name for name, node in self._nodes.items() if node.usable and admits(
                node.labels, node.taints, dict(rules[0]) or None, _tolerations_of(rules))}

        for rules, admitted in self._admitted.items():
            assert set(admitted.names) == admitted_now(rules) == admitted.set, \
                f"{self.name}: Nodes admitted by {rules}"
        for rules in list(self._free_sums):
            members = admitted_now(rules)
            kept_free = self._free(members, rules)
            assert set(self._free_sums[rules].parts) == members, \
                f"{self.name}: Nodes summed for {rules}"
            total: Resources = {}
            for name in members:
                _accumulate(total, {r: max(a, _ZERO) - node_planned.get(name, {}).get(r, _ZERO)
                                    for r, a in room(name, False).items()})
            shift(total, unplanned, -1)
            assert kept_free == {r: max(a, _ZERO) for r, a in total.items()}, \
                f"{self.name}: free room summed for {rules}"
        short = {name for name in node_planned
                 if name in self._nodes and _below_zero(room(name, True))}
        assert self._short_nodes() == short, f"{self.name}: Nodes short of held room"
        for (held, rules, sign, shape), kept in [*self._heaps.items(),
                                                 *self._warmed.items()]:
            wanted = dict(shape)
            members = admitted_now(rules)
            missed = [name for name in members if self._generations[name] <= kept.generation
                      and kept.seen.get(name) != self._generations[name]]
            assert not missed, f"{self.name}: Nodes never scored in a heap: {missed}"
            for name, version in kept.seen.items():
                if version != self._generations.get(name, 0) or name not in self._nodes:
                    continue  # out of date: scored again when next asked
                free = room(name, held)
                fit = name in members and fits(free, wanted)
                assert (name in kept.current) == fit, f"{self.name}: heap entry of {name}"
                if fit:
                    entry = (_rank(free, self._nodes[name].allocatable, wanted, sign), name,
                             0, version)
                    assert entry in kept.heap, f"{self.name}: heap score of {name}"

    def drop_caches(self) -> None:
        """Drop every derived cache (see the class docstring): each is made afresh when
        next read. For tests that hold the kept caches to a picture without them."""
        with self._picture():
            self._rooms.clear()
            self._admitted.clear()
            self._free_sums.clear()
            self._heaps.clear()
            self._warmed.clear()
            self._short.clear()
            self._short_seen = 0
            self._totals = None

    def summary(self) -> dict[str, Any]:
        """``totals`` with the amounts as strings, for logs and tests."""
        totals = self.totals()
        return {key: _strings(value) if key in CAPACITY_STATES else value
                for key, value in totals.items()}

    def by_resource(self) -> dict[str, dict[str, Decimal]]:
        """Per resource the usable Nodes report (allocatable), each of ``CAPACITY_STATES``
        (0 where nothing is used or reserved): what the dashboard draws and the
        ``dispatcher_worker_capacity`` metric says."""
        return capacity_by_resource(self.totals())


# --- pure helpers -----------------------------------------------------------------------

def capacity_by_resource(totals: dict[str, Any]) -> dict[str, dict[str, Decimal]]:
    """``WorkerCapacity.totals`` by resource, over the resources the Nodes allocate: bounded
    by what Nodes report (a pod asking for a resource no Node has adds no row)."""
    return {resource: {state: totals[state].get(resource, _ZERO) for state in CAPACITY_STATES}
            for resource in sorted(totals["allocatable"])}


class _FreeSum:
    """The sum of the contributions to free room of a set of Nodes, and each one's part,
    as of generation ``seen``. Its resources are those some part names, as a sum made
    afresh has them (a resource only a Node gone had is not there as 0)."""

    def __init__(self, seen: int):
        self.seen = seen
        self.total: Resources = {}
        self.parts: dict[str, Resources] = {}
        self._naming: Counter[str] = Counter()  # resource -> how many parts name it

    def add(self, name: str, part: Resources) -> None:
        """Count ``part`` for ``name``, instead of what was counted for it before."""
        self.remove(name)
        self.parts[name] = part
        _accumulate(self.total, part)
        self._naming.update(part.keys())

    def remove(self, name: str) -> None:
        """Count nothing for ``name`` (no longer one of the Nodes summed)."""
        previous = self.parts.pop(name, None)
        if previous is None:
            return
        _accumulate(self.total, previous, -1)
        for resource in previous:
            self._naming[resource] -= 1
            if not self._naming[resource]:
                del self._naming[resource], self.total[resource]


def _contribution(room: Resources, planned: Resources) -> Resources:
    """``WorkerCapacity._contribution`` of a Node with this room after bound pods and this
    room planned there."""
    return {resource: max(unbound, _ZERO) - planned.get(resource, _ZERO)
            for resource, unbound in room.items()}


def _rules(node_selector: dict[str, str] | None, tolerations: list[dict] | None) -> tuple:
    """A hashable key for a pod's nodeSelector and tolerations."""
    return tuple(sorted((node_selector or {}).items())), repr(tolerations or [])


def _tolerations_of(rules: tuple) -> list[dict] | None:
    """The tolerations a ``_rules`` key was made from (for ``check``)."""
    return ast.literal_eval(rules[1]) or None


class _Kept:
    """A heap of Nodes scored for one pod shape, kept between placements
    (``WorkerCapacity._kept_heap``), as of the worker's generation ``generation``, and the
    generation each Node was last scored (or taken out) on."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.heap: list[tuple[float, str, int, int]] = []
        self.seen: dict[str, int] = {}
        # The Nodes whose entry is of the room last seen (the heap's other entries are
        # out of date).
        self.current: set[str] = set()

    def leave(self, name: str, version: int) -> None:
        """``name`` is no longer one of the heap's Nodes (gone, or no longer admitted):
        its entries are out of date from ``version`` on."""
        if name in self.seen:
            self.seen[name] = version
            self.current.discard(name)

    def score(self, name: str, version: int, free: Resources, allocatable: Resources,
              wanted: Resources, sign: int, push: bool = False) -> None:
        """Count ``name`` at room ``version``: in the heap when the shape fits it (an
        entry of an older version stays, out of date, until ``compact``)."""
        self.seen[name] = version
        if not fits(free, wanted):
            self.current.discard(name)
        else:
            entry = (_rank(free, allocatable, wanted, sign), name, 0, version)
            self.current.add(name)
            if push:
                heapq.heappush(self.heap, entry)
            else:
                self.heap.append(entry)

    def compact(self) -> None:
        """Drop the out-of-date entries once they pass a quarter of the others: the
        packers that start from this heap pop them one by one, and the Nodes that change
        most (those taken) sit at its top."""
        if len(self.heap) - len(self.current) > len(self.current) // 4 + 16:
            seen = self.seen
            self.heap = [entry for entry in self.heap if seen.get(entry[1]) == entry[3]]
            heapq.heapify(self.heap)


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint: effect and key must match when set; Exists
    ignores the value, Equal (or no operator) compares it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def exclusion(labels: dict[str, str], taints: list[dict[str, Any]],
              node_selector: dict[str, str] | None, tolerations: list[dict] | None) -> str | None:
    """Why a pod with this nodeSelector and these tolerations may not land on the node
    ("without label pool=gpu (nodeSelector)", "with taint gpu=true:NoSchedule (not
    tolerated)"), or None when it may."""
    for key, value in (node_selector or {}).items():
        if labels.get(key) != value:
            return f"without label {key}={value} (nodeSelector)"
    for taint in taints:
        if taint.get("effect") in _BLOCKING_EFFECTS and not any(
                tolerates(t, taint) for t in tolerations or []):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"with taint {taint.get('key')}{value}:{taint.get('effect')} (not tolerated)"
    return None


def admits(labels: dict[str, str], taints: list[dict[str, Any]],
           node_selector: dict[str, str] | None, tolerations: list[dict] | None) -> bool:
    """Whether a pod with this nodeSelector and these tolerations may land on the node."""
    return exclusion(labels, taints, node_selector, tolerations) is None


# The label the job controller puts on a batch Job's pods (Kubernetes 1.27+).
BATCH_JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def pod_requests(pod: dict[str, Any]) -> Resources:
    """What the scheduler reserves for a pod: PodSet's per-pod rule, plus overhead and one
    pod slot."""
    # A shallow copy: PodSet's accessors fill in missing lists, and the informer's cached
    # object must stay as the server sent it.
    spec = dict(pod.get("spec") or {})
    view = PodSet(role="", job={"name": "", "template": {"spec": {"template": {"spec": spec}}}})
    requests = view.requests
    # RuntimeClass overhead is charged on the node on top of the containers.
    overhead = {name: parse_quantity(value) for name, value in (spec.get("overhead") or {}).items()}
    _accumulate(requests, overhead)
    requests[PODS] = requests.get(PODS, _ZERO) + 1
    return requests


def _pod_use(pod: dict[str, Any], requests: Resources | None = None) -> _PodUse | None:
    """What a pod counts for; ``requests``: its requests when already worked out."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    # The job a reservation is keyed by: the JobSet (a TrainJob's is named after it), or,
    # for a batch Job Kueue dispatched, the Job (a Workload's owner, kueue/workloads.py job_key).
    owner = labels.get(c.JOBSET_NAME_LABEL) or labels.get(BATCH_JOB_NAME_LABEL)
    job = (meta.get("namespace") or "", owner) if owner else None
    phase = (pod.get("status") or {}).get("phase")
    # A failed pod is replaced (or its job fails and its reservation goes): the
    # replacement needs the room again. A succeeded one covers its part for good.
    if phase == "Failed" or (phase == "Succeeded" and job is None):
        return None
    return _PodUse(node=node, job=job, requests=requests or pod_requests(pod),
                   finished=phase == "Succeeded")


def _node_from(obj: dict[str, Any]) -> _Node:
    meta, spec, status = (obj.get(k) or {} for k in ("metadata", "spec", "status"))
    ready = any(cond.get("type") == "Ready" and cond.get("status") == "True"
                for cond in status.get("conditions") or [])
    allocatable: Resources = {}
    for resource, value in (status.get("allocatable") or {}).items():
        try:
            allocatable[resource] = parse_quantity(value)
        except ValueError:
            # One malformed extended resource must not hide the node's cpu and memory.
            log.warning("node %s: ignoring allocatable %s=%r", meta.get("name"), resource, value)
    return _Node(allocatable=allocatable, labels=dict(meta.get("labels") or {}),
                 taints=list(spec.get("taints") or []),
                 usable=ready and not spec.get("unschedulable", False))


def _sum(amounts: Iterable[Resources]) -> Resources:
    total: Resources = {}
    for each in amounts:
        _accumulate(total, each)
    return total


def _round_up(resource: str, amount: Decimal) -> Decimal:
    """``amount`` rounded up to what a request can say: millicores of cpu, whole units of
    the rest."""
    step = Decimal("0.001") if resource == "cpu" else _ONE
    return amount if amount % step == 0 else amount.quantize(step, rounding=ROUND_CEILING)


def _pod_count(amounts: Resources) -> int:
    """The pods that ``amounts`` held for a job stands for (at least one)."""
    return max(int(amounts.get(PODS, _ONE)), 1)


def _outstanding(wanted: Resources, taken: Resources) -> Resources:
    """What of ``wanted`` ``taken`` does not cover yet (positive parts only)."""
    return {resource: amount - taken.get(resource, _ZERO)
            for resource, amount in wanted.items() if amount > taken.get(resource, _ZERO)}


def _touch(ordered: dict, key: Any, value: Any = None) -> None:
    """Set ``key`` to ``value`` at the end of ``ordered`` (an ordered set of what changed,
    the last changed last)."""
    ordered.pop(key, None)
    ordered[key] = value


def _copied(table: dict[Any, Resources], key: Any) -> Resources | None:
    """A copy of ``table``'s row for ``key`` (rows change in place), or None."""
    row = table.get(key)
    return dict(row) if row is not None else None


def _put(table: dict, key: Any, value: Any) -> None:
    """``table[key] = value``, or the row removed when ``value`` is None."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def _add(table: dict[Any, Resources], key: Any, amounts: Resources, sign: int) -> None:
    row = table.setdefault(key, {})
    _accumulate(row, amounts, sign)
    # Drop what returned to zero, so a node or job whose pods are all gone leaves no row.
    for resource in [r for r, value in row.items() if not value]:
        del row[resource]
    if not row:
        del table[key]


def _strings(amounts: Resources) -> dict[str, str]:
    return {name: format_quantity(amount) for name, amount in sorted(amounts.items())}
