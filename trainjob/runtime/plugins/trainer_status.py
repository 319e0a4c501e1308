"""The pods' side of ``status.trainerStatus`` (upstream's ``TrainJobStatus`` plug-in): where
to send progress and how to prove who is sending it. Taken part in only when the operator
serves the endpoint (``training-operator run --enable-trainer-status``), so it is not in
the registry; the operator adds it to the plug-ins it resolves runtimes with.

``enforce_ml_policy``: every container (not init container) of the first trainer PodSet gets

* ``KUBEFLOW_TRAINER_SERVER_URL``: the endpoint's URL for this TrainJob,
* ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` / ``KUBEFLOW_TRAINER_SERVER_TOKEN``: the files below,
* volume ``kubeflow-trainer-token`` mounted read-only at ``/var/run/secrets/kubeflow/trainer``:
  a projected volume with a service-account token for audience
  ``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` (1 hour, renewed
  by the kubelet) as ``token``, and ``ca.crt`` from ConfigMap ``<name>-tls-config``.

``build`` returns that ConfigMap with the CA certificate of the endpoint's serving
certificate, applied on every build, so a rotated CA reaches jobs built afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainjob import constants as c
from trainjob import trainer_status as ts
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import ExtraObject
from trainjob.runtime.pod_template import merge_env
from trainjob.runtime.podsets import RuntimeInfo, RuntimePolicy


class TrainerStatusPlugin:
    """Configured with the endpoint's base URL (``https://host:port``) and a function that
    reads its CA certificate (PEM) when a job is built."""

    name = "TrainJobStatus"

    def __init__(self, base_url: str, read_ca: Callable[[], str]):
        self.base_url = base_url.rstrip("/")
        self.read_ca = read_ca

    def enabled(self, policy: RuntimePolicy) -> bool:
        return True  # every job may report, whatever its ML policy

    def env(self, job: TrainJob) -> list[dict[str, str]]:
        namespace, name = job.metadata.namespace or "", job.metadata.name
        return [
            {"name": ts.ENV_URL, "value": self.base_url + ts.status_path(namespace, name)},
            {"name": ts.ENV_CA_CERT, "value": f"{ts.MOUNT_PATH}/{ts.CA_CERT_FILE}"},
            {"name": ts.ENV_TOKEN, "value": f"{ts.MOUNT_PATH}/{ts.TOKEN_FILE}"},
        ]

    @staticmethod
    def volume(job: TrainJob) -> dict[str, Any]:
        namespace, name = job.metadata.namespace or "", job.metadata.name
        return {"name": ts.VOLUME_NAME, "projected": {"sources": [
            {"serviceAccountToken": {"audience": ts.token_audience(namespace, name),
                                     "expirationSeconds": ts.TOKEN_EXPIRY_SECONDS,
                                     "path": ts.TOKEN_FILE}},
            {"configMap": {"name": ts.configmap_name(name),
                           "items": [{"key": ts.CA_CERT_FILE, "path": ts.CA_CERT_FILE}]}},
        ]}}

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        trainers = info.by_role(c.ROLE_TRAINER)
        if not trainers:
            return
        pod_set = trainers[0]  # upstream wires the first trainer PodSet only
        mount = {"name": ts.VOLUME_NAME, "mountPath": ts.MOUNT_PATH, "readOnly": True}
        for container in pod_set.containers:
            merge_env(container, self.env(job))
            mounts = container.setdefault("volumeMounts", [])
            # Upstream replaces a mount at the same path (whatever its name).
            for i, existing in enumerate(mounts):
                if existing.get("mountPath") == ts.MOUNT_PATH:
                    mounts[i] = dict(mount)
                    break
            else:
                mounts.append(dict(mount))
        volumes = pod_set.volumes
        for i, existing in enumerate(volumes):
            if existing.get("name") == ts.VOLUME_NAME:
                volumes[i] = self.volume(job)
                break
        else:
            volumes.append(self.volume(job))

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[ExtraObject]:
        return [ExtraObject(body={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ts.configmap_name(job.metadata.name),
                         "namespace": job.metadata.namespace},
            "data": {ts.CA_CERT_FILE: self.read_ca()},
        }, plural="configmaps")]
