"""Unit tests of the runtime plug-ins (torch, mpi, jax, xgboost, coscheduling, volcano): pure
functions over dicts, no cluster."""

from __future__ import annotations

import base64
import copy
from decimal import Decimal
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from trainjob import constants as c
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info, validate_policies
from trainjob.runtime.plugins import mpi as mpi_plugin
from trainjob.runtime.plugins import registered
from trainjob.runtime.plugins import torch as torch_plugin
from trainjob.runtime.podsets import RuntimeInfo

NAME = "llm"
NAMESPACE = "team-a"
GI = 1024 ** 3


# ---------------------------------------------------------------- builders


def _replicated_job(name: str, role: str | None, container: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [container]}}}}
    if role is not None:
        template["metadata"] = {"labels": {c.ANCESTOR_LABEL: role}}
    return {"name": name, "template": template}


def _initializers() -> list[dict[str, Any]]:
    return [
        _replicated_job(c.DATASET_INITIALIZER, c.ROLE_DATASET_INITIALIZER, {
            "name": c.DATASET_INITIALIZER, "image": "initializer:dataset",
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}),
        _replicated_job(c.MODEL_INITIALIZER, c.ROLE_MODEL_INITIALIZER, {
            "name": c.MODEL_INITIALIZER, "image": "initializer:model",
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}),
    ]


def _node(command: list[str] | None = None) -> dict[str, Any]:
    return _replicated_job(c.NODE, c.ROLE_TRAINER, {
        "name": c.NODE, "image": "trainer:latest", "command": command or ["torchrun", "train.py"],
        "resources": {"requests": {"cpu": "1"}}})


def runtime(ml_policy: dict[str, Any] | None, jobs: list[dict[str, Any]] | None = None,
            **template_spec: Any) -> TrainingRuntime:
    spec: dict[str, Any] = {"template": {"spec": {
        "replicatedJobs": jobs if jobs is not None else [*_initializers(), _node()],
        **template_spec}}}
    if ml_policy is not None:
        spec["mlPolicy"] = ml_policy
    return TrainingRuntime.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": "rt"}, "spec": spec})


def torch_runtime(num_proc: int | str | None = None, **kwargs: Any) -> TrainingRuntime:
    torch: dict[str, Any] = {} if num_proc is None else {"numProcPerNode": num_proc}
    return runtime({"numNodes": 1, "torch": torch}, **kwargs)


def mpi_runtime(jobs: list[dict[str, Any]] | None = None, **mpi: Any) -> TrainingRuntime:
    return runtime({"numNodes": 1, "mpi": {"numProcPerNode": 2, **mpi}},
                   jobs if jobs is not None else [*_initializers(), _node(["/usr/sbin/sshd"])])


def trainjob(trainer: dict[str, Any] | None = None, **spec: Any) -> TrainJob:
    body: dict[str, Any] = {"runtimeRef": {"name": "rt"}, **spec}
    if trainer is not None:
        body["trainer"] = trainer
    return TrainJob.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u-1"}, "spec": body})


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in container.get("env", [])}


def snapshot(info: RuntimeInfo) -> Any:
    return copy.deepcopy(([(p.role, p.job) for p in info.pod_sets], info.objects,
                          info.jobset_spec, info.labels, info.annotations))


def node_container(info: RuntimeInfo) -> dict[str, Any]:
    container = info.pod_set(c.NODE).container(c.NODE)
    assert container is not None
    return container


# ---------------------------------------------------------------- registry


def test_plugins_registered_and_enabled_by_framework():
    plugins = {p.name: p for p in registered()}
    assert {"torch", "mpi", "jax", "xgboost"} <= set(plugins)
    assert build_runtime_info(trainjob(), runtime(None)).policy.framework == "plain"
    assert build_runtime_info(trainjob(), torch_runtime()).policy.framework == "torch"
    info = build_runtime_info(trainjob(), mpi_runtime())
    assert info.policy.framework == "mpi"
    assert plugins["torch"].enabled(info.policy) is False
    assert plugins["mpi"].enabled(info.policy) is True


# ---------------------------------------------------------------- torch


def test_torch_env_port_and_counts_for_100_nodes():
    job = trainjob({"numNodes": 100, "resourcesPerNode": {
        "requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": 1}}})
    info = build_runtime_info(job, torch_runtime())

    node = info.pod_set(c.NODE)
    assert node.role == c.ROLE_TRAINER
    assert node.job["replicas"] == 1
    assert node.job_spec["parallelism"] == 100 and node.job_spec["completions"] == 100
    assert node.count == 100

    env = env_of(node_container(info))
    assert env["PET_NNODES"] == "100"
    assert env["PET_NPROC_PER_NODE"] == "auto"
    assert env["PET_NODE_RANK"] == {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["PET_MASTER_ADDR"] == f"{NAME}-node-0-0.{NAME}"
    assert env["PET_MASTER_PORT"] == "29500"
    assert node_container(info)["ports"] == [{"containerPort": 29500}]

    totals = info.totals
    assert totals.pods == 102
    assert totals.requests["cpu"] == Decimal(100 * 4 + 2 + 1)
    assert totals.requests["memory"] == Decimal((100 * 8 + 4 + 2) * GI)
    assert totals.requests["nvidia.com/gpu"] == Decimal(100)
    assert totals.as_strings() == {"cpu": "403", "memory": str((100 * 8 + 4 + 2) * GI),
                                   "nvidia.com/gpu": "100"}


def test_torch_initializers_untouched():
    info = build_runtime_info(trainjob({"numNodes": 3}), torch_runtime())
    for name in (c.DATASET_INITIALIZER, c.MODEL_INITIALIZER):
        pod_set = info.pod_set(name)
        assert pod_set.count == 1
        assert not any(k.startswith("PET_") for k in env_of(pod_set.containers[0]))
        assert "ports" not in pod_set.containers[0]


@pytest.mark.parametrize(("job_value", "runtime_value", "expected"), [
    (None, None, "1"),  # auto, no GPU: the node's one requested cpu
    (None, "gpu", "gpu"),
    (None, 2, "2"),
    (8, "gpu", "8"),
    ("cpu", 4, "cpu"),
])
def test_torch_num_proc_per_node_precedence(job_value, runtime_value, expected):
    trainer = {} if job_value is None else {"numProcPerNode": job_value}
    info = build_runtime_info(trainjob(trainer), torch_runtime(runtime_value))
    assert env_of(node_container(info))["PET_NPROC_PER_NODE"] == expected


@pytest.mark.parametrize(("resources", "expected"), [
    ({"requests": {"cpu": "8"}}, "8"),
    ({"requests": {"cpu": "1500m"}}, "2"),  # rounded up
    ({"limits": {"cpu": "3"}}, "3"),  # no request: the limit
    ({"requests": {"memory": "1Gi"}}, "1"),  # no cpu at all: at least 1
    ({"requests": {"cpu": "8"}, "limits": {"nvidia.com/gpu": 2}}, "auto"),  # GPUs: torchrun's
])
def test_torch_auto_num_proc_per_node_derived_from_the_node_resources(resources, expected):
    info = build_runtime_info(trainjob({"resourcesPerNode": resources}), torch_runtime())
    assert env_of(node_container(info))["PET_NPROC_PER_NODE"] == expected


def test_torch_auto_num_proc_per_node_from_the_runtime_resources():
    node = _node()
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "6"}}
    info = build_runtime_info(trainjob(), torch_runtime(jobs=[node]))
    assert env_of(node_container(info))["PET_NPROC_PER_NODE"] == "6"


def test_resources_per_node_merged_onto_the_runtimes():
    node = _node()
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    job = trainjob({"resourcesPerNode": {"requests": {"cpu": "4"},
                                         "limits": {"nvidia.com/gpu": 1}}})
    info = build_runtime_info(job, torch_runtime(jobs=[node]))
    assert node_container(info)["resources"] == {
        "requests": {"cpu": "4", "memory": "4Gi"},
        "limits": {"memory": "8Gi", "nvidia.com/gpu": 1}}


def test_trainer_fields_go_only_to_the_labelled_trainer_step():
    # DeepSpeed/MLX shape: the launcher is the labelled trainer; the unlabelled node job
    # runs sshd and keeps it, but gets the trainer's env and resources (launcher as node).
    sshd = _replicated_job(c.NODE, None, {"name": c.NODE, "image": "ds:1",
                                          "command": ["/usr/sbin/sshd"]})
    launcher = _replicated_job(c.LAUNCHER, c.ROLE_TRAINER, {"name": c.NODE, "image": "ds:1"})
    job = trainjob({"image": "ds:2", "command": ["mpirun"], "args": ["train.py"], "numNodes": 3,
                    "env": [{"name": "LR", "value": "1"}],
                    "resourcesPerNode": {"requests": {"cpu": "2"}}})
    info = build_runtime_info(job, mpi_runtime([sshd, launcher], runLauncherAsNode=True))
    node, launch = info.pod_set(c.NODE).container(c.NODE), info.pod_set(c.LAUNCHER).container(
        c.NODE)
    assert info.pod_set(c.NODE).role == ""
    assert (node["image"], node["command"], node.get("args")) == ("ds:1", ["/usr/sbin/sshd"],
                                                                  None)
    assert (launch["image"], launch["command"], launch["args"]) == ("ds:2", ["mpirun"],
                                                                    ["train.py"])
    for container in (node, launch):
        assert env_of(container)["LR"] == "1"
        assert container["resources"] == {"requests": {"cpu": "2"}}
    assert (info.pod_set(c.NODE).count, info.pod_set(c.LAUNCHER).count) == (2, 1)


def test_torch_nnodes_from_runtime_default_and_subdomain():
    rt = runtime({"numNodes": 4, "torch": {}}, network={"subdomain": "svc"})
    info = build_runtime_info(trainjob(), rt)
    env = env_of(node_container(info))
    assert env["PET_NNODES"] == "4"
    assert env["PET_MASTER_ADDR"] == f"{NAME}-node-0-0.svc"


def test_torch_keeps_user_env_and_overwrites_nothing_else():
    job = trainjob({"env": [{"name": "LR", "value": "0.1"}]})
    info = build_runtime_info(job, torch_runtime())
    names = [v["name"] for v in node_container(info)["env"]]
    assert names[0] == "LR"
    assert names.count("PET_NNODES") == 1


def test_torch_port_not_duplicated_when_runtime_declares_29500():
    node = _node()
    node["template"]["spec"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "rdzv", "containerPort": 29500}]
    info = build_runtime_info(trainjob(), torch_runtime(jobs=[node]))
    assert node_container(info)["ports"] == [{"name": "rdzv", "containerPort": 29500}]


def test_torch_apply_is_idempotent():
    job = trainjob({"numNodes": 5, "numProcPerNode": 2})
    info = build_runtime_info(job, torch_runtime())
    before = snapshot(info)
    torch_plugin.TorchPlugin().enforce_ml_policy(info, job)
    torch_plugin.TorchPlugin().enforce_ml_policy(info, job)
    assert snapshot(info) == before


def test_torch_refuses_reserved_env_names():
    job = trainjob(
        {"env": [{"name": "LR", "value": "1"}, {"name": "PET_NNODES", "value": "7"}]},
        podSpecOverrides=[
            {"targetJobs": [{"name": c.DATASET_INITIALIZER}],
             "containers": [{"name": c.DATASET_INITIALIZER,
                             "env": [{"name": "PET_IGNORED", "value": "x"}]}]},
            {"targetJobs": [{"name": c.NODE}],
             "containers": [{"name": "sidecar", "env": [{"name": "PET_SIDE", "value": "x"}]},
                            {"name": c.NODE, "env": [{"name": "A", "value": "1"},
                                                     {"name": "PET_MASTER_ADDR",
                                                      "value": "evil"}]}]},
        ])
    # Only torchrun's five names are reserved (upstream's list); other PET_* are the user's.
    job.spec.trainer.env.append({"name": "PET_RDZV_BACKEND", "value": "c10d"})
    info = build_runtime_info(job, torch_runtime())
    problems = validate_policies(info, job)
    # Upstream's field: spec.trainer.env as a whole, the reason naming the variables.
    assert [path for path, _ in problems] == [
        "spec.trainer.env",
        "spec.podSpecOverrides[1].containers[1].env[1].name",
    ]
    assert problems[0][1].startswith("PET_NNODES: reserved, the torch policy sets")
    assert problems[1][1].startswith("PET_MASTER_ADDR is reserved")
    # Why: overrides are applied after the policies and would win.
    assert env_of(node_container(info))["PET_MASTER_ADDR"] == "evil"


def test_torch_accepts_clean_job_and_checks_num_proc_words():
    rt = torch_runtime()
    ok = trainjob({"numProcPerNode": "gpu", "env": [{"name": "LR", "value": "1"}]})
    assert validate_policies(build_runtime_info(ok, rt), ok) == []
    bad = trainjob({"numProcPerNode": "many"})
    problems = validate_policies(build_runtime_info(bad, rt), bad)
    assert [p for p, _ in problems] == ["spec.trainer.numProcPerNode"]


def test_plain_runtime_gets_no_torch_env():
    job = trainjob({"numNodes": 3})
    info = build_runtime_info(job, runtime(None))
    assert info.policy.framework == "plain"
    container = node_container(info)
    assert not any(k.startswith("PET_") for k in env_of(container))
    assert "ports" not in container
    assert info.pod_set(c.LAUNCHER) is None and info.objects == []
    assert validate_policies(info, trainjob({"env": [{"name": "PET_X", "value": "1"}]})) == []


# ---------------------------------------------------------------- mpi


def _volume(pod_set, name):
    return next((v for v in pod_set.volumes if v["name"] == name), None)


def _mount(container, name):
    return next((m for m in container.get("volumeMounts", []) if m["name"] == name), None)


def _object(info, kind):
    found = [o.body for o in info.objects if o.body["kind"] == kind]
    assert len(found) == 1
    return found[0]


def test_mpi_adds_launcher_first_and_keeps_n_nodes():
    info = build_runtime_info(trainjob({"numNodes": 4}), mpi_runtime())
    assert [p.name for p in info.pod_sets] == [
        c.LAUNCHER, c.DATASET_INITIALIZER, c.MODEL_INITIALIZER, c.NODE]
    launcher = info.pod_set(c.LAUNCHER)
    assert launcher.role == c.ROLE_LAUNCHER
    assert launcher.count == 1 and launcher.job_spec["parallelism"] == 1
    assert [x["name"] for x in launcher.containers] == [c.LAUNCHER]
    assert launcher.containers[0]["image"] == "trainer:latest"
    assert c.ANCESTOR_LABEL not in launcher.job["template"]["metadata"]["labels"]
    assert info.pod_set(c.NODE).count == 4
    assert info.totals.pods == 1 + 4 + 2
    assert info.totals.requests["cpu"] == Decimal(1 + 4 + 2 + 1)


@pytest.mark.parametrize(("num_nodes", "as_node", "node_pods"), [
    (4, False, 4), (4, True, 3), (1, False, 1), (1, True, 1), (2, True, 1),
])
def test_mpi_node_count_with_and_without_launcher_as_node(num_nodes, as_node, node_pods):
    info = build_runtime_info(trainjob({"numNodes": num_nodes}),
                              mpi_runtime(runLauncherAsNode=as_node))
    node = info.pod_set(c.NODE)
    assert node.count == node_pods
    assert node.job["replicas"] == 1
    assert node.job_spec["completions"] == node_pods
    assert info.pod_set(c.LAUNCHER).count == 1


def test_mpi_uses_runtime_launcher_and_resets_its_count():
    launcher = _replicated_job(c.LAUNCHER, c.ROLE_TRAINER, {  # upstream-style labelling
        "name": c.NODE, "image": "launcher:1", "resources": {"requests": {"cpu": "500m"}}})
    info = build_runtime_info(trainjob({"numNodes": 3}),
                              mpi_runtime(jobs=[launcher, _node(["sshd"])]))
    assert [p.name for p in info.pod_sets] == [c.LAUNCHER, c.NODE]
    assert info.pod_set(c.LAUNCHER).count == 1
    container = info.pod_set(c.LAUNCHER).container(c.NODE)
    assert _mount(container, "mpi-hostfile") == {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}
    assert env_of(container)["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert info.totals.pods == 4
    assert info.totals.as_strings()["cpu"] == "3500m"


def test_mpi_hostfile_content():
    info = build_runtime_info(trainjob({"numNodes": 3}), mpi_runtime())
    cm = _object(info, "ConfigMap")
    assert cm["apiVersion"] == "v1"
    assert cm["metadata"] == {"name": f"{NAME}-mpi-hostfile", "namespace": NAMESPACE}
    assert cm["data"]["hostfile"] == "".join(
        f"{NAME}-node-0-{i}.{NAME} slots=2\n" for i in range(3))


def test_mpi_hostfile_with_launcher_as_node_and_job_slots():
    info = build_runtime_info(trainjob({"numNodes": 3, "numProcPerNode": 8}),
                              mpi_runtime(runLauncherAsNode=True))
    assert _object(info, "ConfigMap")["data"]["hostfile"] == (
        f"{NAME}-launcher-0-0.{NAME} slots=8\n"
        f"{NAME}-node-0-0.{NAME} slots=8\n"
        f"{NAME}-node-0-1.{NAME} slots=8\n")  # the made launcher comes first in the template
    env = env_of(info.pod_set(c.LAUNCHER).container(c.LAUNCHER))
    assert env["OMPI_MCA_orte_set_default_slots"] == "8"


@pytest.mark.parametrize(("mpi_settings", "expected"), [
    ({}, 2),
    ({"numProcPerNode": None}, 1),
])
def test_mpi_slots_fallbacks(mpi_settings, expected):
    rt = runtime({"numNodes": 1, "mpi": mpi_settings or {"numProcPerNode": 2}})
    info = build_runtime_info(trainjob({"numProcPerNode": "auto"}), rt)
    assert _object(info, "ConfigMap")["data"]["hostfile"] == (
        f"{NAME}-node-0-0.{NAME} slots={expected}\n")


def test_mpi_secret_is_created_once_with_fresh_keys():
    info = build_runtime_info(trainjob({"numNodes": 2}), mpi_runtime())
    (secret,) = [o for o in info.objects if o.body["kind"] == "Secret"]
    assert secret.body == {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": f"{NAME}-mpi-ssh-auth", "namespace": NAMESPACE},
        "type": "kubernetes.io/ssh-auth", "immutable": True,
    }
    assert secret.create_only and set(secret.make_content()["data"]) == {
        "ssh-privatekey", "ssh-publickey"}
    assert all("ownerReferences" not in o.body["metadata"] for o in info.objects)
    # Deterministic: a second build gives the same objects.
    again = build_runtime_info(trainjob({"numNodes": 2}), mpi_runtime())
    assert [o.body for o in again.objects] == [o.body for o in info.objects]


@pytest.mark.parametrize(("mount_path", "expected"), [
    (None, "/root/.ssh"), ("/home/mpiuser/.ssh", "/home/mpiuser/.ssh")])
def test_mpi_ssh_and_hostfile_mounts(mount_path, expected):
    settings = {} if mount_path is None else {"sshAuthMountPath": mount_path}
    info = build_runtime_info(trainjob({"numNodes": 2}), mpi_runtime(**settings))
    ssh_volume = {"name": "mpi-ssh-auth", "secret": {
        "secretName": f"{NAME}-mpi-ssh-auth", "defaultMode": 0o400,
        "items": [{"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                  {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
                  {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644}]}}
    ssh_mount = {"name": "mpi-ssh-auth", "mountPath": expected}
    launcher, node = info.pod_set(c.LAUNCHER), info.pod_set(c.NODE)
    for pod_set, container in ((launcher, c.LAUNCHER), (node, c.NODE)):
        assert _volume(pod_set, "mpi-ssh-auth") == ssh_volume
        assert _mount(pod_set.container(container), "mpi-ssh-auth") == ssh_mount
    assert _volume(launcher, "mpi-hostfile") == {"name": "mpi-hostfile", "configMap": {
        "name": f"{NAME}-mpi-hostfile",
        "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}]}}
    assert _mount(launcher.container(c.LAUNCHER), "mpi-hostfile")["mountPath"] == "/etc/mpi"
    assert _volume(node, "mpi-hostfile") is None
    assert _mount(node.container(c.NODE), "mpi-hostfile") is None
    for name in (c.DATASET_INITIALIZER, c.MODEL_INITIALIZER):
        assert info.pod_set(name).volumes == []


@pytest.mark.parametrize(("implementation", "expected"), [
    (None, {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": "2"}),
    ("OpenMPI", {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                 "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                 "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                 "OMPI_MCA_orte_set_default_slots": "2"}),
    ("Intel", {"I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile"}),
    ("MPICH", {"HYDRA_HOST_FILE": "/etc/mpi/hostfile"}),
])
def test_mpi_implementation_env(implementation, expected):
    settings = {} if implementation is None else {"mpiImplementation": implementation}
    info = build_runtime_info(trainjob({"numNodes": 2}), mpi_runtime(**settings))
    assert env_of(info.pod_set(c.LAUNCHER).container(c.LAUNCHER)) == expected
    node_env = env_of(node_container(info))
    assert not any(k.startswith(("OMPI_", "I_MPI_", "HYDRA_", "PET_")) for k in node_env)


def test_mpi_hydra_hostfile_format():
    info = build_runtime_info(trainjob({"numNodes": 2}), mpi_runtime(mpiImplementation="MPICH"))
    assert _object(info, "ConfigMap")["data"]["hostfile"] == (
        f"{NAME}-node-0-0.{NAME}:2\n{NAME}-node-0-1.{NAME}:2\n")


@pytest.mark.parametrize("as_node", [False, True])
def test_mpi_apply_is_idempotent(as_node):
    job = trainjob({"numNodes": 4})
    info = build_runtime_info(job, mpi_runtime(runLauncherAsNode=as_node))
    before = snapshot(info)
    mpi_plugin.MPIPlugin().enforce_ml_policy(info, job)
    mpi_plugin.MPIPlugin().enforce_ml_policy(info, job)
    assert snapshot(info) == before
    assert info.pod_set(c.NODE).count == (3 if as_node else 4)


def test_mpi_validate():
    rt = mpi_runtime()
    for ok in (trainjob(), trainjob({"numNodes": 1}), trainjob({"numProcPerNode": 4})):
        assert validate_policies(build_runtime_info(ok, rt), ok) == []
    bad = trainjob({"numProcPerNode": "auto"})
    problems = validate_policies(build_runtime_info(bad, rt), bad)
    assert [p for p, _ in problems] == ["spec.trainer.numProcPerNode"]


def test_mpi_as_node_on_two_nodes_needs_the_runtime_to_have_launcher_and_node():
    # The runtime has only a node job: the launcher made for it does not count (upstream
    # judges the runtime's own jobs).
    rt = mpi_runtime(runLauncherAsNode=True)
    one, two = trainjob({"numNodes": 1}), trainjob({"numNodes": 2})
    assert validate_policies(build_runtime_info(one, rt), one) == []
    problems = validate_policies(build_runtime_info(two, rt), two)
    assert [p for p, _ in problems] == ["spec.trainer.numNodes"]


def test_generate_ssh_secret_data_is_a_matching_pair_as_upstream_lays_it_out():
    data = mpi_plugin.generate_ssh_secret_data()
    assert set(data) == {"ssh-privatekey", "ssh-publickey"}
    private_pem = base64.b64decode(data["ssh-privatekey"])
    authorized = base64.b64decode(data["ssh-publickey"])
    assert private_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    key = serialization.load_pem_private_key(private_pem, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    assert authorized == public + b"\n"
    assert authorized.startswith(b"ecdsa-sha2-nistp521 ")
    assert mpi_plugin.generate_ssh_secret_data() != data  # fresh every call


# ---------------------------------------------------------------- jax, xgboost


def test_jax_environment_on_the_trainer_only():
    info = build_runtime_info(trainjob({"numNodes": 3}), runtime({"jax": {}}))
    container = node_container(info)
    assert env_of(container) == {
        "JAX_NUM_PROCESSES": "3",
        "JAX_PROCESS_ID": {"fieldRef": {"fieldPath": torch_plugin.COMPLETION_INDEX_FIELD}},
        "JAX_COORDINATOR_ADDRESS": f"{NAME}-node-0-0.{NAME}:29500"}
    assert container["ports"] == [{"containerPort": 29500}]
    initializer = info.pod_set(c.DATASET_INITIALIZER).container(c.DATASET_INITIALIZER)
    assert not any(name.startswith("JAX_") for name in env_of(initializer))


def test_xgboost_workers_count_gpus_and_reserved_names_are_refused():
    job = trainjob({"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "4"}}})
    info = build_runtime_info(job, runtime({"xgboost": {}}))
    env = env_of(node_container(info))
    assert (env["DMLC_TRACKER_URI"], env["DMLC_TRACKER_PORT"], env["DMLC_NUM_WORKER"]) == (
        f"{NAME}-node-0-0.{NAME}", "29500", "8")
    bad = trainjob({"env": [{"name": "DMLC_TASK_ID", "value": "0"}]})
    problems = validate_policies(build_runtime_info(bad, runtime({"xgboost": {}})), bad)
    # Upstream's field and kind: the entry, Forbidden.
    assert problems == [("spec.trainer.env[0]", problems[0][1], "Forbidden")]
    assert problems[0][1].startswith("DMLC_TASK_ID is reserved")


# ---------------------------------------------------------------- torch: envInjection, torchtune


def test_torch_env_injection_reaches_the_named_sidecar():
    node = _node()
    node["template"]["spec"]["template"]["spec"]["containers"].append(
        {"name": "monitor", "image": "monitor:1"})
    rt = runtime({"torch": {"envInjection": {"targets": [
        {"jobName": c.NODE, "containerNames": ["monitor"]}]}}}, [node])
    info = build_runtime_info(trainjob({"numNodes": 2}), rt)
    monitor = info.pod_set(c.NODE).container("monitor")
    assert env_of(monitor)["PET_NNODES"] == "2"
    assert env_of(monitor)["PET_MASTER_PORT"] == "29500"
    missing = runtime({"torch": {"envInjection": {"targets": [
        {"jobName": c.NODE, "containerNames": ["absent"]}]}}}, [_node()])
    job = trainjob()
    with pytest.raises(ValueError, match="absent"):
        build_runtime_info(job, missing)


def _torchtune_runtime() -> TrainingRuntime:
    node = _node(["tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
                  "--config", "llama3_2/1B_full", "output_dir=/workspace/output",
                  "tokenizer.path=/workspace/model/tokenizer.model"])
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 2}}
    model = runtime({"numNodes": 1, "torch": {}}, [node]).model_dump(by_alias=True)
    model["metadata"]["name"] = "torchtune-llama3.2-1b"
    return TrainingRuntime.model_validate(model)


@pytest.mark.parametrize(("trainer", "expected"), [
    ({}, ["tune", "run", f"--rdzv_endpoint={NAME}-node-0-0.{NAME}:29500",
          "full_finetune_distributed", "--config", "llama3_2/1B_full"]),
    ({"numProcPerNode": 1}, ["tune", "run", "full_finetune_single_device", "--config",
                             "llama3_2/1B_full_single_device"]),
    ({"numProcPerNode": 1, "args": ["model.lora_attn_modules=[q_proj]"]},
     ["tune", "run", "lora_finetune_single_device", "--config",
      "llama3_2/1B_lora_single_device"]),
])
def test_torchtune_command_is_made_from_tune_run(trainer, expected):
    job = trainjob({"command": ["tune", "run"], **trainer},
                   runtimeRef={"name": "torchtune-llama3.2-1b"})
    info = build_runtime_info(job, _torchtune_runtime())
    container = node_container(info)
    assert container["command"] == expected + ["output_dir=/workspace/output",
                                               "tokenizer.path=/workspace/model/tokenizer.model"]
    assert "PET_MASTER_ADDR" not in env_of(container)
    assert env_of(container)["PET_NNODES"] == "1"


def test_torchtune_refuses_what_upstream_refuses():
    job = trainjob({"command": ["tune", "run"], "numNodes": 2,
                    "args": ["output_dir=/elsewhere"]},
                   runtimeRef={"name": "torchtune-llama3.2-1b"})
    problems = validate_policies(build_runtime_info(job, _torchtune_runtime()), job)
    assert [p for p, _ in problems] == ["spec.trainer.numNodes", "spec.trainer.args[0]"]


def _renamed(rt: TrainingRuntime, name: str) -> TrainingRuntime:
    model = rt.model_dump(by_alias=True)
    model["metadata"]["name"] = name
    return TrainingRuntime.model_validate(model)


QLORA = ["model.quantize_base=True"]


@pytest.mark.parametrize(("name", "trainer", "fields"), [
    # QLoRA on several devices of a Llama 3.2 model (the runtime's node has 2 GPUs).
    ("torchtune-llama3.2-1b", {}, ["spec.trainer.numProcPerNode",
                                   "spec.trainer.resourcesPerNode"]),
    # One process on one device: QLoRA's single-device recipe.
    ("torchtune-llama3.2-1b", {"numProcPerNode": 1}, []),
    # No QLoRA recipe for Qwen at all, single device or not.
    ("torchtune-qwen2.5-1.5b", {"numProcPerNode": 1}, ["spec.runtimeRef.name"]),
])
def test_torchtune_qlora_runs_where_upstream_has_a_recipe(name, trainer, fields):
    job = trainjob({"command": ["tune", "run"], "args": QLORA, **trainer},
                   runtimeRef={"name": name})
    rt = _renamed(_torchtune_runtime(), name)
    problems = validate_policies(build_runtime_info(job, rt), job)
    assert [p for p, _ in problems] == fields


# ---------------------------------------------------------------- pod groups


def test_coscheduling_labels_every_pod_and_builds_the_pod_group():
    spec = torch_runtime().model_dump(by_alias=True)
    spec["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 30}}
    info = build_runtime_info(trainjob({"numNodes": 4}), TrainingRuntime.model_validate(spec))
    for pod_set in info.pod_sets:
        labels = pod_set.job_spec["template"]["metadata"]["labels"]
        assert labels["scheduling.x-k8s.io/pod-group"] == NAME
    (group,) = [o.body for o in info.objects if o.body["kind"] == "PodGroup"]
    assert group == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"minMember": 6, "minResources": {"cpu": "7", "memory": "6Gi"},
                 "scheduleTimeoutSeconds": 30}}


def test_volcano_annotates_pods_and_takes_the_queue_from_the_job():
    spec = torch_runtime().model_dump(by_alias=True)
    spec["spec"]["podGroupPolicy"] = {"volcano": {}}
    info = build_runtime_info(
        trainjob({"numNodes": 1}, annotations={"scheduling.volcano.sh/queue-name": "q1"}),
        TrainingRuntime.model_validate(spec))
    annotations = info.pod_set(c.NODE).job_spec["template"]["metadata"]["annotations"]
    assert annotations == {"scheduling.k8s.io/group-name": NAME}
    (group,) = [o.body for o in info.objects if o.body["kind"] == "PodGroup"]
    assert (group["apiVersion"], group["spec"]["queue"], group["spec"]["minMember"]) == (
        "scheduling.volcano.sh/v1beta1", "q1", 3)


def test_jax_variables_in_trainer_env_are_admitted_and_the_jobs_values_win():
    # Upstream's JAX plug-in refuses nothing; its builder lays trainer.env over the policy's
    # variables, so those the runtime lacks come after them.
    job = trainjob({"numNodes": 2, "env": [{"name": "A", "value": "1"},
                                           {"name": "JAX_NUM_PROCESSES", "value": "7"}]})
    info = build_runtime_info(job, runtime({"jax": {}}))
    assert validate_policies(info, job) == []
    assert [(v["name"], v.get("value")) for v in node_container(info)["env"]] == [
        ("JAX_NUM_PROCESSES", "7"), ("JAX_PROCESS_ID", None),
        ("JAX_COORDINATOR_ADDRESS", f"{NAME}-node-0-0.{NAME}:29500"), ("A", "1")]


def test_xgboost_variables_come_after_the_trainer_env():
    node = _node()
    node["template"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "B", "value": "runtime"}]
    job = trainjob({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "job"}]})
    info = build_runtime_info(job, runtime({"xgboost": {}}, [node]))
    assert [(v["name"], v.get("value")) for v in node_container(info)["env"]][:2] == [
        ("B", "job"), ("A", "1")]
    assert [v["name"] for v in node_container(info)["env"]][2:] == [
        "DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"]
