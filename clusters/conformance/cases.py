"""The objects the conformance run applies to both controllers.

A case is a TrainJob (or none, for a runtime-only case) with the runtimes it needs. Four
sources:

* every runtime shipped in the Trainer module (``manifests/base/runtimes``), each with a
  TrainJob of two nodes that uses it;
* every TrainJob or runtime YAML under the module's ``examples/``, unchanged but for the
  TrainJob's name (two examples share one);
* the project's own cases: each plug-in's corners, runtimePatches, podGroupPolicy,
  podSpecOverrides and objects that must be refused;
* one object for each further way upstream's admission refuses (``refused``);
* TrainJobs created and then changed, for upstream's update rules (``updated``).

Upstream's objects are read from the module at run time, never copied into this repository.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from clusters import upstream_trainer
from clusters.conformance import refused, updated
from clusters.conformance.objects import Case, torch_runtime
from clusters.conformance.objects import job as _job
from clusters.conformance.objects import runtime as _runtime
from clusters.conformance.objects import trainjob as _trainjob
from trainjob import constants as c

RUNTIME_KINDS = (c.TRAININGRUNTIME_KIND, c.CLUSTERTRAININGRUNTIME_KIND)

# Why some of the project's cases differ on purpose (docs/conformance.md lists the same).
OVERRIDES_PRUNED = ("podSpecOverrides is the v2.0 API the project keeps; upstream v2.3's CRD "
                    "prunes it, so only the operator's JobSet has the override")
PATCH_OF_UNKNOWN_JOB = ("a runtime patch naming a replicated job the runtime lacks is refused "
                        "at admission; upstream merges it in as a new job and then cannot "
                        "build a valid JobSet")
ZERO_NODES = ("trainer.numNodes 0 is refused by the project's CRD (a job of no trainer "
              "pods); upstream's CRD accepts it and runs a JobSet of zero pods")
FLUX_WITHOUT_NODES = ("a Flux TrainJob without trainer.numNodes: upstream's controller fails on "
                      "it (a nil dereference) and never builds it; the operator runs the "
                      "runtime's node count")
EXAMPLES_DIR = "examples"
CONFORMANCE_PRIORITY = "cf-conformance-high"


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.yaml") if p.name != "kustomization.yaml")


def _load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def upstream_runtime_cases() -> list[Case]:
    """Each shipped runtime, run by a two-node TrainJob with a command of its own."""
    module = upstream_trainer.module_dir()
    cases = []
    for path in _yaml_files(module / upstream_trainer.RUNTIMES_DIR):
        for runtime in _load(path):
            if runtime.get("kind") not in RUNTIME_KINDS:
                continue
            name = runtime["metadata"]["name"]
            job_name = "rt-" + name.replace(".", "-")
            source = path.relative_to(module / upstream_trainer.RUNTIMES_DIR)
            cases.append(Case(job_name, f"{upstream_trainer.RUNTIMES_DIR}/{source}",
                              _trainjob(job_name, name, {"numNodes": 2}, kind=runtime["kind"]),
                              [runtime]))
    return cases


def upstream_example_cases() -> list[Case]:
    """Each example file's TrainJobs with the runtime they name: one of the examples', else
    a shipped one. A file of runtimes only is a runtime-only case."""
    module = upstream_trainer.module_dir()
    files = {path: _load(path) for path in _yaml_files(module / EXAMPLES_DIR)}
    runtimes = {r["metadata"]["name"]: r for case in upstream_runtime_cases()
                for r in case.runtimes}
    runtimes.update({d["metadata"]["name"]: d for documents in files.values()
                     for d in documents if d.get("kind") in RUNTIME_KINDS})
    cases = []
    for path, documents in files.items():
        jobs = [d for d in documents if d.get("kind") == c.TRAINJOB_KIND]
        source = str(path.relative_to(module))
        stem = "ex-" + path.stem.replace("_", "-").replace(".", "-")
        if not jobs:
            cases.append(Case(stem, source, None,
                              [d for d in documents if d.get("kind") in RUNTIME_KINDS]))
        for i, job in enumerate(jobs):
            job = copy.deepcopy(job)
            job["metadata"]["name"] = stem if len(jobs) == 1 else f"{stem}-{i}"
            ref = job["spec"].get("runtimeRef", {}).get("name")
            cases.append(Case(job["metadata"]["name"], source, job,
                              [runtimes[ref]] if ref in runtimes else []))
    return cases


def _flux_node(container: dict, init_container: dict) -> dict:
    """A trainer ``node`` job with one init container of the runtime's own."""
    return {"name": "node", "template": {
        "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
        "spec": {"template": {"spec": {"initContainers": [init_container],
                                       "containers": [container]}}}}}


def _volcano_priority(name: str, priority_class: str) -> dict:
    """A Volcano runtime whose trainer pods name ``priority_class``."""
    node = _job("node", c.ROLE_TRAINER)
    node["template"]["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return _runtime(name, {"numNodes": 1, "torch": {}}, [node], podGroupPolicy={"volcano": {}})


def project_cases() -> list[Case]:
    """Corners of each plug-in and of the TrainJob API, and objects both must refuse."""
    gpu = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}
    torch = torch_runtime()
    torch_gpu = _runtime("cf-torch-gpu", {"numNodes": 1, "torch": {}},
                         [_job("node", c.ROLE_TRAINER, resources=gpu)])
    mpi = _runtime("cf-mpi", {"numNodes": 1, "mpi": {"numProcPerNode": 2,
                                                     "mpiImplementation": "OpenMPI",
                                                     "runLauncherAsNode": False}},
                   [_job("launcher", c.ROLE_LAUNCHER, container="node"),
                    _job("node", c.ROLE_TRAINER, resources=gpu)])
    mpi_as_node = _runtime("cf-mpi-as-node", {"numNodes": 1, "mpi": {
        "numProcPerNode": 1, "mpiImplementation": "OpenMPI", "runLauncherAsNode": True}},
        [_job("node", container="node"), _job("launcher", c.ROLE_TRAINER, container="node")])
    mpi_gpus = _runtime("cf-mpi-gpus", {"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
                        [_job("node", container="node", resources=gpu),
                         _job("launcher", c.ROLE_TRAINER, container="node", resources=gpu)])
    coscheduling = _runtime("cf-coscheduling", {"numNodes": 2, "torch": {}},
                            [_job("node", c.ROLE_TRAINER)],
                            podGroupPolicy={"coscheduling": {"scheduleTimeoutSeconds": 60}})
    # Volcano: the queue from the runtime's annotation, the topology as given (its
    # PodGroup CRD is on both workers).
    volcano = _runtime("cf-volcano", {"numNodes": 2, "torch": {}},
                       [_job("node", c.ROLE_TRAINER)],
                       podGroupPolicy={"volcano": {"networkTopology": {
                           "mode": "soft", "highestTierAllowed": 2}}})
    volcano["spec"]["template"]["metadata"] = {
        "annotations": {"scheduling.volcano.sh/queue-name": "research"}}
    env_injection = _runtime(
        "cf-torch-env-injection",
        {"numNodes": 1, "torch": {"envInjection": {"targets": [
            {"jobName": "node", "containerNames": ["sidecar"]}]}}},
        [{**_job("node", c.ROLE_TRAINER), "template": {
            "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "node", "image": "node:v1"},
                {"name": "sidecar", "image": "sidecar:v1"}]}}}}}])
    flux = _runtime("cf-flux", {"numNodes": 1, "flux": {"numProcPerNode": 2}}, [_flux_node(
        {"name": "node", "image": "node:v1", "command": ["run"], "args": ["--verbose"],
         "env": [{"name": "FLUX_QUEUE_POLICY", "value": "easy"},
                 {"name": "FLUX_NETWORK_DEVICE", "value": "eth1"}],
         "resources": gpu},
        {"name": "prepare", "image": "prepare:v1"})])
    flux_reserved = _runtime("cf-bad-flux", {"numNodes": 1, "flux": {}}, [_flux_node(
        {"name": "node", "image": "node:v1"}, {"name": "flux-installer", "image": "mine:v1"})])
    cases = [
        Case("cf-torch-cpu", "project", _trainjob("cf-torch-cpu", "cf-torch", {
            "numNodes": 3, "env": [{"name": "PET_LOG_LEVEL", "value": "INFO"}]}), [torch]),
        Case("cf-torch-procs", "project", _trainjob("cf-torch-procs", "cf-torch", {
            "numNodes": 2, "numProcPerNode": 4,
            "resourcesPerNode": {"requests": {"memory": "1Gi"}}}), [torch]),
        Case("cf-torch-gpu", "project", _trainjob("cf-torch-gpu", "cf-torch-gpu",
                                                  {"numNodes": 2}), [torch_gpu]),
        Case("cf-torch-env-injection", "project", _trainjob(
            "cf-torch-env-injection", "cf-torch-env-injection", {"numNodes": 2}),
            [env_injection]),
        Case("cf-mpi-2", "project", _trainjob("cf-mpi-2", "cf-mpi", {"numNodes": 2}), [mpi]),
        Case("cf-mpi-default", "project", _trainjob("cf-mpi-default", "cf-mpi", {}), [mpi]),
        Case("cf-mpi-as-node-1", "project", _trainjob("cf-mpi-as-node-1", "cf-mpi-as-node",
                                                      {"numNodes": 1}), [mpi_as_node]),
        Case("cf-mpi-as-node-3", "project", _trainjob("cf-mpi-as-node-3", "cf-mpi-as-node",
                                                      {"numNodes": 3}), [mpi_as_node]),
        Case("cf-mpi-gpu-slots", "project", _trainjob("cf-mpi-gpu-slots", "cf-mpi-gpus",
                                                      {"numNodes": 2}), [mpi_gpus]),
        Case("cf-torchtune", "project", _trainjob(
            "cf-torchtune", "torchtune-llama3.2-1b", {"command": ["tune", "run"]}),
            [upstream_trainer.runtime("torchtune/llama3_2/llama3_2_1B.yaml")]),
        Case("cf-coscheduling", "project", _trainjob("cf-coscheduling", "cf-coscheduling",
                                                     {}), [coscheduling]),
        Case("cf-volcano", "project", _trainjob("cf-volcano", "cf-volcano", {}), [volcano]),
        # A priorityClassName that exists (the run creates it on both workers) reaches the
        # PodGroup.
        Case("cf-volcano-priority", "project", _trainjob("cf-volcano-priority",
                                                         "cf-volcano-priority", {}),
             [_volcano_priority("cf-volcano-priority", CONFORMANCE_PRIORITY)],
             priority_classes=(CONFORMANCE_PRIORITY,)),
        Case("cf-patches-sidecar", "project", _trainjob(
            "cf-patches-sidecar", "cf-torch", {"numNodes": 1},
            runtimePatches=[{"manager": "example.com/one", "trainingRuntimeSpec": {
                "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                    "spec": {"template": {"spec": {
                        "nodeSelector": {"pool": "b"},
                        "tolerations": [{"key": "a", "operator": "Exists"}]}}}}}]}}}},
                {"manager": "example.com/two", "trainingRuntimeSpec": {
                    "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                        "spec": {"template": {"spec": {
                            "nodeSelector": {"pool": "a"}}}}}}]}}}}]),
            [torch]),
        Case("cf-suspended", "project", _trainjob("cf-suspended", "cf-torch", {"numNodes": 2},
                                                  suspend=True), [torch]),
        Case("cf-overrides", "project", _trainjob(
            "cf-overrides", "cf-torch", {"numNodes": 1},
            podSpecOverrides=[{"targetJobs": [{"name": "node"}],
                               "nodeSelector": {"pool": "a"}}]), [torch],
             intended=OVERRIDES_PRUNED, intended_objects=("JobSet",)),
        Case("cf-flux-settings", "project", _trainjob("cf-flux-settings", "cf-flux", {
            "numNodes": 3, "args": ["--steps", "10"],
            "env": [{"name": "FLUX_VIEW_IMAGE", "value": "flux-view:rocky"}]}), [flux]),
        Case("cf-flux-no-nodes", "project", _trainjob("cf-flux-no-nodes", "cf-flux", {
            "command": ["train"]}), [flux], intended=FLUX_WITHOUT_NODES),
        # Upstream's JAX plug-in refuses none of its variables in trainer.env: the job's
        # value wins, and a variable the runtime lacks comes after the policy's.
        Case("cf-jax-env", "project", _trainjob("cf-jax-env", "jax-distributed", {
            "numNodes": 2, "env": [{"name": "APP_MODE", "value": "train"},
                                   {"name": "JAX_NUM_PROCESSES", "value": "4"},
                                   {"name": "JAX_COORDINATOR_ADDRESS", "value": "c:1234"}]}),
            [upstream_trainer.runtime("jax_distributed.yaml")]),
        Case("cf-xgboost-env", "project", _trainjob("cf-xgboost-env", "xgboost-distributed", {
            "numNodes": 2, "env": [{"name": "APP_MODE", "value": "train"}]}),
            [upstream_trainer.runtime("xgboost_distributed.yaml")]),
        # Refused by both.
        Case("cf-bad-flux-installer", "project", _trainjob(
            "cf-bad-flux-installer", "cf-bad-flux", {"numNodes": 1}), [flux_reserved]),
        Case("cf-bad-flux-procs", "project", _trainjob(
            "cf-bad-flux-procs", "cf-flux", {"numNodes": 1, "numProcPerNode": 0}), [flux]),
        Case("cf-bad-reserved-env", "project", _trainjob(
            "cf-bad-reserved-env", "cf-torch", {"env": [{"name": "PET_NNODES", "value": "2"}]}),
            [torch]),
        Case("cf-bad-managed-by", "project", _trainjob(
            "cf-bad-managed-by", "cf-torch", {}, managedBy="example.com/other"), [torch]),
        Case("cf-bad-patch-job", "project", _trainjob(
            "cf-bad-patch-job", "cf-torch", {},
            runtimePatches=[{"manager": "example.com/one", "trainingRuntimeSpec": {
                "template": {"spec": {"replicatedJobs": [{"name": "no-such-job"}]}}}}]),
            [torch], intended=PATCH_OF_UNKNOWN_JOB),
        Case("cf-bad-num-nodes", "project", _trainjob("cf-bad-num-nodes", "cf-torch",
                                                      {"numNodes": 0}), [torch],
             intended=ZERO_NODES),
        Case("cf-bad-patch-manager", "project", _trainjob(
            "cf-bad-patch-manager", "cf-torch", {},
            runtimePatches=[{"manager": "no-domain", "trainingRuntimeSpec": {}}]), [torch]),
        Case("cf-bad-mpi-env", "project", _trainjob(
            "cf-bad-mpi-env", "cf-mpi", {"env": [{"name": "OMPI_MCA_orte_set_default_slots",
                                                  "value": "4"}]}), [mpi]),
        Case("cf-bad-xgboost-env", "project", _trainjob(
            "cf-bad-xgboost-env", "xgboost-distributed",
            {"env": [{"name": "DMLC_NUM_WORKER", "value": "4"}]}),
            [upstream_trainer.runtime("xgboost_distributed.yaml")]),
        Case("cf-bad-torchtune-nodes", "project", _trainjob(
            "cf-bad-torchtune-nodes", "torchtune-llama3.2-1b",
            {"command": ["tune", "run"], "numNodes": 2}),
            [upstream_trainer.runtime("torchtune/llama3_2/llama3_2_1B.yaml")]),
        Case("cf-bad-env-injection", "project", _trainjob(
            "cf-bad-env-injection", "cf-bad-injection", {}), [_runtime(
                "cf-bad-injection", {"numNodes": 1, "torch": {"envInjection": {"targets": [
                    {"jobName": "node", "containerNames": ["absent"]}]}}},
                [_job("node", c.ROLE_TRAINER)])]),
        Case("cf-bad-runtime-step", "project", None, [_runtime(
            "cf-bad-step", {"numNodes": 1, "torch": {}},
            [_job("node", c.ROLE_TRAINER, container="main")])]),
        Case("cf-bad-runtime-two-policies", "project", None, [_runtime(
            "cf-bad-two-policies", {"numNodes": 1, "torch": {}, "mpi": {}},
            [_job("node", c.ROLE_TRAINER)])]),
        Case("cf-missing-runtime", "project", _trainjob("cf-missing-runtime", "cf-no-such",
                                                        {}), []),
    ]
    return cases


def all_cases() -> list[Case]:
    return (upstream_runtime_cases() + upstream_example_cases() + project_cases()
            + refused.refused_cases() + updated.update_cases()
            + updated.runtime_update_cases())
