"""The worker Nodes of the local harness: what a user asks for (flags or a small YAML file),
validated before anything starts, and the kwok-managed Node objects made from it.

kwok keeps every Node it manages Ready (status and Lease heartbeats), and the worker's
node-lifecycle controller then lifts the ``node.kubernetes.io/not-ready`` taint the
apiserver puts on a new Node, so the scheduler binds pods to them as to real Nodes.

The file format (``python -m clusters up --nodes-file nodes.yaml``)::

    default:                 # pools for every worker not named below
      - count: 2
        resources: {cpu: "8", memory: 32Gi}
    workers:
      worker-2:
        - count: 1
          resources: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "4"}
          labels: {pool: gpu}
          taints: [{key: gpu, value: "true", effect: NoSchedule}]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clusters.machine_load import Deadline
from controller_kit.yaml_errors import YamlFileError, read_yaml_mapping

# kwok manages exactly the Nodes carrying this annotation (its documented convention).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"
NODE_POOL_LABEL = "trainjob.local/node-pool"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
GPU = "nvidia.com/gpu"
STANDARD_RESOURCES = ("cpu", "memory", "pods", "ephemeral-storage", GPU)


class NodeSpecError(ValueError):
    """A node specification the harness refuses; the message names the key."""


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodePool(BaseModel):
    """``count`` identical Nodes."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(default=2, ge=0, le=500)
    resources: dict[str, str] = Field(default_factory=lambda: {"cpu": "8", "memory": "32Gi"})
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)

    @field_validator("resources", mode="before")
    @classmethod
    def _quantities_as_text(cls, value):
        # YAML reads `cpu: 8` as an int; a quantity is text.
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @field_validator("resources")
    @classmethod
    def _known_and_well_formed(cls, resources: dict[str, str]) -> dict[str, str]:
        for name, quantity in resources.items():
            if name not in STANDARD_RESOURCES and "/" not in name:
                raise ValueError(
                    f"unknown resource name {name!r}: use one of {', '.join(STANDARD_RESOURCES)} "
                    "or an extended resource with a domain (example.com/widget)")
            try:
                parsed = parse_quantity(quantity)
            except ValueError:
                raise ValueError(f"resources.{name}: {quantity!r} is not a quantity") from None
            if parsed < 0:
                raise ValueError(f"resources.{name}: {quantity!r} is negative")
        return resources


class NodeLayout(BaseModel):
    """Pools per worker: ``workers[name]`` where given, else ``default``."""

    model_config = ConfigDict(extra="forbid")
    default: list[NodePool] = Field(default_factory=lambda: [NodePool()])
    workers: dict[str, list[NodePool]] = Field(default_factory=dict)

    def pools_for(self, worker: str) -> list[NodePool]:
        return self.workers.get(worker, self.default)

    def check_workers(self, names: list[str]) -> None:
        unknown = sorted(set(self.workers) - set(names))
        if unknown:
            raise NodeSpecError(
                f"workers.{unknown[0]}: no such worker (workers here: {', '.join(names)})")


def _describe(err: ValidationError, source: str) -> NodeSpecError:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return NodeSpecError(f"{source}: {where}: {message}")


def layout_from_flags(count: int, cpu: str, memory: str, gpus: int) -> NodeLayout:
    resources = {"cpu": cpu, "memory": memory}
    if gpus:
        resources[GPU] = str(gpus)
    try:
        return NodeLayout(default=[NodePool(count=count, resources=resources)])
    except ValidationError as err:
        raise _describe(err, "node flags (--nodes/--node-cpu/--node-memory/--node-gpus)") from None


def layout_from_file(path: Path | str, workers: list[str] | None = None) -> NodeLayout:
    """The layout in ``path``; with ``workers``, also refuse pools for workers not there."""
    path = Path(path)
    try:
        data = read_yaml_mapping(path)
    except YamlFileError as err:
        raise NodeSpecError(f"--nodes-file {path}: {err}") from None
    try:
        layout = NodeLayout.model_validate(data)
    except ValidationError as err:
        raise _describe(err, f"--nodes-file {path}") from None
    if workers is not None:
        try:
            layout.check_workers(workers)
        except NodeSpecError as err:
            raise NodeSpecError(f"--nodes-file {path}: {err}") from None
    return layout


def register_node(api: client.ApiClient, name: str, allocatable: dict[str, str],
                  labels: dict[str, str] | None = None, taints: list[dict] | None = None,
                  managed: bool = True) -> None:
    """A Node as a kubelet registers it (an existing one is kept; 110 pod slots unless
    ``allocatable`` says otherwise, a kubelet's default); with ``managed``, kwok keeps it
    Ready, without, it never turns Ready."""
    allocatable = {"pods": "110", **allocatable}
    body = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE} if managed else {},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "type": "kwok", **(labels or {})},
        },
        "spec": {"taints": taints or []},
        # Registration carries the capacity, as a kubelet's does; kwok keeps it.
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }
    try:
        client.CoreV1Api(api).create_node(body)
    except ApiException as err:
        if err.status != 409:
            raise


def create_nodes(api: client.ApiClient, worker: str, pools: list[NodePool]) -> list[str]:
    """Create the Nodes of ``pools`` on ``worker`` (existing ones are kept); their names."""
    names = []
    for index, pool in enumerate(pools):
        pool_name = f"pool-{index}"
        for n in range(pool.count):
            name = f"{worker}-{pool_name}-{n}"
            register_node(api, name, pool.resources,
                          {NODE_POOL_LABEL: pool_name, **pool.labels},
                          [t.model_dump() for t in pool.taints])
            names.append(name)
    return names


def schedulable_problem(node: client.V1Node) -> str | None:
    """Why the scheduler would not use ``node`` now (None when it would)."""
    ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None)
    if ready is None or ready.status != "True":
        return f"node {node.metadata.name} not Ready yet"
    for taint in node.spec.taints or []:
        if taint.key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
            return f"node {node.metadata.name} still has taint {taint.key}"
    return None


def wait_schedulable(api: client.ApiClient, names: list[str], timeout: float) -> None:
    """Until every Node in ``names`` is Ready and free of the not-ready taint."""
    core = client.CoreV1Api(api)
    deadline = Deadline(timeout)
    while True:
        problems = []
        for name in names:
            try:
                problem = schedulable_problem(core.read_node(name))
            except ApiException as err:
                problem = f"node {name}: {err.status} {err.reason}"
            if problem:
                problems.append(problem)
        if not problems:
            return
        if deadline.passed():
            raise TimeoutError(
                f"{len(problems)} Node(s) not schedulable after {deadline.waited()} (kwok marks "
                f"them Ready, the node-lifecycle controller lifts the taint): "
                f"{'; '.join(problems[:3])}")
        time.sleep(0.2)
