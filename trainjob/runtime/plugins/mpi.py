"""The mpi policy: SSH between the launcher and the node pods, and a hostfile, laid out as
upstream Trainer v2.3 lays them out so that a Secret made by either controller works.

``enforce_ml_policy``:

* **Counts.** With ``trainer.numNodes`` N the ``node`` job runs N pods, or max(N-1, 1) with
  ``mlPolicy.mpi.runLauncherAsNode`` (the launcher is one of the nodes, and the node job
  keeps at least one pod). Without it each job keeps the core's count. The launcher always
  runs one pod.
* **Slots** (processes per node): ``trainer.numProcPerNode``, else the policy's
  ``numProcPerNode``; when that is 1 (upstream's default) and a node has more than one GPU,
  the GPU count.
* **SSH.** The ``node`` and ``launcher`` jobs get volume ``mpi-ssh-auth`` from Secret
  ``<trainjob>-mpi-ssh-auth`` (default mode 0400): ``ssh-privatekey`` as ``id_rsa`` (0640),
  ``ssh-publickey`` as ``id_rsa.pub`` and ``authorized_keys`` (0644); their ``node``
  containers mount it at ``sshAuthMountPath`` (default ``/root/.ssh``).
* **Hostfile.** The launcher gets ConfigMap ``<trainjob>-mpi-hostfile`` (key ``hostfile``,
  mode 0444) mounted at ``/etc/mpi`` in its ``node`` container, with the implementation's
  hostfile environment.

``build`` returns the two objects: the hostfile ConfigMap (one line per node pod, jobs in
template order, the launcher among them when it runs as a node), applied on every build;
and the ``kubernetes.io/ssh-auth`` Secret, immutable, created once with a fresh key pair
(ECDSA P-521: ``ssh-privatekey`` PEM, ``ssh-publickey`` an authorized_keys line) and never
rewritten, since a new key would lock running launchers out of their nodes.

A runtime without a ``launcher`` job (the seed runtimes) gets one, copied from the node job.
The project keeps Intel MPI and MPICH beside upstream's OpenMPI.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import ExtraObject, Problems
from trainjob.runtime.node_resources import gpus_per_node, whole_number
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.pod_template import apply_node_settings, merge_by_name, merge_env
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

SSH_SECRET_SUFFIX = "-mpi-ssh-auth"
SSH_SECRET_TYPE = "kubernetes.io/ssh-auth"
SSH_PRIVATE_KEY = "ssh-privatekey"  # the key Kubernetes requires in an ssh-auth Secret
SSH_PUBLIC_KEY = "ssh-publickey"
SSH_VOLUME = "mpi-ssh-auth"
SSH_DEFAULT_MOUNT_PATH = "/root/.ssh"
SSH_DEFAULT_MODE = 0o400
SSH_PRIVATE_KEY_MODE = 0o640
SSH_PUBLIC_KEY_MODE = 0o644

HOSTFILE_SUFFIX = "-mpi-hostfile"
HOSTFILE_KEY = "hostfile"
HOSTFILE_VOLUME = "mpi-hostfile"
HOSTFILE_DIR = "/etc/mpi"
HOSTFILE_PATH = f"{HOSTFILE_DIR}/{HOSTFILE_KEY}"

OPENMPI = "OpenMPI"
INTEL = "Intel"
MPICH = "MPICH"
# Set by the policy on the launcher; a user's value would be overwritten.
RESERVED_ENV = ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args",
                "OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_set_default_slots")


def ssh_secret_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{SSH_SECRET_SUFFIX}"


def hostfile_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{HOSTFILE_SUFFIX}"


def generate_ssh_secret_data() -> dict[str, str]:
    """A fresh ECDSA P-521 key pair as the ``data`` of the ssh-auth Secret (base64 values):
    the private key as PEM, the public key as an authorized_keys line."""
    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH) + b"\n"
    return {SSH_PRIVATE_KEY: base64.b64encode(private).decode(),
            SSH_PUBLIC_KEY: base64.b64encode(public).decode()}



def slots(info: RuntimeInfo, job: TrainJob) -> int:
    """Processes per node, as upstream computes them."""
    trainer = job.spec.trainer
    if trainer is not None and whole_number(trainer.num_proc_per_node):
        return whole_number(trainer.num_proc_per_node)
    per_node = info.policy.ml_policy.mpi.num_proc_per_node or 1
    if per_node == 1:
        gpus = gpus_per_node(_node_resources(info, job))
        if gpus > 1:
            return gpus
    return per_node


def _node_resources(info: RuntimeInfo, job: TrainJob) -> dict[str, Any]:
    """A node's resources: the TrainJob's resourcesPerNode, else the trainer step's."""
    trainer = job.spec.trainer
    if trainer is not None and trainer.resources_per_node is not None:
        return trainer.resources_per_node.dump()
    for pod_set in info.by_role(c.ROLE_TRAINER):
        container = pod_set.container(c.NODE)
        if container is not None:
            return container.get("resources") or {}
    return {}


def _make_launcher(node: PodSet) -> PodSet:
    job = copy.deepcopy(node.job)
    job["name"] = c.LAUNCHER
    labels = ((job.get("template") or {}).get("metadata") or {}).get("labels")
    if labels is not None:
        labels.pop(c.ANCESTOR_LABEL, None)  # the launcher's role comes from its name
    launcher = PodSet(role=c.ROLE_LAUNCHER, job=job)
    container = launcher.container(c.NODE)
    if container is not None:
        container["name"] = c.LAUNCHER
    return launcher


def _main_container(pod_set: PodSet) -> dict[str, Any] | None:
    """The ``node`` container (upstream's runtimes), else one named like the job (a launcher
    made from a seed runtime)."""
    return pod_set.container(c.NODE) or pod_set.container(pod_set.name)


def _node_job(info: RuntimeInfo) -> PodSet | None:
    """The job of node pods: ``node``, else (a seed runtime) the trainer job that is not the
    launcher."""
    return info.pod_set(c.NODE) or next(
        (p for p in info.by_role(c.ROLE_TRAINER) if p.name != c.LAUNCHER), None)


def _as_node(info: RuntimeInfo) -> bool:
    return bool(info.policy.ml_policy.mpi.run_launcher_as_node)


class MPIPlugin:
    name = "mpi"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == self.name

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        mpi = info.policy.ml_policy.mpi
        as_node = _as_node(info)
        node = _node_job(info)
        launcher = info.pod_set(c.LAUNCHER)
        if launcher is None and node is not None:
            launcher = _make_launcher(node)
            info.pod_sets.insert(0, launcher)
        trainer = job.spec.trainer
        if node is not None and trainer is not None and trainer.num_nodes:
            pods = max(trainer.num_nodes - 1, 1) if as_node else trainer.num_nodes
            node.job_spec["parallelism"] = node.job_spec["completions"] = pods
        if node is not None and as_node and node.role != c.ROLE_TRAINER:
            # Training processes run here too: the trainer's env and resources (not its
            # command: the node pods keep their sshd).
            apply_node_settings(node, job)
        if launcher is not None:
            launcher.job_spec["parallelism"] = launcher.job_spec["completions"] = 1

        per_node = slots(info, job)
        ssh_volume = {"name": SSH_VOLUME, "secret": {
            "secretName": ssh_secret_name(job),
            "defaultMode": SSH_DEFAULT_MODE,
            "items": [
                {"key": SSH_PRIVATE_KEY, "path": "id_rsa", "mode": SSH_PRIVATE_KEY_MODE},
                {"key": SSH_PUBLIC_KEY, "path": "id_rsa.pub", "mode": SSH_PUBLIC_KEY_MODE},
                {"key": SSH_PUBLIC_KEY, "path": "authorized_keys", "mode": SSH_PUBLIC_KEY_MODE},
            ],
        }}
        ssh_mount = {"name": SSH_VOLUME,
                     "mountPath": mpi.ssh_auth_mount_path or SSH_DEFAULT_MOUNT_PATH}
        for pod_set in (p for p in (node, launcher) if p is not None):
            merge_by_name(pod_set.volumes, [ssh_volume])
            container = _main_container(pod_set)
            if container is not None:
                merge_by_name(container.setdefault("volumeMounts", []), [ssh_mount])
        if launcher is None:
            return
        merge_by_name(launcher.volumes, [{"name": HOSTFILE_VOLUME, "configMap": {
            "name": hostfile_name(job),
            "items": [{"key": HOSTFILE_KEY, "path": HOSTFILE_KEY, "mode": 0o444}],
        }}])
        container = _main_container(launcher)
        if container is not None:
            merge_by_name(container.setdefault("volumeMounts", []),
                          [{"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR}])
            merge_env(container, _launcher_env(mpi.mpi_implementation or OPENMPI, per_node))

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[ExtraObject]:
        as_node = _as_node(info)
        per_node = slots(info, job)
        domain = (info.jobset_spec.get("network") or {}).get("subdomain") or job.metadata.name
        hydra = (info.policy.ml_policy.mpi.mpi_implementation or OPENMPI) != OPENMPI
        node = _node_job(info)
        lines = []
        for pod_set in info.pod_sets:  # template order, as upstream writes the hostfile
            if pod_set is not node and not (as_node and pod_set.name == c.LAUNCHER):
                continue
            for replica in range(pod_set.replicas):
                for pod in range(pod_set.parallelism):
                    host = f"{job.metadata.name}-{pod_set.name}-{replica}-{pod}.{domain}"
                    lines.append(f"{host}:{per_node}" if hydra else f"{host} slots={per_node}")
        metadata = {"namespace": job.metadata.namespace}
        return [
            ExtraObject({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {**metadata, "name": ssh_secret_name(job)},
                         "type": SSH_SECRET_TYPE, "immutable": True},
                        "secrets", make_content=lambda: {"data": generate_ssh_secret_data()}),
            ExtraObject({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {**metadata, "name": hostfile_name(job)},
                         "data": {HOSTFILE_KEY: "".join(line + "\n" for line in lines)}},
                        "configmaps"),
        ]

    def validate(self, info: RuntimeInfo, job: TrainJob) -> Problems:
        problems: Problems = []
        trainer = job.spec.trainer
        if trainer is None:
            return problems
        value = trainer.num_proc_per_node
        if value is not None and (whole_number(value) is None or whole_number(value) < 1):
            problems.append(("spec.trainer.numProcPerNode",
                             f"{value!r} is not a number of MPI slots: the mpi policy needs a "
                             "positive integer"))
        reserved = sorted({v.get("name") for v in trainer.env} & set(RESERVED_ENV))
        if reserved:
            problems.append(("spec.trainer.env", f"{', '.join(reserved)} "
                             f"{'is' if len(reserved) == 1 else 'are'} reserved: the mpi policy "
                             "sets them on the launcher"))
        # The runtime's jobs as written: a launcher made for it (``_make_launcher``) does
        # not count, as upstream sees only the runtime's.
        written = {j.get("name") for j in info.runtime_jobs if isinstance(j, dict)}
        if (trainer.num_nodes or 1) >= 2 and _as_node(info) and not {
                c.LAUNCHER, c.NODE} <= written:
            problems.append(("spec.trainer.numNodes", "must be 1: the runtime runs the launcher "
                             "as a node but lacks a launcher or a node job"))
        return problems


def _launcher_env(implementation: str, per_node: int) -> list[dict[str, Any]]:
    if implementation == INTEL:
        return [{"name": "I_MPI_HYDRA_HOST_FILE", "value": HOSTFILE_PATH}]
    if implementation == MPICH:
        return [{"name": "HYDRA_HOST_FILE", "value": HOSTFILE_PATH}]
    return [
        {"name": "OMPI_MCA_orte_default_hostfile", "value": HOSTFILE_PATH},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": str(per_node)},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
    ]


register(MPIPlugin())
