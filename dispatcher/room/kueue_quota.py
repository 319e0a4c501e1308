"""A worker Kueue's ClusterQueue quota as room for a job (pure: no API calls).

The remote Workload MultiKueue creates on a worker has the manager Workload's namespace
and ``spec.queueName``; the worker's LocalQueue of that name points (``spec.clusterQueue``)
at the ClusterQueue whose quota the worker's Kueue admits it against. Kueue admits when,
for every resource group that covers what the job asks for, one flavor has room for all of
that group's resources: ``nominalQuota`` (plus what may be borrowed) minus what is already
reserved there (``status.flavorsReservation``: quota held by reserving and admitted
Workloads).

What is modelled, and what is not (decided here, said in docs/kueue-mode.md):

* borrowing: a ClusterQueue in a cohort (``spec.cohortName``) may borrow up to
  ``borrowingLimit``; the cohort's unused quota is not read (it is spread over other
  ClusterQueues and Cohort objects), so borrowing is assumed available up to that limit,
  and without a ``borrowingLimit`` the resource is not limited by this ClusterQueue at
  all. An optimistic guess costs one admission timeout (the next worker is nominated); a
  pessimistic one would keep a job that only fits by borrowing from ever being nominated;
* flavors are tried in order, like Kueue's flavor assigner; a flavor's nodeLabels and
  taints are not matched against the job's nodeSelector (the Node room check does that);
* ``stopPolicy``, ``namespaceSelector``, admission checks and fair sharing on the worker
  are not read: a worker that will not admit for those reasons is caught by the admission
  timeout;
* ``pods`` counts only when the ClusterQueue covers it, as in Kueue.

``pending`` is what this dispatcher has nominated to the worker and the worker's Kueue has
not reserved yet (not in ``flavorsReservation``): it takes room like a reservation, so a
burst of nominations does not all go to the one ClusterQueue with room for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from dispatcher.room.amounts import format_amount
from dispatcher.room.capacity import PODS

Resources = dict[str, Decimal]
Obj = dict[str, Any]


@dataclass
class FlavorRoom:
    """One flavor of one resource group: quota, what may be borrowed (None: no limit
    known) and what is reserved, per covered resource."""

    name: str
    nominal: Resources
    borrowing: dict[str, Decimal | None]
    reserved: Resources = field(default_factory=dict)
    pending: Resources = field(default_factory=dict)  # nominated here, not reserved yet

    def free(self, resource: str) -> Decimal | None:
        """Room left for ``resource``; None when this ClusterQueue sets no limit on it."""
        extra = self.borrowing.get(resource, Decimal(0))
        if extra is None:
            return None
        return (self.nominal.get(resource, Decimal(0)) + extra
                - self.reserved.get(resource, Decimal(0)) - self.pending.get(resource, Decimal(0)))


@dataclass
class QuotaRoom:
    """A ClusterQueue's room: its resource groups, each a list of flavors in order."""

    cluster_queue: str
    groups: list[tuple[list[str], list[FlavorRoom]]]

    def covered(self) -> set[str]:
        return {r for resources, _ in self.groups for r in resources}


@dataclass
class QuotaVerdict:
    """Whether a job fits the quota: ``problem`` says why not (None: it fits); ``free``
    is the room per resource in the flavors it would use (for ranking workers)."""

    problem: str | None
    free: Resources = field(default_factory=dict)
    # The queues are still on their first list: the answer is not known yet (a moment),
    # rather than no.
    unknown: bool = False


def quota_room(cluster_queue: Obj) -> QuotaRoom:
    """The room a ClusterQueue object describes (spec quota, status reservations)."""
    spec = cluster_queue.get("spec") or {}
    in_cohort = bool(spec.get("cohortName") or spec.get("cohort"))
    reserved_by_flavor = _reservations(cluster_queue)
    groups = []
    for group in spec.get("resourceGroups") or []:
        flavors = []
        for flavor in group.get("flavors") or []:
            nominal: Resources = {}
            borrowing: dict[str, Decimal | None] = {}
            for quota in flavor.get("resources") or []:
                name = quota.get("name") or ""
                nominal[name] = _quantity(quota.get("nominalQuota"))
                if in_cohort:
                    limit = quota.get("borrowingLimit")
                    borrowing[name] = None if limit is None else _quantity(limit)
            flavors.append(FlavorRoom(flavor.get("name") or "", nominal, borrowing,
                                      dict(reserved_by_flavor.get(flavor.get("name"), {}))))
        groups.append((list(group.get("coveredResources") or []), flavors))
    return QuotaRoom(cluster_queue["metadata"]["name"], groups)


def _reservations(cluster_queue: Obj) -> dict[str, Resources]:
    status = cluster_queue.get("status") or {}
    # flavorsReservation includes Workloads that reserved quota but are not admitted yet
    # (what Kueue checks admission against); flavorsUsage only the admitted ones.
    usage = status.get("flavorsReservation")
    if usage is None:
        usage = status.get("flavorsUsage") or []
    return {flavor.get("name"): {r.get("name"): _quantity(r.get("total"))
                                 for r in flavor.get("resources") or []}
            for flavor in usage}


def _quantity(value: Any) -> Decimal:
    try:
        return parse_quantity(value) if value is not None else Decimal(0)
    except ValueError:
        return Decimal(0)


def wanted(room: QuotaRoom, requests: Resources, pods: int) -> Resources:
    """What Kueue charges the ClusterQueue for a job: its requests, and its pod count when
    the ClusterQueue covers ``pods``."""
    asked = {r: amount for r, amount in requests.items() if amount > 0 and r != PODS}
    if pods and PODS in room.covered():
        asked[PODS] = Decimal(pods)
    return asked


def take(room: QuotaRoom, asked: Resources) -> None:
    """Count ``asked`` (a pending nomination) on the first flavor of each group with room
    for it, as Kueue would assign it; on the first flavor when none has room."""
    for resources, flavors in room.groups:
        part = {r: a for r, a in asked.items() if r in resources}
        if not part or not flavors:
            continue
        flavor = next((f for f in flavors if _fits(f, part)), flavors[0])
        for resource, amount in part.items():
            flavor.pending[resource] = flavor.pending.get(resource, Decimal(0)) + amount


def _fits(flavor: FlavorRoom, part: Resources) -> bool:
    return all((free := flavor.free(r)) is None or free >= amount for r, amount in part.items())


def fit(room: QuotaRoom, asked: Resources, where: str) -> QuotaVerdict:
    """Whether ``asked`` fits the ClusterQueue's room; ``where`` names it in messages
    ("ClusterQueue cq (LocalQueue ns/q)")."""
    uncovered = sorted(set(asked) - room.covered())
    if uncovered:
        return QuotaVerdict(f"{where} has no quota for {', '.join(uncovered)} (not in any "
                            "spec.resourceGroups[].coveredResources)")
    free: Resources = {}
    short = []
    for resources, flavors in room.groups:
        part = {r: a for r, a in asked.items() if r in resources}
        if not part:
            continue
        chosen = next((f for f in flavors if _fits(f, part)), None)
        if chosen is not None:
            for resource in part:
                amount = chosen.free(resource)
                if amount is not None:
                    free[resource] = amount
            continue
        for flavor in flavors:
            lacking = [_lack(flavor, r, a) for r, a in sorted(part.items())
                       if (left := flavor.free(r)) is not None and left < a]
            if lacking:
                label = f"flavor {flavor.name}: " if len(flavors) > 1 else ""
                short.append(label + ", ".join(lacking))
    if short:
        return QuotaVerdict(f"{where} has too little quota: " + ", ".join(short), free)
    return QuotaVerdict(None, free)


def _lack(flavor: FlavorRoom, resource: str, asked: Decimal) -> str:
    """"6 cpu requested, 4 free (nominalQuota 8, reserved 4)"."""
    def amount(value: Decimal | None) -> str:
        return format_amount(resource, max(value or Decimal(0), Decimal(0)))

    parts = [f"nominalQuota {amount(flavor.nominal.get(resource))}"]
    if resource in flavor.borrowing:
        parts.append(f"borrowingLimit {amount(flavor.borrowing[resource])}")
    parts.append(f"reserved {amount(flavor.reserved.get(resource))}")
    if flavor.pending.get(resource):
        parts.append(f"nominated here and not reserved yet {amount(flavor.pending[resource])}")
    return (f"{amount(asked)} {resource} requested, {amount(flavor.free(resource))} free "
            f"({', '.join(parts)})")
