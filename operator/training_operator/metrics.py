"""The operator's Prometheus metrics, on a registry of its own (several operators can run
in one test process without clashing)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
