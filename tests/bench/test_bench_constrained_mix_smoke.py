"""The comparison's constrained scenario with a mix of kinds at a tiny scale: four jobs on
two workers, TrainJobs and batch/v1 Jobs in turn, under C (Kueue with this dispatcher as
its external dispatcher), every Kueue running the batch/job integration. Every job of both
kinds reaches Complete on the manager; each batch Job's pods ran on a worker's kwok Nodes
(the worker's job controller), while the manager's Jobs are Kueue MultiKueue's and the
manager ran no pod."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.bench_compare

WORKERS = ("worker-1", "worker-2")
TINY = ["--quick", "--suite", "compare", "--contenders", "C", "--compare-scenarios",
        "constrained", "--constrained-kinds", "trainjob,batch-job", "--burst-workers", "2",
        "--concurrency", "2", "--constrained-jobs", "4", "--constrained-timeout", "90"]


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory, run_bench):
    return run_bench(TINY, tmp_path_factory.mktemp("bench-mix"), timeout=420)


def test_every_job_of_both_kinds_completes_and_batch_jobs_ran_on_workers(mix_run):
    _, stdout, results = mix_run
    assert "incomplete" not in results, results["incomplete"]
    comparison = results["comparison"]
    assert "batch/job" in comparison["kueue_integrations"], comparison["kueue_integrations"]
    mine = comparison["contenders"]["C"]
    # Only the constrained run was asked for.
    assert set(mine) == {"title", "constrained"}, list(mine)
    tight = mine["constrained"]
    assert tight["kind_mix"] == ["trainjob", "batch-job"], tight["kind_mix"]
    assert (tight["jobs"], tight["finished"], tight["missing"], tight["failed"]) == \
        (4, 4, 0, 0), tight
    assert tight["makespan_seconds"] is not None and tight["makespan_seconds"] > 0, tight
    kinds = tight["kinds"]
    assert set(kinds) == {"trainjob", "batch-job"}, list(kinds)
    for kind, figures in kinds.items():
        assert (figures["jobs"], figures["finished"], figures["missing"]) == (2, 2, 0), \
            (kind, figures)
        # All of each job's trainer pods were seen Running, on one of the workers.
        assert figures["never_all_running"] == 0, (kind, figures)
        assert set(figures["ran_on"].values()) <= set(WORKERS), (kind, figures["ran_on"])
        assert sum(figures["placements"].values()) >= 2, (kind, figures["placements"])
        assert figures["utilisation"]["cpu"] > 0, (kind, figures["utilisation"])
    batch = kinds["batch-job"]
    # The manager's batch Jobs are Kueue MultiKueue's, and the manager ran none of them.
    assert batch["manager"] == {"managed_by": {"kueue.x-k8s.io/multikueue": 2}, "pods": 0}, \
        batch["manager"]
    # The whole mix's figures add up from the kinds'.
    assert tight["pods_unschedulable"] == sum(k["pods_unschedulable"] for k in kinds.values())
    assert tight["copies_withdrawn"] == sum(k["copies_withdrawn"] for k in kinds.values())
    for text in ("constrained 4 jobs (trainjob, batch-job in turn): makespan s (finished/jobs)",
                 "constrained 4 jobs: the batch-jobs: makespan s (finished/jobs) | ",
                 "constrained 4 jobs: the trainjobs: pods unschedulable"):
        assert text in stdout, f"expected {text!r} in the printed table:\n{stdout}"
