"""The packing decision: given each Node's room and a job's pods, where each pod would go
(as the worker's scheduler would put it) or why they cannot all go.

Pure: it reads the room it is handed (``Snapshot``: read-only readers, asked lazily) and
changes only its own copies of it; no lock, no informer, nothing kept between calls but
what the optional ``Snapshot.kept`` heaps keep. ``capacity.WorkerCapacity`` keeps the
cache, hands a snapshot of it to ``decide`` while it holds its picture, and adds the check
of arrival orders.

Two orders are packed, because the pods of placed jobs that are not bound yet hold room
the scheduler does not see, and pods come in no order this dispatcher knows: ``HELD_FIRST``
(the held pods keep their Nodes, this job's go around them; its plan is the answer) and
``JOB_FIRST`` (this job's pods go where the scheduler, seeing bound pods only, puts them;
then the held pods must still find room). Held pods on a Node left short move, each job's
as one lump, to other Nodes their job's rules admit.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple

from dispatcher.room.amounts import PODS, fits, format_amount, shift
from dispatcher.room.amounts import accumulate as _accumulate

# kube-scheduler's NodeResourcesFit scoring strategies (its default is LeastAllocated), the
# resources it scores (cpu and memory, weight 1 each) and what it assumes for a container
# that requests none of them when scoring (not when filtering).
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
SCORING_STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED)
SCORED = (("cpu", Decimal("0.1")), ("memory", Decimal(200 * 2**20)))
# Placing one job reads these amounts thousands of times: one object each.
_ZERO = Decimal(0)
_ONE = Decimal(1)
_NOTHING: dict = {}  # read only

Resources = dict[str, Decimal]
# Given a pod shape: a heap of (score, name, 0, version) entries of the Nodes that fit it
# (a copy, to pop from), and the version of each Node's room its entries were scored on.
HeapSource = Callable[[Resources], tuple[list, dict[str, int]]]


def sign_of(scoring: str) -> int:
    """+1 for a scheduler that spreads (LeastAllocated), -1 for one that bin-packs."""
    return -1 if scoring == MOST_ALLOCATED else 1


class Order(enum.Enum):
    """Which pods take their room first (see the module docstring)."""
    HELD_FIRST = "the held pods first, then this job's"
    JOB_FIRST = "this job's pods first, then the held ones"


class Plan(dict):
    """Where ``decide`` put a job's pods: Node -> their requests in sum (what the job's
    reservation holds there), and ``pods``: Node -> each pod's requests (what the check of
    arrival orders asks about)."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[str, list[Resources]] = {}

    def add(self, node: str, pod: Resources) -> None:
        _accumulate(self.setdefault(node, {}), pod)
        self.pods.setdefault(node, []).append(pod)


class Admitted(NamedTuple):
    """The usable Nodes a rule set (``rules``, a hashable key of a nodeSelector and
    tolerations) admits, as a list and a set, what each allocates, and the most any of
    them allocates of each resource."""
    rules: Hashable
    names: list[str]
    set: frozenset[str]
    allocatable: dict[str, Resources]
    largest: Resources

    @classmethod
    def of(cls, rules: Hashable, allocatable: dict[str, Resources]) -> Admitted:
        """The Nodes of ``allocatable``, in its order, admitted under ``rules``."""
        largest: Resources = {}
        for amounts in allocatable.values():
            for resource, amount in amounts.items():
                if amount > largest.get(resource, _ZERO):
                    largest[resource] = amount
        names = list(allocatable)
        return cls(rules, names, frozenset(names), allocatable, largest)


@dataclass(frozen=True)
class Snapshot:
    """What one packing reads of a worker, as of one moment. The readers are asked only
    for the Nodes the packing looks at, and what they return is never changed.

    ``admitted``: the Nodes this job's pods may use. ``held_room(name)``: a Node's
    allocatable less its bound pods and the room held there for placed jobs whose pods are
    not bound yet (below zero when more is held than is left). ``bound_room(name)``: less
    its bound pods only (what the scheduler sees). ``holds``: per placed job, the room it
    still holds per Node; ``holding``: the Nodes where some is held; ``short``: those of
    them whose held room is below zero. ``admitted_for(job)``: the Nodes a placed job's
    rules admit (None: this job's). ``sign``: ``sign_of`` the worker's scoring. ``kept``:
    heaps of scored Nodes kept between packings, by (held room or not, Nodes as a list and
    as a set, the key they are kept under, sign); None: every Node is scored afresh (the
    same answers)."""
    admitted: Admitted
    held_room: Callable[[str], Resources]
    bound_room: Callable[[str], Resources]
    sign: int = 1
    holds: Mapping[Hashable, Mapping[str, Resources]] = field(default_factory=dict)
    holding: Collection[str] = frozenset()
    short: Collection[str] = frozenset()
    admitted_for: Callable[[Hashable], Admitted] | None = None
    kept: Callable[[bool, list[str], Collection[str], Hashable, int], HeapSource] | None = None

    def heaps(self, held: bool, names: list[str], members: Collection[str],
              rules: Hashable) -> HeapSource | None:
        return None if self.kept is None else self.kept(held, names, members, rules,
                                                         self.sign)


def largest_first(pods: list[Resources]) -> list[Resources]:
    """``pods`` in the order they are packed, largest first, each counting one pod slot."""
    ordered = sorted(pods, key=lambda r: sorted(r.items()), reverse=True)
    return [{**pod, PODS: pod.get(PODS, _ONE)} for pod in ordered]


def decide(wanted: list[Resources], snapshot: Snapshot) -> Plan | str:
    """Where ``wanted`` (``largest_first``) would go on the admitted Nodes, or why they
    cannot all go: packed in both orders (``JOB_FIRST`` only when some admitted Node holds
    room: otherwise both orders are one), and the plan of ``HELD_FIRST``."""
    plan = pack_in_order(Order.HELD_FIRST, wanted, snapshot)
    if isinstance(plan, str):
        return plan
    admitted = snapshot.admitted.set
    if any(node in admitted for node in snapshot.holding):
        problem = pack_in_order(Order.JOB_FIRST, wanted, snapshot)
        if isinstance(problem, str):
            return problem
    return plan


def pack_in_order(order: Order, wanted: list[Resources], snapshot: Snapshot) -> Plan | str:
    """``wanted`` packed in ``order`` with the held pods: where this job's pods went, or why
    one of them, or a held one, finds no Node."""
    found = snapshot.admitted
    room = Rooms(found.set, snapshot.held_room)
    if order is Order.HELD_FIRST:
        problem = rehome_held(room, snapshot)
        if problem:
            return problem
        # This job's pods go around the held ones: into the same room.
        seen = room
    else:
        # Where the scheduler puts them, seeing bound pods only; they take the held room too.
        seen = Rooms(found.set, snapshot.bound_room)
    held = seen is room
    packer = Packer(seen, found.allocatable, snapshot.sign,
                    kept=snapshot.heaps(held, found.names, found.set, found.rules))
    plan = Plan()
    for pod in wanted:
        name = packer.take(pod)
        if name is None:
            return no_node_for(pod, room)
        if not held:
            room.take(name, pod)
        plan.add(name, pod)
    if order is Order.JOB_FIRST:
        problem = rehome_held(room, snapshot)
        if problem:
            return problem
    return plan


def rehome_held(room: Rooms, snapshot: Snapshot) -> str | None:
    """Pack the held pods of Nodes that are short onto whichever Nodes of ``room`` (those
    ``snapshot.admitted``) their jobs' rules admit and have room (which they take); why one
    fits nowhere, or None. With ``snapshot.kept``, the packers start from heaps kept
    between placements: under a steady stream of placements some Node is short most of
    the time, and scoring every Node for each lump would be most of a placement."""
    found = snapshot.admitted
    packers: dict[Hashable, Packer] = {}
    for lump, job in displaced(room, snapshot):
        allowed = snapshot.admitted_for(job) if snapshot.admitted_for else found
        packer = packers.get(allowed.rules)
        if packer is None:
            names, members, kept_as = found.names, found.set, found.rules
            if allowed.rules != found.rules:  # the Nodes both admit, kept under both
                names = [name for name in allowed.names if name in found.set]
                members, kept_as = allowed.set & found.set, (found.rules, allowed.rules)
            packer = packers[allowed.rules] = Packer(
                room, allowed.allocatable, snapshot.sign, allowed.set,
                kept=snapshot.heaps(True, names, members, kept_as))
        if packer.take(lump) is None:
            return ("the pods of placed jobs would be left without room: "
                    + no_node_for(lump, {n: room[n] for n in room if n in allowed.set}))
    return None


def displaced(room: Rooms, snapshot: Snapshot) -> list[tuple[Resources, Hashable]]:
    """The held pods on Nodes whose room is short in some resource, with their jobs,
    largest first, all taken out of those Nodes' room, to be packed again over the Nodes
    (which ones the scheduler will put elsewhere depends on the order they come in). One
    job's held pods on a Node move as one lump: a lump can only be harder to place than
    its pods. A pod of a placed job bound off its plan keeps the job's held room where it
    was until the job's last pod binds: which held pod it stood for is not known."""
    # Only Nodes with held room have lumps to move: the rest need not be looked at. Those
    # this packing changed are looked at in its room; the rest are short as the snapshot
    # says.
    changed = room.changed
    short = {name for name in snapshot.short if name in room and name not in changed}
    short.update(name for name in changed if name in snapshot.holding
                 and below_zero(room[name]))
    if not short:
        return []
    lumps: list[tuple[Resources, Hashable]] = []
    for job, per_node in snapshot.holds.items():
        for name, amounts in per_node.items():
            if name in short:
                lump = {**amounts, PODS: amounts.get(PODS, _ONE)}
                room.give(name, lump)
                lumps.append((lump, job))
    return sorted(lumps, key=lambda held: sorted(held[0].items()), reverse=True)


def fits_on_empty(wanted: list[Resources], allocatable: Mapping[str, Resources]) -> bool:
    """Whether ``wanted`` (``largest_first``) would fit on Nodes allocating
    ``allocatable`` were nothing else running: each onto the fullest Node that takes it
    (ties by name). A heuristic, which may say no where a cleverer packing fits."""
    room = {name: dict(amounts) for name, amounts in allocatable.items()}
    for pod in wanted:
        fitting = [name for name, free in room.items() if fits(free, pod)]
        if not fitting:
            return False
        fullest = min(fitting, key=lambda n: (sorted(room[n].items()), n))
        shift(room[fullest], pod, -1)
    return True


def below_zero(room: Resources) -> bool:
    return any(amount < 0 for amount in room.values())


class Rooms:
    """Nodes' room for one packing: each Node's read when first asked for (``room``: the
    room kept for it, shared, read only) until the packing changes it, then a copy of its
    own. A packing changes the room of the few Nodes pods go to, and most often reads only
    those few (the packers' heaps are kept between packings). The packers over it hear of
    every change (``take``, ``give``), so their heaps stay true."""

    def __init__(self, names: Collection[str], room: Callable[[str], Resources]):
        self._names = names
        self._room = room
        self._read: dict[str, Resources] = {}
        self._owned: set[str] = set()
        self.versions: dict[str, int] = {}
        self.packers: list[Packer] = []

    def __getitem__(self, name: str) -> Resources:
        found = self._read.get(name)
        if found is None:
            if name not in self._names:
                raise KeyError(name)
            found = self._read[name] = self._room(name)
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def items(self) -> Iterator[tuple[str, Resources]]:
        return ((name, self[name]) for name in self._names)

    def values(self) -> Iterator[Resources]:
        return (self[name] for name in self._names)

    @property
    def changed(self) -> set[str]:
        """The Nodes whose room this packing changed (read only)."""
        return self._owned

    def own(self, name: str) -> Resources:
        """``name``'s room, to be changed."""
        if name not in self._owned:
            self._read[name] = dict(self[name])
            self._owned.add(name)
        return self._read[name]

    def take(self, name: str, amounts: Resources) -> None:
        """A pod (or a lump of them) takes ``amounts`` on ``name``."""
        self._change(name, amounts, -1)

    def give(self, name: str, amounts: Resources) -> None:
        """``amounts`` on ``name`` are free again."""
        self._change(name, amounts, 1)

    def _change(self, name: str, amounts: Resources, sign: int) -> None:
        shift(self.own(name), amounts, sign)
        self.versions[name] = self.versions.get(name, 0) + 1
        for packer in self.packers:
            packer.renew(name)


class Packer:
    """Where the scheduler would put pods in turn over the same ``room`` (``names``' Nodes of
    it, or all): the Node it scores best among those with room (ties by name). The Nodes
    that fit the last pod shape are kept in a heap by score. A job's pods are mostly
    alike, and between two alike pods only the Nodes that changed need scoring again
    (``renew``: each entry carries the version of the Node's room it was scored on, and an
    entry of an older one is dropped), so a wide job on a large worker scores each Node
    once, not once per pod. With ``kept`` (``Snapshot.kept``), the heap for a shape starts
    from one kept between placements, plus the Nodes this packing changed: then most
    Nodes are not scored at all.

    Scores are compared as floats: they only rank Nodes, and alike Nodes get equal ones
    (ties go by name)."""

    def __init__(self, room: Rooms, allocatable: Mapping[str, Resources], sign: int,
                 names: frozenset[str] | None = None, kept: HeapSource | None = None):
        self.room = room
        self._allocatable = allocatable
        self._sign = sign
        self._names = names
        self._kept = kept
        self._shape: Resources | None = None
        # (score, name, version in this packing, version of the kept room)
        self._heap: list[tuple[float, str, int, int]] = []
        self._kept_versions: dict[str, int] = _NOTHING
        room.packers.append(self)

    def take(self, wanted: Resources) -> str | None:
        """The Node the pod goes to (its room taken), or None when none fits it."""
        if wanted != self._shape:
            self._shape = wanted
            self._start(wanted)
        versions, kept = self.room.versions, self._kept_versions
        while self._heap:
            _, best, version, kept_version = heapq.heappop(self._heap)
            if version == versions.get(best, 0) and kept_version == kept.get(best, 0):
                self.room.take(best, wanted)
                return best
        return None

    def _start(self, wanted: Resources) -> None:
        """The heap for a new pod shape."""
        if self._kept is None:
            versions = self.room.versions
            self._heap = [(self._rank(name, wanted), name, versions.get(name, 0), 0)
                          for name, free in self.room.items()
                          if self._admits(name) and fits(free, wanted)]
            heapq.heapify(self._heap)
            return
        self._heap, self._kept_versions = self._kept(wanted)
        for name in self.room.versions:  # the Nodes this packing changed
            self.renew(name)

    def _admits(self, name: str) -> bool:
        return self._names is None or name in self._names

    def renew(self, name: str) -> None:
        """``name``'s room changed: score it again for the current shape."""
        if self._shape is None or not self._admits(name):
            return
        if fits(self.room[name], self._shape):
            heapq.heappush(self._heap, (self._rank(name, self._shape), name,
                                        self.room.versions.get(name, 0),
                                        self._kept_versions.get(name, 0)))

    def _rank(self, name: str, wanted: Resources) -> float:
        return rank(self.room[name], self._allocatable[name], wanted, self._sign)


def rank(free: Resources, allocatable: Resources, wanted: Resources, sign: int) -> float:
    """A Node's place in a packer's heap for a pod: the best first."""
    return -sign * free_share(free, allocatable, wanted)


def free_share(free: Resources, allocatable: Resources, wanted: Resources) -> float:
    """The scheduler's resource score of a Node for a pod, as a share: the mean over cpu
    and memory of what stays free after the pod, over what the Node allocates (high:
    LeastAllocated picks it; low: MostAllocated does)."""
    total, count = 0.0, 0
    for resource, default in SCORED:
        allocated = allocatable.get(resource)
        if allocated:
            total += float(free.get(resource, _ZERO) - (wanted.get(resource) or default)) \
                / float(allocated)
            count += 1
    return total / count if count else 0.0


def no_node_for(pod: Resources, room: Mapping[str, Resources]) -> str:
    """"no Node has room for a pod of 12 cpu (most free on one Node: 8)"."""
    asked = {r: a for r, a in pod.items() if a > 0 and r != PODS}
    if not room:
        return "no Node admits its pods"
    parts = []
    for resource, amount in sorted(asked.items()):
        most = max(max(free.get(resource, _ZERO), _ZERO) for free in room.values())
        if most < amount:
            parts.append(f"{format_amount(resource, amount)} {resource} (most free on one "
                         f"Node: {format_amount(resource, most)})")
    if not parts:
        parts = [" and ".join(f"{format_amount(r, a)} {r}" for r, a in sorted(asked.items()))
                 + " together"]
    return "no Node has room for a pod of " + "; ".join(parts)
