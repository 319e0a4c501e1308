"""PodSets, RuntimePolicy and RuntimeInfo, and the one place totals are computed.

A PodSet is a view over one replicated job of the runtime's JobSet template: its role, how
many pods it runs and what each pod requests. Policy plug-ins mutate the replicated job
in place; everything a PodSet reports is derived from it, so the JobSet that is built and
the totals that placement uses can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from trainjob.api import MLPolicy
from trainjob.quantity import Quantity


@dataclass
class RuntimePolicy:
    """The ML policy and pod-group policy of the resolved runtime. No node count here:
    counts live on PodSets."""

    ml_policy: MLPolicy = field(default_factory=MLPolicy)
    pod_group_policy: dict[str, Any] | None = None

    @property
    def framework(self) -> str:
        """The ML policy source the runtime sets (its key under ``mlPolicy``, e.g. the name
        a plug-in answers to), or "plain" when it sets none."""
        sources = [key for key, value in self.ml_policy.dump().items() if key != "numNodes"
                   and value is not None]
        return sources[0] if sources else "plain"

    @property
    def pod_group_source(self) -> str:
        """The key set under ``podGroupPolicy`` (e.g. "coscheduling"), or ""."""
        policy = self.pod_group_policy or {}
        return next((key for key, value in policy.items() if value is not None), "")


@dataclass
class PodSet:
    """One replicated job: ``job`` is its JobSet ``replicatedJobs[]`` entry (mutable)."""

    role: str
    job: dict[str, Any]

    @property
    def name(self) -> str:
        return self.job["name"]

    @property
    def job_spec(self) -> dict[str, Any]:
        return self.job.setdefault("template", {}).setdefault("spec", {})

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.job_spec.setdefault("template", {}).setdefault("spec", {})

    @property
    def containers(self) -> list[dict[str, Any]]:
        return self.pod_spec.setdefault("containers", [])

    @property
    def init_containers(self) -> list[dict[str, Any]]:
        """The init containers (read-only view: no empty list is added to the template)."""
        return self.pod_spec.get("initContainers") or []

    @property
    def volumes(self) -> list[dict[str, Any]]:
        return self.pod_spec.setdefault("volumes", [])

    def container(self, name: str) -> dict[str, Any] | None:
        return next((x for x in self.containers if x.get("name") == name), None)

    @property
    def replicas(self) -> int:
        return int(self.job.get("replicas", 1))

    @property
    def parallelism(self) -> int:
        return int(self.job_spec.get("parallelism", 1))

    @property
    def count(self) -> int:
        """Pods this PodSet runs at once: replicas x parallelism."""
        return self.replicas * self.parallelism

    def set_count(self, pods: int) -> None:
        """Run ``pods`` pods as one indexed Job (replicas 1, parallelism = completions)."""
        self.job["replicas"] = 1
        self.job_spec["parallelism"] = pods
        self.job_spec["completions"] = pods

    @property
    def requests(self) -> dict[str, Decimal]:
        """Per-pod requests as the scheduler sees them: containers and sidecars summed, or
        the largest plain init container if that is larger. A limit stands in for a
        missing request."""
        total: dict[str, Decimal] = {}
        sidecars = [x for x in self.init_containers if x.get("restartPolicy") == "Always"]
        # Sidecars (restartable init containers) run alongside the main containers.
        for container in self.containers + sidecars:
            for resource, amount in self._container_requests(container).items():
                total[resource] = total.get(resource, Decimal(0)) + amount
        for container in self.init_containers:
            if container.get("restartPolicy") == "Always":
                continue
            for resource, amount in self._container_requests(container).items():
                total[resource] = max(total.get(resource, Decimal(0)), amount)
        return total

    @property
    def declared_requests(self) -> dict[str, Quantity]:
        """Per-pod requests as upstream's controller sums them for PodGroups (Kubernetes'
        PodRequests): declared requests only, no limit standing in; containers and
        sidecars added, each plain init container with the sidecars before it as a floor;
        every sum in the format of its first term."""
        def add(into: dict[str, Quantity], amounts: dict[str, Quantity]) -> None:
            for name, amount in amounts.items():
                into[name] = into[name] + amount if name in into else amount

        def at_least(into: dict[str, Quantity], amounts: dict[str, Quantity]) -> None:
            for name, amount in amounts.items():
                if name not in into or amount.amount > into[name].amount:
                    into[name] = amount

        def declared(container: dict[str, Any]) -> dict[str, Quantity]:
            return {name: Quantity.parse(value) for name, value in
                    (((container.get("resources") or {}).get("requests")) or {}).items()}

        total: dict[str, Quantity] = {}
        for container in self.containers:
            add(total, declared(container))
        sidecars: dict[str, Quantity] = {}
        floor: dict[str, Quantity] = {}
        for container in self.init_containers:
            amounts = declared(container)
            if container.get("restartPolicy") == "Always":
                add(total, amounts)
                add(sidecars, amounts)
                amounts = dict(sidecars)
            else:
                add(amounts, sidecars)
            at_least(floor, amounts)
        at_least(total, floor)
        return total

    def _container_requests(self, container: dict[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        amounts = {}
        for kind in ("limits", "requests"):  # a request wins over its limit
            for name, value in (resources.get(kind) or {}).items():
                try:
                    amount = parse_quantity(value)
                except ValueError:
                    amount = None
                if amount is None or amount < 0:
                    # The runtime's template is free-form to the API server: name the spot.
                    raise ValueError(
                        f"replicatedJobs[{self.name}] container {container.get('name')}: "
                        f"resources.{kind}.{name} {value!r} is not a non-negative quantity")
                amounts[name] = amount
        return amounts


@dataclass
class Totals:
    pods: int
    requests: dict[str, Decimal]

    def as_strings(self) -> dict[str, str]:
        return {name: format_quantity(amount) for name, amount in sorted(self.requests.items())}


def totals(pod_sets: list[PodSet]) -> Totals:
    """Sum over PodSets of per-pod requests x count: the job's whole footprint. The JobSet
    annotations, the status and the dispatcher's placement all use this function."""
    requests: dict[str, Decimal] = {}
    for pod_set in pod_sets:
        for resource, amount in pod_set.requests.items():
            requests[resource] = requests.get(resource, Decimal(0)) + amount * pod_set.count
    return Totals(pods=sum(p.count for p in pod_sets), requests=requests)


def group_resources(pod_sets: list[PodSet]) -> dict[str, str]:
    """A gang's ``minResources`` as upstream writes it: Σ declared per-pod requests x count
    over the PodSets in order, each in its format's canonical form."""
    total: dict[str, Quantity] = {}
    for pod_set in pod_sets:
        for name, amount in pod_set.declared_requests.items():
            amount = amount.times(pod_set.count)
            total[name] = total[name] + amount if name in total else amount
    return {name: str(amount) for name, amount in sorted(total.items())}


def format_quantity(amount: Decimal) -> str:
    """A compact, exact quantity string: whole numbers plain, fractions in milli-units."""
    if amount == amount.to_integral_value():
        return str(int(amount))
    milli = amount * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return str(amount.normalize())


@dataclass
class RuntimeInfo:
    """What resolving a runtime for one TrainJob produces; plug-ins mutate it in order."""

    policy: RuntimePolicy
    pod_sets: list[PodSet]
    # The JobSet template's spec other than replicatedJobs (network, successPolicy, ...).
    jobset_spec: dict[str, Any] = field(default_factory=dict)
    # The runtime's replicated jobs as written (after runtime patches), for plug-ins that
    # read the runtime's own values once the TrainJob's have replaced them.
    runtime_jobs: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    # Objects the plug-ins build beside the JobSet (``extension_points.ExtraObject``); the
    # operator owns them by the TrainJob, as the JobSet.
    objects: list[Any] = field(default_factory=list)

    def pod_set(self, name: str) -> PodSet | None:
        return next((p for p in self.pod_sets if p.name == name), None)

    def by_role(self, role: str) -> list[PodSet]:
        return [p for p in self.pod_sets if p.role == role]

    @property
    def totals(self) -> Totals:
        return totals(self.pod_sets)
