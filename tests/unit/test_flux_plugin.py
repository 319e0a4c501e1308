"""Unit tests of the flux policy plug-in: the node job's installer, volumes and wrapped
command, the scripts ConfigMap and CURVE Secret it builds, and what it refuses. Pure
functions over dicts, no cluster."""

from __future__ import annotations

import base64
import re
import subprocess
import tomllib
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


# ---------------------------------------------------------------- the scripts, run
#
# The scripts run for real under bash in a sandbox: their absolute paths (the pod's mounts
# and the view image's directories) are moved under a temporary directory, and `flux`,
# `hostname` and `sleep` are stubs that record how they were called.

FLUX_STUB = """#!/bin/bash
echo "$*" >> "$SANDBOX/flux.log"
case "$1 $2" in
  "R encode") echo '{"version": 1}' ;;
  "start -o")
    calls=$(cat "$SANDBOX/start-calls" 2>/dev/null || echo 0)
    echo $((calls + 1)) > "$SANDBOX/start-calls"
    [ "$calls" -lt "${FAILED_STARTS:-0}" ] && exit 1
    exit "${RUN_STATUS:-0}" ;;
esac
"""


class Sandbox:
    def __init__(self, root):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, text in (("flux", FLUX_STUB), ("hostname", 'echo "$FAKE_HOSTNAME"\n'),
                           ("sleep", 'echo "$1" >> "$SANDBOX/slept"\n')):
            stub = self.bin / name
            stub.write_text(text if text.startswith("#!") else "#!/bin/bash\n" + text)
            stub.chmod(0o755)
        # The view image: spack's view directory (under a hash) and the tree it links to.
        view = root / "opt/views/._view/4f2a9c"
        (view / "bin").mkdir(parents=True)
        (view / "bin/flux-tool").write_text("flux tool")
        (view / "lib/python3.11/site-packages").mkdir(parents=True)
        (root / "opt/software/flux-core").mkdir(parents=True)
        (root / "opt/software/flux-core/lib.so").write_text("library")
        (root / "curve").mkdir()
        (root / "curve/curve.cert").write_text("certificate")

    def path(self, absolute: str):
        return self.root / absolute.lstrip("/")

    def run(self, script: str, *args: str, hostname: str = "", **env: str):
        moved = re.sub(r"(?<![\w./])(/mnt/flux|/opt/software|/opt/views|/curve/)",
                       lambda m: str(self.root) + m.group(1), script)
        path = self.root / "script.sh"
        path.write_text(moved)
        return subprocess.run(
            ["bash", str(path), *args], capture_output=True, text=True, timeout=30,
            env={"PATH": f"{self.bin}:/usr/bin:/bin", "SANDBOX": str(self.root),
                 "FAKE_HOSTNAME": hostname, **env})

    def flux_calls(self) -> list[str]:
        log = self.root / "flux.log"
        return log.read_text().splitlines() if log.exists() else []


def installed(tmp_path, trainer: dict[str, Any], runtime: TrainingRuntime | None = None):
    data = scripts(build(trainer, runtime))
    box = Sandbox(tmp_path)
    result = box.run(data["init.sh"])
    assert result.returncode == 0, f"init.sh failed: {result.stderr}"
    return box, data


CONFIG = "/mnt/flux/config/etc/flux/config"
OPTIONS = ("-Scron.directory={root}/mnt/flux/config/etc/flux/system/cron.d -Stbon.fanout=256 "
           "-Srundir={root}/mnt/flux/config/run/flux "
           "-Sstatedir={root}/mnt/flux/config/var/lib/flux "
           "-Slocal-uri=local:///mnt/flux/config/run/flux/local "
           "-Slog-stderr-level=0 -Slog-stderr-mode=local")


def test_init_installs_the_view_and_writes_the_broker_configuration(tmp_path):
    box, _ = installed(tmp_path, {"numNodes": 3})
    assert box.path("/mnt/flux/view/bin/flux-tool").read_text() == "flux tool"
    assert box.path("/mnt/flux/view/lib/python3.11/site-packages").is_dir()
    assert box.path("/mnt/flux/software/flux-core/lib.so").read_text() == "library"
    for directory in ("etc/flux/system/cron.d", "var/lib/flux", "run/flux", "etc/curve"):
        assert box.path(f"/mnt/flux/config/{directory}").is_dir(), directory
    hosts = f"{NAME}-node-0-[0-2]"
    assert box.path("/mnt/flux/config/etc/flux/system/hostlist").read_text() == hosts + "\n"
    broker = tomllib.loads(box.path(f"{CONFIG}/broker.toml").read_text())
    config = f"{tmp_path}/mnt/flux/config"  # where the sandbox moved the shared volume
    assert broker == {
        "access": {"allow-guest-user": True, "allow-root-owner": True},
        "resource": {"path": f"{config}/etc/flux/system/R"},
        "bootstrap": {
            "curve_cert": f"{config}/etc/curve/curve.cert", "default_port": 8050,
            "default_bind": "tcp://eth0:%p",
            "default_connect": f"tcp://%h.{NAME}.{NAMESPACE}.svc.cluster.local:%p",
            "hosts": [{"host": hosts}]},
        "archive": {"dbpath": f"{config}/var/lib/flux/job-archive.sqlite",
                    "period": "1m", "busytimeout": "50s"},
        "sched-fluxion-qmanager": {"queue-policy": "fcfs"},
    }


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
def test_the_lead_broker_runs_the_command_sized_for_the_job(tmp_path, trainer, container, flux,
                                                            flags, resources):
    box, data = installed(tmp_path, trainer, flux_runtime(container, flux))
    nodes = trainer["numNodes"]
    result = box.run(data["entrypoint.sh"], "lmp -in in.hns", hostname=f"{NAME}-node-0-0")
    assert result.returncode == 0, result.stderr
    options = OPTIONS.format(root=tmp_path)
    assert box.flux_calls() == [
        f"R encode --hosts={NAME}-node-0-[{flux_scripts.index_range(nodes)}] {resources}",
        f"start -o --config {tmp_path}{CONFIG} {options} flux run {flags} lmp -in in.hns",
    ]
    assert box.path("/mnt/flux/config/etc/flux/system/R").read_text() == '{"version": 1}\n'
    cert = box.path("/mnt/flux/config/etc/curve/curve.cert")
    assert cert.read_text() == "certificate"
    assert cert.stat().st_mode & 0o044 == 0, "the certificate must not be group/other readable"
    # The view's tree is back at the place its links point to.
    assert box.path("/opt/software/flux-core/lib.so").read_text() == "library"


def test_the_pod_ends_with_the_status_of_the_flux_run(tmp_path):
    box, data = installed(tmp_path, {"numNodes": 2})
    result = box.run(data["entrypoint.sh"], "train", hostname=f"{NAME}-node-0-0",
                     RUN_STATUS="3")
    assert result.returncode == 3, (result.returncode, result.stderr)


def test_without_a_command_the_lead_broker_runs_an_interactive_cluster(tmp_path):
    box, data = installed(tmp_path, {"numNodes": 2})
    result = box.run(data["entrypoint.sh"], "", hostname=f"{NAME}-node-0-0")
    assert result.returncode == 0, result.stderr
    assert box.flux_calls()[1] == (f"broker --config-path {tmp_path}{CONFIG} "
                                   + OPTIONS.format(root=tmp_path))


def test_a_follower_joins_the_lead_broker_and_retries_until_it_is_up(tmp_path):
    box, data = installed(tmp_path, {"numNodes": 2})
    result = box.run(data["entrypoint.sh"], "train", hostname=f"{NAME}-node-0-1",
                     FAILED_STARTS="2")
    assert result.returncode == 0, result.stderr
    start = f"start -o --config {tmp_path}{CONFIG} " + OPTIONS.format(root=tmp_path)
    assert box.flux_calls()[1:] == [start, start, start]
    assert box.path("/slept").read_text().split() == ["15", "15"]


def test_hosts_and_broker_address_name_the_node_pods():
    init = scripts(build({"numNodes": 3}))["init.sh"]
    assert f'hosts = [{{ host = "{NAME}-node-0-[0-2]" }}]' in init
    assert f'default_connect = "tcp://%h.{NAME}.{NAMESPACE}.svc.cluster.local:%p"' in init
    assert flux_scripts.hostlist(NAME, 1) == f"{NAME}-node-0-[0]"


def test_a_job_without_num_nodes_uses_the_runtimes_count():
    info = build({"command": ["train"]}, flux_runtime(num_nodes=3))
    assert info.pod_set(c.NODE).count == 3
    assert "flux run -N 3 -n 3 $command" in scripts(info)["entrypoint.sh"]


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
        "#  ZeroMQ CURVE Secret Certificate", "#  Written by the training operator", "",
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
