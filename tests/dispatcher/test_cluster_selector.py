"""A job's cluster selector (annotation ``trainjob-dispatcher.io/cluster-selector``) in
standalone mode: only the workers whose MultiKueueCluster labels it matches are candidates;
a selector that matches none or does not parse makes the job wait saying so; a changed
selector or relabelled worker is seen without a restart; a placed job never moves for a
label.

worker-1 (16 cpu) is labelled region=eu and worker-2 (64 cpu) region=us: best fit puts a
small job on worker-1, so a job that lands on worker-2 went there by its selector."""

from __future__ import annotations

import pytest

from clusters.testing import eventually, holds_for
from trainjob import constants as c

from dispatch_helpers import (
    MK,
    TRAINER,
    condition,
    create,
    get,
    idle_workers,
    placement,
    remotes,
    trainjob,
    wait_placed,
)

ANNOTATION = "trainjob-dispatcher.io/cluster-selector"
MERGE = "application/merge-patch+json"


def _label(env, worker: str, labels: dict[str, str | None]) -> None:
    env.manager.custom.patch_cluster_custom_object(*MK, worker, {"metadata": {"labels": labels}},
                                                   _content_type=MERGE)


@pytest.fixture
def regions(dispatch_env):
    idle_workers(dispatch_env)
    _label(dispatch_env, "worker-1", {"region": "eu"})
    _label(dispatch_env, "worker-2", {"region": "us"})
    yield
    for worker in ("worker-1", "worker-2"):
        _label(dispatch_env, worker, {"region": None})


def _selecting(name: str, selector: str) -> dict:
    body = trainjob(name)
    body["metadata"]["annotations"] = {ANNOTATION: selector}
    return body


def _waits(env, namespace: str, name: str, reason: str, *says: str) -> dict:
    return eventually(
        lambda: condition(get(env.manager, namespace, name), "Placed") or {},
        lambda placed: placed.get("status") == "False" and placed.get("reason") == reason
        and all(part in placed.get("message", "") for part in says),
        timeout=30, expected=f"{namespace}/{name} Placed=False {reason} saying {list(says)}")


def test_only_matching_workers_are_candidates_and_the_rest_wait_saying_why(
        dispatch_env, namespace, regions):
    env = dispatch_env
    create(env.manager, namespace, _selecting("to-eu", "region=eu"))
    create(env.manager, namespace, _selecting("to-us", "region in (us,ca),tier!=spot"))
    create(env.manager, namespace, _selecting("to-mars", "region=mars"))
    create(env.manager, namespace, _selecting("broken", "region in (eu"))
    assert wait_placed(env, namespace, "to-eu")[0] == "worker-1"
    # Best fit alone would choose worker-1 (16 cpu, the fuller): the selector decided.
    assert wait_placed(env, namespace, "to-us")[0] == "worker-2"

    _waits(env, namespace, "to-mars", "NoWorkerMatchesSelector", "'region=mars'",
           "matches no registered worker cluster",
           "worker-1 {region=eu}, worker-2 {region=us}")
    _waits(env, namespace, "broken", "InvalidClusterSelector",
           f"annotation {ANNOTATION} 'region in (eu' is not a valid label selector: "
           'at character 14: "," or ")" is expected in the "in" list')
    events = eventually(
        lambda: [(e.type, e.reason, e.message) for e in env.manager.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=broken").items],
        lambda seen: any(e[:2] == ("Warning", "InvalidClusterSelector") for e in seen),
        timeout=30, expected="a Warning InvalidClusterSelector Event on the job")
    assert any(ANNOTATION in message for _, _, message in events), events

    # A corrected selector on the waiting job takes effect (its change wakes it).
    env.manager.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "broken",
        {"metadata": {"annotations": {ANNOTATION: "region=us"}}}, _content_type=MERGE)
    assert wait_placed(env, namespace, "broken")[0] == "worker-2"


def test_a_relabelled_worker_takes_waiting_jobs_and_keeps_placed_ones(dispatch_env, namespace,
                                                                     regions):
    env = dispatch_env
    create(env.manager, namespace, _selecting("stays", "region=eu"))
    _, copy = wait_placed(env, namespace, "stays")
    create(env.manager, namespace, _selecting("waits", "region=mars"))
    _waits(env, namespace, "waits", "NoWorkerMatchesSelector", "'region=mars'")

    # worker-1 leaves eu for mars: the waiting job goes there without a restart; the job
    # placed there by region=eu stays, its copy untouched.
    _label(env, "worker-1", {"region": "mars"})
    assert wait_placed(env, namespace, "waits")[0] == "worker-1"
    holds_for(lambda: (placement(get(env.manager, namespace, "stays")),
                       {w: o["metadata"]["uid"] for w, o in
                        remotes(env, namespace, "stays").items()}),
              lambda seen: seen == ("worker-1", {"worker-1": copy["metadata"]["uid"]}),
              seconds=3, expected="stays placed on worker-1 with its first copy")
