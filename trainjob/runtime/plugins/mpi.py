"""The mpi policy: a launcher, SSH between the pods and a hostfile.

What ``apply`` does to RuntimeInfo (deterministically, and idempotently):

* **Counts.** The core set every trainer PodSet to N pods (``trainer.numNodes``, else
  ``mlPolicy.numNodes``, else 1). With ``mlPolicy.mpi.runLauncherAsNode`` the launcher is one
  of the N nodes, so the node job runs max(N-1, 0) pods; otherwise N. N is recomputed from
  the TrainJob and the policy, never read back from the PodSet, so applying twice does not
  subtract twice.
* **Launcher.** If the runtime template has no replicated job named ``launcher``, one is made
  from a copy of the node job (container ``node`` renamed ``launcher``, no trainer ancestor
  label) and put first in ``info.pod_sets``. The launcher always runs one pod.
* **SSH.** A Secret ``<trainjob>-mpi-ssh-auth`` (type ``kubernetes.io/ssh-auth``) is mounted
  read-only at ``mlPolicy.mpi.sshAuthMountPath`` (default ``/root/.ssh``) in the launcher and
  node containers as volume ``mpi-ssh-auth``: ``ssh-privatekey`` as ``id_rsa`` and
  ``authorized_keys`` as ``authorized_keys`` (one key pair for both sides), mode 0600.
* **Hostfile.** A ConfigMap ``<trainjob>-mpi-hostfile`` with key ``hostfile`` (one line per
  node pod, the launcher first when it runs as a node) is mounted at ``/etc/mpi`` in the
  launcher, and the launcher container gets the implementation's hostfile environment.

**Key material.** RuntimeInfo stays a pure function of the TrainJob and the runtime, so the
Secret in ``info.objects`` carries *no* ``data``: it only has its name, namespace, type,
``immutable: true`` and the annotation ``trainer.kubeflow.org/create-only: "true"``. The
operator, when it finds such a Secret missing, fills ``data`` with
:func:`generate_ssh_secret_data` and creates it; it never updates an existing one (a fresh
key on every reconcile would lock running launchers out of their nodes). Ownership
(ownerReferences) is the operator's job, as for the JobSet.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.framework import apply_node_settings, merge_by_name, merge_env
from trainjob.runtime.plugins import register
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

CREATE_ONLY_ANNOTATION = "trainer.kubeflow.org/create-only"

SSH_SECRET_SUFFIX = "-mpi-ssh-auth"
SSH_SECRET_TYPE = "kubernetes.io/ssh-auth"
SSH_PRIVATE_KEY = "ssh-privatekey"  # the key Kubernetes requires in an ssh-auth Secret
SSH_AUTHORIZED_KEYS = "authorized_keys"
SSH_VOLUME = "mpi-ssh-auth"
SSH_DEFAULT_MOUNT_PATH = "/root/.ssh"
SSH_MODE = 0o600

HOSTFILE_SUFFIX = "-mpi-hostfile"
HOSTFILE_KEY = "hostfile"
HOSTFILE_VOLUME = "mpi-hostfile"
HOSTFILE_DIR = "/etc/mpi"
HOSTFILE_PATH = f"{HOSTFILE_DIR}/{HOSTFILE_KEY}"

OPENMPI = "OpenMPI"
INTEL = "Intel"
MPICH = "MPICH"


def ssh_secret_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{SSH_SECRET_SUFFIX}"


def hostfile_name(job: TrainJob) -> str:
    return f"{job.metadata.name}{HOSTFILE_SUFFIX}"


def generate_ssh_secret_data() -> dict[str, str]:
    """A fresh ECDSA P-256 key pair as the ``data`` of the ssh-auth Secret (base64 values).

    ``ssh-privatekey`` is the private key in OpenSSH format; ``authorized_keys`` is the
    matching OpenSSH public key line. Call this only when creating the Secret."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH) + b"\n"
    return {SSH_PRIVATE_KEY: base64.b64encode(private).decode(),
            SSH_AUTHORIZED_KEYS: base64.b64encode(public).decode()}


def requested_nodes(info: RuntimeInfo, job: TrainJob) -> int:
    """N, as the core computes the trainer count (the framework's ``trainer_count``)."""
    if job.spec.trainer is not None and job.spec.trainer.num_nodes:
        return job.spec.trainer.num_nodes
    return info.policy.ml_policy.num_nodes or 1


def slots(info: RuntimeInfo, job: TrainJob) -> int:
    """Processes per node: the TrainJob's integer numProcPerNode, else the policy's, else 1."""
    trainer = job.spec.trainer
    if trainer is not None:
        value = trainer.num_proc_per_node
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        if isinstance(value, str) and value.isascii() and value.isdigit() and int(value) >= 1:
            return int(value)
    mpi = info.policy.ml_policy.mpi
    if mpi is not None and mpi.num_proc_per_node:
        return mpi.num_proc_per_node
    return 1


def main_container(pod_set: PodSet) -> dict[str, Any] | None:
    """The container named like the job, else ``node`` (an upstream-style launcher), else
    the first one."""
    return (pod_set.container(pod_set.name) or pod_set.container(c.NODE)
            or (pod_set.containers[0] if pod_set.containers else None))


def _subdomain(info: RuntimeInfo, job: TrainJob) -> str:
    network = info.jobset_spec.get("network") or {}
    return network.get("subdomain") or job.metadata.name


def _metadata(job: TrainJob, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": job.metadata.namespace}


def _upsert_object(objects: list[dict[str, Any]], obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
    for i, old in enumerate(objects):
        if (old.get("apiVersion"), old.get("kind"), (old.get("metadata") or {}).get("name")) \
                == key:
            objects[i] = obj
            return
    objects.append(obj)


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
    launcher.set_count(1)
    return launcher


class MPIPlugin:
    name = "mpi"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == "mpi"

    def apply(self, info: RuntimeInfo, job: TrainJob) -> None:
        mpi = info.policy.ml_policy.mpi
        as_node = bool(mpi.run_launcher_as_node)
        # The node job by name (upstream's runtimes label only the launcher as the trainer),
        # or a seed runtime's trainer job that is not the launcher.
        nodes = [p for p in info.pod_sets if p.name != c.LAUNCHER
                 and (p.name == c.NODE or p.role == c.ROLE_TRAINER)]
        n = requested_nodes(info, job)
        for pod_set in nodes:
            pod_set.set_count(max(n - 1, 0) if as_node else n)
            if as_node and pod_set.role != c.ROLE_TRAINER:
                # Training processes run here too: they get the trainer's env and resources
                # (not its command: the node pods keep their sshd).
                apply_node_settings(pod_set, job)

        launcher = info.pod_set(c.LAUNCHER)
        if launcher is None and nodes:
            launcher = _make_launcher(nodes[0])
            info.pod_sets.insert(0, launcher)
        if launcher is not None:
            # One launcher pod, even when the runtime labels it as a trainer step (upstream
            # runtimes do) and the core therefore gave it the trainer count.
            launcher.set_count(1)

        per_node = slots(info, job)
        implementation = mpi.mpi_implementation or OPENMPI
        domain = _subdomain(info, job)
        hosts: list[str] = []
        if as_node and launcher is not None:
            hosts.append(f"{job.metadata.name}-{launcher.name}-0-0.{domain}")
        for pod_set in nodes:
            hosts += [f"{job.metadata.name}-{pod_set.name}-0-{i}.{domain}"
                      for i in range(pod_set.count)]
        if implementation == OPENMPI:
            lines = [f"{host} slots={per_node}" for host in hosts]
        else:  # Hydra (Intel MPI, MPICH): host:procs
            lines = [f"{host}:{per_node}" for host in hosts]

        secret = {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {**_metadata(job, ssh_secret_name(job)),
                         "annotations": {CREATE_ONLY_ANNOTATION: "true"}},
            "type": SSH_SECRET_TYPE,
            "immutable": True,
        }
        config_map = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(job, hostfile_name(job)),
            "data": {HOSTFILE_KEY: "".join(line + "\n" for line in lines)},
        }
        _upsert_object(info.objects, secret)
        _upsert_object(info.objects, config_map)

        ssh_volume = {"name": SSH_VOLUME, "secret": {
            "secretName": ssh_secret_name(job),
            "items": [{"key": SSH_PRIVATE_KEY, "path": "id_rsa"},
                      {"key": SSH_AUTHORIZED_KEYS, "path": "authorized_keys"}],
            "defaultMode": SSH_MODE,
        }}
        ssh_mount = {"name": SSH_VOLUME, "mountPath": mpi.ssh_auth_mount_path
                     or SSH_DEFAULT_MOUNT_PATH, "readOnly": True}
        for pod_set in nodes + ([launcher] if launcher is not None else []):
            merge_by_name(pod_set.volumes, [ssh_volume])
            container = main_container(pod_set)
            if container is not None:
                merge_by_name(container.setdefault("volumeMounts", []), [ssh_mount])

        if launcher is None:
            return
        merge_by_name(launcher.volumes, [{"name": HOSTFILE_VOLUME, "configMap": {
            "name": hostfile_name(job),
            "items": [{"key": HOSTFILE_KEY, "path": HOSTFILE_KEY, "mode": 0o444}],
        }}])
        container = main_container(launcher)
        if container is None:
            return
        merge_by_name(container.setdefault("volumeMounts", []),
                      [{"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR, "readOnly": True}])
        merge_env(container, _launcher_env(implementation, per_node))

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[tuple[str, str]]:
        trainer = job.spec.trainer
        value = trainer.num_proc_per_node if trainer is not None else None
        if isinstance(value, str) and not (value.isascii() and value.isdigit()):
            return [("spec.trainer.numProcPerNode",
                     f"{value!r} is not a number of MPI slots: the mpi policy needs a "
                     "positive integer")]
        if value is not None and int(value) < 1:
            return [("spec.trainer.numProcPerNode", "must be a positive integer")]
        return []


def _launcher_env(implementation: str, per_node: int) -> list[dict[str, Any]]:
    if implementation == INTEL:
        return [{"name": "I_MPI_HYDRA_HOST_FILE", "value": HOSTFILE_PATH}]
    if implementation == MPICH:
        return [{"name": "HYDRA_HOST_FILE", "value": HOSTFILE_PATH}]
    return [
        {"name": "OMPI_MCA_orte_default_hostfile", "value": HOSTFILE_PATH},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": str(per_node)},
    ]


register(MPIPlugin())
