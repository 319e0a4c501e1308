"""The flux policy (``mlPolicy.flux``): the trainer runs under the Flux workload manager, laid
out as upstream Trainer v2.3 lays it out, so that either controller builds the same JobSet
and Secret for a TrainJob, and a ConfigMap of the same name and keys whose scripts run the
same Flux commands (their text is this project's own: ``flux_scripts``).

``enforce_ml_policy``:

* **Command.** The ``node`` container of each trainer job runs ``/bin/bash
  /etc/flux-config/entrypoint.sh "<command>"``, where ``<command>`` is the job's command
  and args joined by spaces (the TrainJob's ``trainer.command``, else the runtime's, then
  ``trainer.args``): Flux launches it on the first pod; an empty command starts an
  interactive cluster. The container keeps the runtime's args, not the TrainJob's (they are
  in the command already).
* **Installer.** The replicated job named ``node`` gets init container ``flux-installer``
  (the view image, ``/bin/bash /etc/flux-config/init.sh``) that copies Flux into the shared
  ``flux-install`` volume, and volumes ``spack-install``, ``flux-install`` (emptyDirs),
  ``<trainjob>-flux-entrypoint`` (the scripts, mode 0755), ``shared-memory`` (a memory
  emptyDir) and ``flux-curve`` (Secret ``<trainjob>-flux-curve``, mode 0400), mounted in
  its ``node`` container.

Three settings come from the trainer's environment (the runtime's ``node`` container,
then ``trainer.env``, which wins): ``FLUX_VIEW_IMAGE``, ``FLUX_NETWORK_DEVICE`` and
``FLUX_QUEUE_POLICY``.

``build`` returns ConfigMap ``<trainjob>-flux-entrypoint`` (``init.sh``, ``entrypoint.sh``:
``flux_scripts``) and Secret ``<trainjob>-flux-curve`` (``curve.cert``: ``flux_curve``), both
applied on every build: their content is a function of the TrainJob.

Sizing, per upstream: ``trainer.numNodes`` nodes, ``numProcPerNode`` tasks per node (the
TrainJob's, else the policy's, default 1) each with one core, and a node's GPUs (the
TrainJob's resourcesPerNode, else the runtime's trainer resources) as GPUs per task.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import ExtraObject, Problems
from trainjob.runtime.node_resources import gpus_per_node, whole_number
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import flux_curve, flux_scripts
from trainjob.runtime.pod_template import merge_by_name
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

INSTALLER = "flux-installer"
ENTRYPOINT_SUFFIX = "-flux-entrypoint"
CURVE_SUFFIX = "-flux-curve"
CONFIG_DIR = "/etc/flux-config"
INIT_SCRIPT = "init.sh"
ENTRYPOINT_SCRIPT = "entrypoint.sh"

INSTALL_VOLUME, INSTALL_PATH = "flux-install", flux_scripts.VIEW_BASE
SPACK_VOLUME, SPACK_PATH = "spack-install", "/opt/software"
CURVE_VOLUME, CURVE_PATH = "flux-curve", "/curve"
MEMORY_VOLUME, MEMORY_PATH = "shared-memory", "/dev/shm"
SCRIPTS_MODE = 0o755
CURVE_MODE = 0o400

VIEW_IMAGE = "FLUX_VIEW_IMAGE"
NETWORK_DEVICE = "FLUX_NETWORK_DEVICE"
QUEUE_POLICY = "FLUX_QUEUE_POLICY"
# Upstream's defaults: an Ubuntu Jammy view, the pod's eth0, first-come-first-served.
DEFAULT_SETTINGS = {
    VIEW_IMAGE: "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
    NETWORK_DEVICE: "eth0",
    QUEUE_POLICY: "fcfs",
}


def entrypoint_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{ENTRYPOINT_SUFFIX}"


def curve_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{CURVE_SUFFIX}"


def _runtime_container(info: RuntimeInfo, job_name: str) -> dict[str, Any]:
    """The ``node`` container of replicated job ``job_name`` as the runtime has it (after
    runtime patches), before the TrainJob's settings: upstream reads these values there."""
    for replicated in info.runtime_jobs:
        if replicated.get("name") == job_name:
            pod = ((replicated.get("template") or {}).get("spec") or {}).get("template") or {}
            for container in (pod.get("spec") or {}).get("containers") or []:
                if container.get("name") == c.NODE:
                    return container
    return {}


def _first_trainer(info: RuntimeInfo) -> dict[str, Any]:
    trainers = info.by_role(c.ROLE_TRAINER)
    return _runtime_container(info, trainers[0].name) if trainers else {}


def settings(info: RuntimeInfo, job: TrainJob) -> dict[str, str]:
    """The three Flux settings: defaults, then the runtime trainer's env values, then
    ``trainer.env`` (a variable without a value sets "", as upstream reads it)."""
    found = dict(DEFAULT_SETTINGS)
    for var in _first_trainer(info).get("env") or []:
        if var.get("name") in found and var.get("value"):
            found[var["name"]] = var["value"]
    trainer = job.spec.trainer
    for var in trainer.env if trainer is not None else []:
        if var.get("name") in found:
            found[var["name"]] = var.get("value") or ""
    return found


def original_command(info: RuntimeInfo, job: TrainJob) -> str:
    """What Flux runs: the command (the TrainJob's, else the runtime trainer's) and the
    TrainJob's args, one string."""
    command = list(_first_trainer(info).get("command") or [])
    args: list[str] = []
    trainer = job.spec.trainer
    if trainer is not None:
        if trainer.command is not None:
            command = list(trainer.command)
        if trainer.args is not None:
            args = list(trainer.args)
    return " ".join(command + args).strip()



def tasks_per_node(info: RuntimeInfo, job: TrainJob) -> int:
    trainer = job.spec.trainer
    own = whole_number(trainer.num_proc_per_node) if trainer is not None else None
    if own is not None:
        return own
    return whole_number((info.policy.ml_policy.flux or {}).get("numProcPerNode")) or 1


def node_count(info: RuntimeInfo, job: TrainJob) -> int:
    """``trainer.numNodes``. Without it upstream's controller fails on the job and never
    builds it; here the trainer job's pod count (the runtime's numNodes, else 1) is used."""
    trainer = job.spec.trainer
    if trainer is not None and trainer.num_nodes:
        return trainer.num_nodes
    trainers = info.by_role(c.ROLE_TRAINER)
    return trainers[0].count if trainers else 1


def _node_resources(info: RuntimeInfo, job: TrainJob) -> dict[str, Any]:
    """The TrainJob's resourcesPerNode, else the first trainer ``node`` container that
    states resources."""
    trainer = job.spec.trainer
    if trainer is not None and trainer.resources_per_node is not None:
        return trainer.resources_per_node.dump()
    for pod_set in info.pod_sets:
        if pod_set.name != c.NODE and pod_set.role != c.ROLE_TRAINER:
            continue
        container = pod_set.container(c.NODE)
        if container is not None and "resources" in container:
            return container.get("resources") or {}
    return {}


def _mount(name: str, path: str, read_only: bool = False) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def _install(node: PodSet, job: TrainJob, image: str) -> None:
    scripts = entrypoint_name(job)
    merge_by_name(node.volumes, [
        {"name": SPACK_VOLUME, "emptyDir": {}},
        {"name": INSTALL_VOLUME, "emptyDir": {}},
        {"name": scripts, "configMap": {"name": scripts, "defaultMode": SCRIPTS_MODE}},
        {"name": MEMORY_VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": CURVE_VOLUME, "secret": {"secretName": curve_name(job),
                                          "defaultMode": CURVE_MODE}},
    ])
    merge_by_name(node.pod_spec.setdefault("initContainers", []), [{
        "name": INSTALLER,
        "image": image,
        "command": ["/bin/bash", f"{CONFIG_DIR}/{INIT_SCRIPT}"],
        "volumeMounts": [_mount(INSTALL_VOLUME, INSTALL_PATH),
                         _mount(scripts, CONFIG_DIR, read_only=True)],
    }])
    container = node.container(c.NODE)
    if container is not None:
        merge_by_name(container.setdefault("volumeMounts", []), [
            _mount(INSTALL_VOLUME, INSTALL_PATH),
            _mount(SPACK_VOLUME, SPACK_PATH),
            _mount(scripts, CONFIG_DIR, read_only=True),
            _mount(CURVE_VOLUME, CURVE_PATH, read_only=True),
            _mount(MEMORY_VOLUME, MEMORY_PATH, read_only=True),
        ])


class FluxPlugin:
    name = "flux"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == self.name

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        wrapped = ["/bin/bash", f"{CONFIG_DIR}/{ENTRYPOINT_SCRIPT}", original_command(info, job)]
        for pod_set in info.by_role(c.ROLE_TRAINER):
            container = pod_set.container(c.NODE)
            if container is None:
                continue
            container["command"] = wrapped
            # The TrainJob's args are in the wrapped command; the runtime's stay.
            args = _runtime_container(info, pod_set.name).get("args")
            if args is None:
                container.pop("args", None)
            else:
                container["args"] = copy.deepcopy(args)
        node = info.pod_set(c.NODE)
        if node is not None:
            _install(node, job, settings(info, job)[VIEW_IMAGE])

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[ExtraObject]:
        name, namespace = job.metadata.name, job.metadata.namespace
        found = settings(info, job)
        nodes = node_count(info, job)
        tasks = tasks_per_node(info, job)
        gpus = gpus_per_node(_node_resources(info, job))
        flags = f"-N {nodes} -n {tasks * nodes}"
        resources = f"--cores={flux_scripts.index_range(tasks)}"
        if gpus > 0:
            flags += f" -g {gpus}"
            resources += f" --gpu={flux_scripts.index_range(gpus)}"
        hosts = flux_scripts.hostlist(name, nodes)
        broker = flux_scripts.broker_toml(name, namespace or "", hosts, found[NETWORK_DEVICE],
                                          found[QUEUE_POLICY])
        scripts = {
            ENTRYPOINT_SCRIPT: flux_scripts.entrypoint_script(
                resources, f"{name}-{c.NODE}-0-0", flags),
            INIT_SCRIPT: flux_scripts.init_script(hosts, broker),
        }
        cert = flux_curve.certificate(name, job.metadata.uid or "")
        metadata = {"namespace": namespace}
        return [
            ExtraObject({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {**metadata, "name": entrypoint_name(job)},
                         "data": scripts}, "configmaps"),
            ExtraObject({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {**metadata, "name": curve_name(job)},
                         "data": {flux_curve.CERT_KEY: base64.b64encode(cert.encode()).decode()}},
                        "secrets"),
        ]

    def validate(self, info: RuntimeInfo, job: TrainJob) -> Problems:
        problems: Problems = []
        trainer = job.spec.trainer
        value = trainer.num_proc_per_node if trainer is not None else None
        if value is None:
            value = (info.policy.ml_policy.flux or {}).get("numProcPerNode")
        if value is not None and (whole_number(value) is None or whole_number(value) < 1):
            problems.append(("spec.trainer.numProcPerNode",
                             f"{value!r}: must be an integer of at least 1 for a Flux "
                             "TrainJob (tasks per node)"))
        # The runtime's own init containers: the installer is added under this name.
        pod = ((_runtime_job(info, c.NODE).get("template") or {}).get("spec") or {}).get(
            "template") or {}
        if any(x.get("name") == INSTALLER for x in (pod.get("spec") or {}).get(
                "initContainers") or []):
            problems.append(("spec.trainer.initContainers", f"init container {INSTALLER!r} "
                             "of the runtime's node job is reserved: the flux policy adds it"))
        return problems


def _runtime_job(info: RuntimeInfo, name: str) -> dict[str, Any]:
    return next((j for j in info.runtime_jobs if j.get("name") == name), {})


register(FluxPlugin())
