"""API cost from the apiservers' own ``apiserver_request_total``, not from client counting."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH"})

Key = tuple[str, str, str]  # (resource with group, subresource, verb)


def request_counts(control_plane) -> Counter:
    """Requests served so far by a cluster's apiserver, by (group/resource, subresource,
    verb); ``control_plane`` is a ``clusters.controlplane.ControlPlane``."""
    status, text = control_plane.get("/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"apiserver {control_plane.name} /metrics answered {status}: "
                           f"{text[:200]}")
    # Only one family is wanted; parsing the whole exposition (megabytes) is slow.
    wanted = "\n".join(line for line in text.splitlines()
                       if line.startswith("apiserver_request_total{"))
    counts: Counter = Counter()
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            group = labels.get("group", "")
            resource = f"{labels.get('resource', '')}.{group}" if group else labels.get(
                "resource", "")
            counts[(resource, labels.get("subresource", ""), labels["verb"])] += \
                int(sample.value)
    return counts


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
