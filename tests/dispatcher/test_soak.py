"""Kill the dispatcher at random moments while many TrainJobs go through their whole life:
none is lost, none ever has two copies, nothing is left behind on the workers."""

from __future__ import annotations

import random
import threading

import pytest

from clusters.testing import eventually
from trainjob import constants as c

from dispatch_helpers import QUICK_RUNTIME, complete_jobset, create, get, trainjob, wait_placed

JOBS = 80
KILLS = 5
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)


def copies_by_job(env, namespace: str) -> dict[str, list[str]]:
    """Which workers hold a copy of each job, from one list per worker."""
    seen: dict[str, list[str]] = {}
    for worker in env.multicluster.workers:
        items = worker.custom.list_namespaced_custom_object(
            *TRAINER, namespace, c.TRAINJOBS,
            label_selector=f"{c.MULTIKUEUE_ORIGIN_LABEL}={c.DEFAULT_ORIGIN}")["items"]
        for item in items:
            seen.setdefault(item["metadata"]["name"], []).append(worker.name)
    return seen


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(dispatch_env, namespace):
    env = dispatch_env
    rng = random.Random(20261122)
    duplicates: list[tuple[str, list[str]]] = []
    samples = 0
    stop_sampling = threading.Event()

    def sample() -> None:
        nonlocal samples
        while not stop_sampling.is_set():
            for name, workers in copies_by_job(env, namespace).items():
                if len(workers) > 1:
                    duplicates.append((name, workers))
            samples += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kills = 0
    try:
        for i in range(JOBS):
            # Real pods on kwok, each succeeding a second after it starts.
            create(env.manager, namespace, trainjob(f"s{i:03d}", runtime=QUICK_RUNTIME))
            if kills < KILLS and rng.random() < KILLS / JOBS * 1.5:
                env.restart_dispatcher(kill=True)
                kills += 1
        while kills < KILLS:
            env.restart_dispatcher(kill=True)
            kills += 1

        def finished() -> int:
            items = env.manager.custom.list_namespaced_custom_object(
                *TRAINER, namespace, c.TRAINJOBS)["items"]
            return sum(1 for item in items if any(
                x["type"] == "Complete" and x["status"] == "True"
                for x in (item.get("status") or {}).get("conditions") or []))

        eventually(finished, lambda done: done == JOBS, timeout=400, interval=1,
                   expected=f"all {JOBS} manager TrainJobs Complete")
        eventually(lambda: copies_by_job(env, namespace), lambda seen: seen == {},
                   timeout=120, interval=1,
                   expected="no remote copy with our origin label left on any worker")
    finally:
        stop_sampling.set()
        sampler.join(10)
    print(f"\n{JOBS} jobs, {kills} SIGKILLs of the dispatcher, {samples} samples of every "
          f"worker: {len(duplicates)} moments with two copies of a job")
    assert duplicates == [], f"jobs seen with more than one copy: {duplicates[:5]}"


def test_a_conflict_storm_loses_no_status_and_no_user_change(dispatch_env, namespace):
    """Users relabel manager jobs as fast as they can while statuses are being synced."""

    env = dispatch_env
    names = [f"storm{i}" for i in range(10)]
    for name in names:
        create(env.manager, namespace, trainjob(name))
    placed = {name: wait_placed(env, namespace, name)[0] for name in names}
    stop = threading.Event()
    written: dict[str, int] = {}

    def relabel() -> None:
        round_ = 0
        while not stop.is_set():
            for name in names:
                env.manager.custom.patch_namespaced_custom_object(
                    *TRAINER, namespace, c.TRAINJOBS, name,
                    {"metadata": {"labels": {"round": str(round_)},
                                  "annotations": {f"touched-{round_ % 5}": "yes"}}},
                    _content_type="application/merge-patch+json")
                written[name] = round_
            round_ += 1

    storm = threading.Thread(target=relabel, daemon=True)
    storm.start()
    try:
        for name in names:
            complete_jobset(env.multicluster[placed[name]], namespace, name)
        for name in names:
            eventually(lambda n=name: get(env.manager, namespace, n),
                       lambda obj: any(x["type"] == "Complete" and x["status"] == "True"
                                       for x in (obj.get("status") or {}).get("conditions") or []),
                       expected=f"{name} Complete despite the concurrent updates")
    finally:
        stop.set()
        storm.join(10)
    for name in names:
        obj = get(env.manager, namespace, name)
        assert obj["metadata"]["labels"]["round"] == str(written[name]), "a user change was lost"
        assert obj["spec"]["managedBy"] == c.MANAGED_BY_MULTIKUEUE
