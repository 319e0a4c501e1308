"""What a job asks of a worker: the one shape both modes size jobs into (standalone from
the worker's copy of the job's runtime, Kueue mode from the Workload's podSets), and the
shape reservations and quota holds are made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal


@dataclass
class Need:
    """What a job asks of a worker (from that worker's copy of its runtime)."""

    requests: dict[str, Decimal]
    pods: int
    node_selector: dict[str, str] | None
    tolerations: list[dict] | None
    each_pod: list[dict[str, Decimal]] = field(default_factory=list)  # per-pod requests
    # Kueue mode: the (namespace, LocalQueue) the worker's Kueue admits the job through;
    # its ClusterQueue's quota is room too. None in standalone mode.
    queue: tuple[str, str] | None = None
    # The priorityClassName each of its pod templates names ("" for none), each once: the
    # waiting line orders by the highest of their values (``priority``).
    priority_classes: tuple[str, ...] = ()
