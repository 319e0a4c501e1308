"""The constrained scenario's mix of kinds, without clusters: which jobs become batch Jobs,
what such a Job asks for, how each contender submits it, and the command line refusing a
mix a contender cannot take (before any cluster starts)."""

from __future__ import annotations

import pytest

from bench import cli, compare, constrained
from bench.contenders import CONTENDERS
from bench.settings import preset
from clusters import kueue, kueue_queues, worker_stack
from trainjob import constants as c

MIX = ("trainjob", "batch-job")


def test_the_default_workload_is_all_trainjobs_and_the_mix_keeps_every_size():
    alone, mixed = constrained.workload(24), constrained.workload(24, kinds=MIX)
    assert {job.kind for job in alone} == {constrained.TRAINJOB}
    assert [(j.name, j.nodes, j.cpu, j.gpus, j.runtime) for j in alone] == \
        [(j.name, j.nodes, j.cpu, j.gpus, j.runtime) for j in mixed]
    kinds = [job.kind for job in mixed]
    assert kinds.count("batch-job") == kinds.count("trainjob") == 12, kinds
    # The GPU jobs (every fourth) alternate between the kinds too.
    gpu_kinds = [job.kind for job in mixed if job.gpus]
    assert gpu_kinds == ["batch-job", "trainjob"] * 3, gpu_kinds
    # At the smoke test's scale, both kinds are there.
    assert [job.kind for job in constrained.workload(4, kinds=MIX)] == \
        ["trainjob", "batch-job", "trainjob", "batch-job"]


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="jobset"):
        constrained.workload(4, kinds=("trainjob", "jobset"))


def test_a_batch_job_has_the_trainjobs_trainer_pods():
    job = next(j for j in constrained.workload(24, kinds=MIX)
               if j.kind == "batch-job" and j.gpus and j.nodes == 2)
    body = job.body()
    twin = constrained.Job(job.name, job.nodes, job.cpu, job.gpus, job.runtime).body()
    per_node = twin["spec"]["trainer"]["resourcesPerNode"]
    assert (body["apiVersion"], body["kind"]) == ("batch/v1", "Job")
    spec = body["spec"]
    assert spec["parallelism"] == spec["completions"] == job.nodes == \
        twin["spec"]["trainer"]["numNodes"]
    pod = spec["template"]
    assert pod["spec"]["containers"][0]["resources"] == per_node
    assert per_node["limits"] == {constrained.GPU: str(job.gpus)}
    assert pod["spec"]["nodeSelector"] == {constrained.POOL_LABEL: constrained.POOL}
    assert pod["metadata"]["annotations"][worker_stack.RUN_FOR_ANNOTATION] == \
        constrained.RUN_TIMES[job.runtime]


def test_kueue_contenders_queue_a_batch_job_and_standalone_takes_trainjobs_only():
    body = constrained.Job("mixed-001", 1, 2, 0, "bench-constrained-short",
                           "batch-job").body()
    queued = CONTENDERS["C"].submit(body)
    assert queued["metadata"]["labels"] == {c.KUEUE_QUEUE_NAME_LABEL: kueue_queues.LOCAL_QUEUE}
    assert "managedBy" not in queued["spec"], queued["spec"]
    assert [key for key, one in CONTENDERS.items() if "batch-job" in one.kinds] == \
        ["A", "B", "C"]


def test_every_kueue_runs_the_batch_job_integration_only_for_the_mix():
    assert compare.kueue_integrations(preset(True)) == kueue.INTEGRATIONS
    mixed = preset(True, constrained_kinds=MIX, contenders=("A", "C"))
    assert set(compare.kueue_integrations(mixed)) == {"batch/job", *kueue.INTEGRATIONS}
    assert compare.refused_contenders(mixed) == {}
    assert set(compare.refused_contenders(preset(True, constrained_kinds=MIX))) == {"D"}


@pytest.mark.parametrize("args, said", [
    (["--suite", "compare"], "D (this dispatcher standalone) dispatches trainjob only, "
                             "not batch-job"),
    (["--suite", "compare", "--contenders", "A,D"], "choose --contenders among A,B,C"),
    (["--suite", "dispatcher", "--contenders", "A"], "only the comparison's constrained run"),
    (["--suite", "compare", "--contenders", "A", "--compare-scenarios", "burst"],
     "only the comparison's constrained run"),
])
def test_the_command_line_refuses_a_mix_that_cannot_run(args, said, capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--quick", "--constrained-kinds", "trainjob,batch-job", *args,
                  "--output", str(tmp_path / "out")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err, f"expected {said!r} in the error, got:\n{err}"
    assert not (tmp_path / "out").exists(), "refused before anything ran or was written"
