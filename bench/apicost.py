"""API cost from the apiservers' own ``apiserver_request_total``, not from client counting."""

from __future__ import annotations

from collections import Counter

from clusters.testing import apiserver_samples

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH"})

Key = tuple[str, str, str]  # (resource with group, subresource, verb)

# The verb a dry-run request is counted under, apart from the writes: the apiserver admits
# it (webhooks included) but stores nothing. Kueue's job reconciler dry-run-creates the
# Workload it would build for a job on every reconcile, to compare it with the stored one.
DRY_RUN = " (dry run)"


def request_counts(control_plane) -> Counter:
    """Requests served so far by a cluster's apiserver, by (group/resource, subresource,
    verb), a dry run's verb marked with ``DRY_RUN``; ``control_plane`` is a
    ``clusters.controlplane.ControlPlane``."""
    counts: Counter = Counter()
    for sample in apiserver_samples(control_plane, "apiserver_request_total{"):
        if sample.name != "apiserver_request_total":
            continue
        labels = sample.labels
        group, resource = labels.get("group", ""), labels.get("resource", "")
        verb = labels["verb"] + (DRY_RUN if labels.get("dry_run") else "")
        counts[(f"{resource}.{group}" if group else resource, labels.get("subresource", ""),
                verb)] += int(sample.value)
    return counts


WEBHOOK_DURATION = "apiserver_admission_webhook_admission_duration_seconds"


def webhook_time(control_plane) -> Counter:
    """Admission webhook calls the apiserver has made so far and the seconds it waited on
    them, by (webhook name, operation, "calls" or "ms")."""
    counts: Counter = Counter()
    for sample in apiserver_samples(control_plane, WEBHOOK_DURATION):
        key = (sample.labels.get("name", ""), sample.labels.get("operation", ""))
        if sample.name == f"{WEBHOOK_DURATION}_count":
            counts[(*key, "calls")] += int(sample.value)
        elif sample.name == f"{WEBHOOK_DURATION}_sum":
            counts[(*key, "ms")] += round(sample.value * 1000)
    return counts


def webhook_cost(before: Counter, after: Counter, jobs: int) -> dict:
    """What admission webhooks cost a cluster between two ``webhook_time`` snapshots: calls
    and milliseconds waited per job, and the webhooks that took the most."""
    spent = delta(before, after)
    calls = sum(n for (_, _, unit), n in spent.items() if unit == "calls")
    waited = sum(n for (_, _, unit), n in spent.items() if unit == "ms")
    by_hook = Counter()
    for (name, operation, unit), n in spent.items():
        if unit == "ms":
            by_hook[f"{name} {operation}"] += n
    return {"calls_per_job": round(calls / jobs, 2), "ms_per_job": round(waited / jobs, 1),
            "mean_ms_per_call": round(waited / calls, 1) if calls else None,
            "slowest": [{"webhook": hook, "ms": ms} for hook, ms in by_hook.most_common(4)]}


def delta(before: Counter, after: Counter) -> Counter:
    return Counter({k: v - before.get(k, 0) for k, v in after.items()
                    if v - before.get(k, 0) > 0})


def total(counts: Counter, *, resource: str | None = None, subresource: str | None = None,
          verbs: frozenset[str] | None = None) -> int:
    return sum(n for (res, sub, verb), n in counts.items()
               if (resource is None or res == resource)
               and (subresource is None or sub == subresource)
               and (verbs is None or verb in verbs))


def as_table(counts: Counter) -> list[dict]:
    """JSON-friendly rows, largest first."""
    return [{"resource": res, "subresource": sub, "verb": verb, "count": n}
            for (res, sub, verb), n in counts.most_common()]
