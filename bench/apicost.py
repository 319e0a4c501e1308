"""API cost from the apiservers' own ``apiserver_request_total``, not from client counting."""

from __future__ import annotations

from collections import Counter

from clusters.testing import request_counts as served

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH"})

Key = tuple[str, str, str]  # (resource with group, subresource, verb)


def request_counts(control_plane) -> Counter:
    """Requests served so far by a cluster's apiserver, by (group/resource, subresource,
    verb); ``control_plane`` is a ``clusters.controlplane.ControlPlane``."""
    counts: Counter = Counter()
    for (group, resource, subresource, verb), n in served(control_plane).items():
        counts[(f"{resource}.{group}" if group else resource, subresource, verb)] += n
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
