"""The operator's Prometheus metrics: its own, and the controller-runtime ones
(``controller_kit.controller_metrics``), on the one registry the process serves (a registry per
operator, not prometheus_client's global one: several operators can run in one test process
without clashing)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from controller_kit.controller_metrics import ControllerMetrics, process_registry

# The controller's name (the ``controller`` and work queue ``name`` labels).
CONTROLLER = "trainjob"


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = process_registry()
        self.controllers = ControllerMetrics(self.registry)
        self.reconcile_duration = Histogram(
            "training_operator_reconcile_duration_seconds", "Time to reconcile one TrainJob",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.reconcile_errors = Counter(
            "training_operator_reconcile_errors_total", "Reconciles that failed and were retried",
            registry=self.registry,
        )
        self.jobsets_created = Counter(
            "training_operator_jobsets_created_total", "JobSets created", registry=self.registry,
        )
        self.status_writes = Counter(
            "training_operator_status_writes_total", "TrainJob status writes",
            registry=self.registry,
        )
        self.webhook_duration = Histogram(
            "training_operator_webhook_duration_seconds", "Admission review latency",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
        )
        self.webhook_rejections = Counter(
            "training_operator_webhook_rejections_total", "Admission requests refused",
            ["reason"], registry=self.registry,
        )
        self.trainer_status_requests = Counter(
            "training_operator_trainer_status_requests_total",
            "Trainer status reports answered, by HTTP status code", ["code"],
            registry=self.registry,
        )
