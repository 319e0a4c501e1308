"""Unit tests of the flux policy plug-in: the node job's installer, volumes and wrapped
command, the scripts ConfigMap and CURVE Secret it builds, and what it refuses. Pure
functions over dicts, no cluster."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from trainjob import constants as c
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info, validate_policies
from trainjob.runtime.plugins import flux_curve, flux_scripts, registered
from trainjob.runtime.podsets import RuntimeInfo

NAME = "lammps"
NAMESPACE = "hpc"
UID = "test-uid"
SCRIPTS = f"{NAME}-flux-entrypoint"
CURVE = f"{NAME}-flux-curve"


def flux_runtime(container: dict[str, Any] | None = None, flux: dict[str, Any] | None = None,
                 init_containers: list[dict[str, Any]] | None = None,
                 num_nodes: int = 1, policy: str = "flux") -> TrainingRuntime:
    pod: dict[str, Any] = {"containers": [{"name": c.NODE, "image": "ubuntu:jammy",
                                           **(container or {})}]}
    if init_containers is not None:
        pod["initContainers"] = init_containers
    return TrainingRuntime.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": "flux-distributed"},
        "spec": {"mlPolicy": {"numNodes": num_nodes,
                              policy: {"numProcPerNode": 1} if flux is None else flux},
                 "template": {"spec": {"replicatedJobs": [{"name": c.NODE, "template": {
                     "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                     "spec": {"template": {"spec": pod}}}}]}}}})


def trainjob(trainer: dict[str, Any] | None) -> TrainJob:
    spec: dict[str, Any] = {"runtimeRef": {"name": "flux-distributed"}}
    if trainer is not None:
        spec["trainer"] = trainer
    return TrainJob.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID}, "spec": spec})


def build(trainer: dict[str, Any] | None, runtime: TrainingRuntime | None = None) -> RuntimeInfo:
    return build_runtime_info(trainjob(trainer), runtime or flux_runtime())


def pod(info: RuntimeInfo) -> dict[str, Any]:
    return info.pod_set(c.NODE).pod_spec


def node(info: RuntimeInfo) -> dict[str, Any]:
    container = info.pod_set(c.NODE).container(c.NODE)
    assert container is not None
    return container


def scripts(info: RuntimeInfo) -> dict[str, str]:
    (config_map,) = [o.body for o in info.objects if o.body["kind"] == "ConfigMap"]
    return config_map["data"]


def script_line(text: str, start: str) -> str:
    (line,) = [x for x in text.splitlines() if x.lstrip().startswith(start)]
    return line.strip()


# ---------------------------------------------------------------- the node job


def test_flux_is_registered_and_takes_part_only_for_a_flux_policy():
    plugins = {p.name: p for p in registered()}
    info = build({"numNodes": 2})
    assert info.policy.framework == "flux"
    assert plugins["flux"].enabled(info.policy)
    assert not plugins["torch"].enabled(info.policy)
    torch = flux_runtime(policy="torch", flux={})
    assert not plugins["flux"].enabled(build_runtime_info(trainjob({}), torch).policy)


def test_command_and_args_run_under_the_entrypoint_and_the_runtime_args_stay():
    runtime = flux_runtime({"command": ["run"], "args": ["--verbose"]})
    info = build({"numNodes": 2, "command": ["lmp", "-in", "in.hns"], "args": ["-nocite"]},
                 runtime)
    assert node(info)["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh",
                                     "lmp -in in.hns -nocite"]
    assert node(info)["args"] == ["--verbose"]
    # Without a command of its own the job runs the runtime's, with its own args.
    info = build({"numNodes": 2, "args": ["--steps", "10"]}, runtime)
    assert node(info)["command"][2] == "run --steps 10"
    # No command at all: an empty one (the entrypoint then starts an interactive cluster).
    info = build({"numNodes": 2, "args": ["x"]}, flux_runtime())
    assert node(info)["command"][2] == "x" and "args" not in node(info)
    assert node(build({"numNodes": 2}))["command"][2] == ""


def test_installer_volumes_and_mounts_on_the_node_job():
    info = build({"numNodes": 4}, flux_runtime(init_containers=[
        {"name": "prepare", "image": "prepare:v1"}]))
    spec = pod(info)
    assert spec["initContainers"] == [
        {"name": "prepare", "image": "prepare:v1"},
        {"name": "flux-installer",
         "image": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
         "command": ["/bin/bash", "/etc/flux-config/init.sh"],
         "volumeMounts": [{"name": "flux-install", "mountPath": "/mnt/flux"},
                          {"name": SCRIPTS, "mountPath": "/etc/flux-config",
                           "readOnly": True}]},
    ]
    assert spec["volumes"] == [
        {"name": "spack-install", "emptyDir": {}},
        {"name": "flux-install", "emptyDir": {}},
        {"name": SCRIPTS, "configMap": {"name": SCRIPTS, "defaultMode": 0o755}},
        {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
        {"name": "flux-curve", "secret": {"secretName": CURVE, "defaultMode": 0o400}},
    ]
    assert node(info)["volumeMounts"] == [
        {"name": "flux-install", "mountPath": "/mnt/flux"},
        {"name": "spack-install", "mountPath": "/opt/software"},
        {"name": SCRIPTS, "mountPath": "/etc/flux-config", "readOnly": True},
        {"name": "flux-curve", "mountPath": "/curve", "readOnly": True},
        {"name": "shared-memory", "mountPath": "/dev/shm", "readOnly": True},
    ]
    assert info.pod_set(c.NODE).count == 4


def test_settings_come_from_the_runtime_then_the_job():
    runtime = flux_runtime({"env": [{"name": "FLUX_QUEUE_POLICY", "value": "easy"},
                                    {"name": "FLUX_NETWORK_DEVICE", "value": "eth1"},
                                    {"name": "FLUX_VIEW_IMAGE", "value": "view:runtime"}]})
    info = build({"numNodes": 2, "env": [
        {"name": "FLUX_VIEW_IMAGE", "value": "view:job"},
        {"name": "FLUX_NETWORK_DEVICE",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}, runtime)
    assert pod(info)["initContainers"][-1]["image"] == "view:job"
    init = scripts(info)["init.sh"]
    assert 'queue-policy = "easy"' in init
    # A job variable without a value empties the setting, as upstream reads it.
    assert 'default_bind = "tcp://:%p"' in init


# ---------------------------------------------------------------- the objects


def test_builds_the_scripts_config_map_and_the_curve_secret():
    info = build({"numNodes": 2, "numProcPerNode": 4})
    config_map, secret = (o.body for o in info.objects)
    assert config_map["metadata"] == {"name": SCRIPTS, "namespace": NAMESPACE}
    assert set(config_map["data"]) == {"init.sh", "entrypoint.sh"}
    assert secret["metadata"] == {"name": CURVE, "namespace": NAMESPACE}
    cert = base64.b64decode(secret["data"]["curve.cert"]).decode()
    assert cert == flux_curve.certificate(NAME, UID)
    assert not any(o.create_only for o in info.objects)  # applied on every build
    again = build({"numNodes": 2, "numProcPerNode": 4})
    assert [o.body for o in again.objects] == [o.body for o in info.objects]


@pytest.mark.parametrize(("trainer", "container", "flux", "flags", "resources"), [
    ({"numNodes": 2, "numProcPerNode": 4}, {}, None, "-N 2 -n 8", "--cores=0-3"),
    ({"numNodes": 4}, {}, None, "-N 4 -n 4", "--cores=0"),
    ({"numNodes": 3}, {}, {"numProcPerNode": 2}, "-N 3 -n 6", "--cores=0-1"),
    ({"numNodes": 2, "numProcPerNode": 1,
      "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}},
     {"resources": {"limits": {"nvidia.com/gpu": "8"}}}, None,
     "-N 2 -n 2 -g 1", "--cores=0 --gpu=0"),
    ({"numNodes": 2}, {"resources": {"requests": {"nvidia.com/gpu": "2"}}}, None,
     "-N 2 -n 2 -g 2", "--cores=0 --gpu=0-1"),
])
def test_flux_run_sizing(trainer, container, flux, flags, resources):
    entrypoint = scripts(build(trainer, flux_runtime(container, flux)))["entrypoint.sh"]
    assert script_line(entrypoint, "flags=") == f'flags="{flags}  "'
    assert script_line(entrypoint, "flux R encode") == \
        f"flux R encode --hosts=${{hosts}} {resources} > /tmp/R"
    assert script_line(entrypoint, "mainHost=") == f'mainHost="{NAME}-node-0-0"'


def test_hosts_and_broker_address_name_the_node_pods():
    init = scripts(build({"numNodes": 3}))["init.sh"]
    assert script_line(init, "hosts=") == f'hosts="{NAME}-node-0-[0-2]"'
    assert f'{{ host="{NAME}-node-0-[0-2]"}},' in init
    assert f'default_connect = "tcp://%h.{NAME}.{NAMESPACE}.svc.cluster.local:%p"' in init
    assert script_line(init, "mainHost=") == f"mainHost={NAME}-0"
    assert flux_scripts.hostlist(NAME, 1) == f"{NAME}-node-0-[0]"


def test_a_job_without_num_nodes_uses_the_runtimes_count():
    info = build({"command": ["train"]}, flux_runtime(num_nodes=3))
    assert info.pod_set(c.NODE).count == 3
    assert script_line(scripts(info)["entrypoint.sh"], "flags=") == 'flags="-N 3 -n 3  "'


def _upstream_templates():
    """Upstream's own templates, from the Trainer module make test provisions: the oracle
    for the scripts' bytes (a missing module fails the test; it is never skipped)."""
    from clusters import upstream_trainer
    directory = upstream_trainer.module_dir() / "pkg/runtime/framework/plugins/flux/templates"
    assert directory.is_dir(), f"expected upstream's Flux templates under {directory}"
    return {p.name: p.read_text() for p in directory.iterdir()}


@pytest.mark.parametrize(("nodes", "procs", "gpus"), [(2, 4, 0), (4, 1, 0), (2, 1, 1),
                                                      (3, 2, 4)])
def test_scripts_are_upstreams_templates_filled_in(nodes, procs, gpus):
    templates = _upstream_templates()
    trainer: dict[str, Any] = {"numNodes": nodes, "numProcPerNode": procs}
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    data = scripts(build(trainer))
    hosts = f"{NAME}-node-0-[{flux_scripts.index_range(nodes)}]"
    broker = templates["broker.toml"] % (
        "tcp://eth0:%p", f"tcp://%h.{NAME}.{NAMESPACE}.svc.cluster.local:%p", hosts, "fcfs")
    assert data["init.sh"] == templates["init.sh"] % ("/opt/view", f"{NAME}-0", hosts, broker)
    flags = f"-N {nodes} -n {nodes * procs}" + (f" -g {gpus}" if gpus else "")
    resources = f"--cores={flux_scripts.index_range(procs)}" + (
        f" --gpu={flux_scripts.index_range(gpus)}" if gpus else "")
    assert data["entrypoint.sh"] == templates["entrypoint.sh"] % (
        resources, f"{NAME}-node-0-0", flags)


# ---------------------------------------------------------------- the CURVE certificate


def test_z85_encodes_as_zeromq_specifies():
    # RFC 32's test vector.
    assert flux_curve.z85(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == \
        "HelloWorld"
    assert flux_curve.z85(b"abc") == ""


def test_curve_keys_derive_from_the_uid():
    secret, public = flux_curve.key_pair(UID)
    # Go's crypto/ecdh X25519 gives these for SHA-256("test-uid").
    assert secret.hex() == "a856e8d8d0ec3e0a74c035b01f6f55953f404c942172f715448e14853ce679ce"
    assert public.hex() == "aedbfdb26e6e0f2011b98628dd5b48a19d64acf8e462b0081abdc4b3d51f5300"
    cert = flux_curve.certificate(NAME, UID)
    assert cert.splitlines() == [
        "#  ZeroMQ CURVE Secret Certificate", "#  Generated by Kubeflow Trainer", "",
        "metadata", f'    name = "{NAME}"', "curve",
        f'    public-key = "{flux_curve.z85(public)}"',
        f'    secret-key = "{flux_curve.z85(secret)}"']
    assert len(flux_curve.z85(public)) == 40
    assert flux_curve.certificate(NAME, "other-uid") != cert


# ---------------------------------------------------------------- validation


def problems(trainer: dict[str, Any] | None, runtime: TrainingRuntime | None = None):
    job = trainjob(trainer)
    return validate_policies(build_runtime_info(job, runtime or flux_runtime()), job)


def test_accepts_a_plain_flux_job():
    assert problems({"numNodes": 2, "numProcPerNode": 4}) == []
    assert problems(None) == []


@pytest.mark.parametrize("value", [0, "auto", "gpu"])
def test_refuses_tasks_per_node_that_are_not_a_positive_integer(value):
    (found,) = problems({"numNodes": 2, "numProcPerNode": value})
    assert found[0] == "spec.trainer.numProcPerNode"


def test_refuses_a_runtime_that_has_its_own_flux_installer():
    runtime = flux_runtime(init_containers=[{"name": "flux-installer", "image": "x:v1"}])
    (found,) = problems({"numNodes": 2}, runtime)
    assert found[0] == "spec.trainer.initContainers" and "flux-installer" in found[1]
