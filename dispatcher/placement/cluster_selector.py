"""Which workers a job may run on: the label selector in its
``trainjob-dispatcher.io/cluster-selector`` annotation, matched against the labels of the
workers' MultiKueueClusters (pure: no API calls).

The selector is written as ``kubectl get -l`` takes it, parsed strictly by
``controller_kit.label_selector`` (a typo never silently selects every worker or none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# The generic parser; re-exported: placement and its tests name them here.
from controller_kit.label_selector import (  # noqa: F401
    InvalidSelector,
    Requirement,
    Selector,
    parse,
)

CLUSTER_SELECTOR_ANNOTATION = "trainjob-dispatcher.io/cluster-selector"
REASON_NO_WORKER_MATCHES = "NoWorkerMatchesSelector"
REASON_INVALID_SELECTOR = "InvalidClusterSelector"
# Workers whose labels a "matches no worker" message lists before "and N more".
_LISTED_WORKERS = 10

# --- the job's selector among the workers ------------------------------------------------

class Unplaceable(str):
    """Why a job waits, like placement's other reasons (a string), with the reason its
    condition and Event carry."""

    reason: str

    def __new__(cls, message: str, reason: str) -> Unplaceable:
        made = super().__new__(cls, message)
        made.reason = reason
        return made


def selector_of(annotations: dict[str, str] | None) -> str | None:
    """The job's cluster selector as written, or None when it gives none."""
    return (annotations or {}).get(CLUSTER_SELECTOR_ANNOTATION)


def select(text: str | None, workers: Iterable[str],
           labels_of: Callable[[str], dict[str, str]]) -> set[str] | Unplaceable:
    """The workers (by name) whose labels the selector ``text`` matches (every worker
    without a selector); or why the job waits: the selector is invalid, or it matches no
    registered worker (their labels named)."""
    names = list(workers)
    if text is None or not text.strip():
        return set(names)
    try:
        selector = parse(text)
    except InvalidSelector as err:
        return Unplaceable(f"annotation {CLUSTER_SELECTOR_ANNOTATION} {text!r} is not a valid "
                           f"label selector: {err}", REASON_INVALID_SELECTOR)
    labels = {name: labels_of(name) for name in names}
    chosen = {name for name in names if selector.matches(labels[name])}
    if chosen:
        return chosen
    if not names:
        seen = "no worker cluster is registered"
    else:
        shown = [f"{name} {{{','.join(f'{k}={v}' for k, v in sorted(labels[name].items()))}}}"
                 for name in sorted(names)[:_LISTED_WORKERS]]
        more = len(names) - _LISTED_WORKERS
        seen = "the workers' labels: " + ", ".join(shown) + (
            f" and {more} more" if more > 0 else "")
    return Unplaceable(f"cluster selector {text!r} (annotation {CLUSTER_SELECTOR_ANNOTATION}) "
                       f"matches no registered worker cluster; {seen}",
                       REASON_NO_WORKER_MATCHES)
