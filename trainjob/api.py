"""Typed views of the TrainJob and runtime objects (pydantic v2).

The API server owns validation and defaulting; these models only give Python code names
instead of dictionary paths. They accept unknown fields, so a newer CRD never breaks a
reader. Embedded Kubernetes types (env vars, volumes, tolerations, pod templates) stay
plain dictionaries, exactly as the API returns them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from trainjob import constants as c
from trainjob.managed_by import operator_manages


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    def dump(self) -> dict[str, Any]:
        """The object as the API spells it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True)


class ObjectMeta(_Model):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)


class RuntimeRef(_Model):
    name: str
    api_group: str = c.TRAINER_GROUP
    kind: str = c.CLUSTERTRAININGRUNTIME_KIND


class SecretRef(_Model):
    name: str


class Initializer(_Model):
    storage_uri: str | None = None
    env: list[dict[str, Any]] = Field(default_factory=list)
    secret_ref: SecretRef | None = None


class Initializers(_Model):
    dataset: Initializer | None = None
    model: Initializer | None = None


class ResourceRequirements(_Model):
    limits: dict[str, int | str] = Field(default_factory=dict)
    requests: dict[str, int | str] = Field(default_factory=dict)
    claims: list[dict[str, Any]] = Field(default_factory=list)


class Trainer(_Model):
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict[str, Any]] = Field(default_factory=list)
    num_nodes: int | None = None
    resources_per_node: ResourceRequirements | None = None
    num_proc_per_node: int | str | None = None


class TargetJob(_Model):
    name: str


class ContainerOverride(_Model):
    name: str
    env: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)


class PodSpecOverride(_Model):
    target_jobs: list[TargetJob]
    service_account_name: str | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    volumes: list[dict[str, Any]] | None = None
    init_containers: list[ContainerOverride] | None = None
    containers: list[ContainerOverride] | None = None
    scheduling_gates: list[dict[str, Any]] | None = None


class RuntimePatch(_Model):
    """One manager's patch of the runtime template (``spec.runtimePatches[]``); the patch
    itself stays as the API returns it."""

    manager: str
    time: str | None = None
    training_runtime_spec: dict[str, Any] | None = None


class TrainJobSpec(_Model):
    runtime_ref: RuntimeRef
    initializer: Initializers | None = None
    trainer: Trainer | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    pod_spec_overrides: list[PodSpecOverride] = Field(default_factory=list)
    runtime_patches: list[RuntimePatch] = Field(default_factory=list)
    active_deadline_seconds: int | None = None
    suspend: bool = False
    managed_by: str | None = None


class Condition(_Model):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None


class JobStatus(_Model):
    name: str
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    active: int = 0
    suspended: int = 0


class TrainJobStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    jobs_status: list[JobStatus] = Field(default_factory=list)


class TrainJob(_Model):
    api_version: str = c.TRAINER_API_VERSION
    kind: str = c.TRAINJOB_KIND
    metadata: ObjectMeta
    spec: TrainJobSpec
    status: TrainJobStatus = Field(default_factory=TrainJobStatus)

    @property
    def managed_by_operator(self) -> bool:
        """True when the built-in training operator owns this job (``trainjob.managed_by``)."""
        return operator_manages(self.spec.managed_by)

    def condition(self, type_: str) -> Condition | None:
        return next((x for x in self.status.conditions if x.type == type_), None)

    def is_true(self, type_: str) -> bool:
        found = self.condition(type_)
        return found is not None and found.status == "True"

    @property
    def finished(self) -> bool:
        return any(self.is_true(type_) for type_ in c.FINISHED_CONDITIONS)


class EnvInjectionTarget(_Model):
    job_name: str
    container_names: list[str] = Field(default_factory=list)


class EnvInjection(_Model):
    targets: list[EnvInjectionTarget] = Field(default_factory=list)


class TorchPolicy(_Model):
    num_proc_per_node: int | str | None = None
    env_injection: EnvInjection | None = None


class MPIPolicy(_Model):
    num_proc_per_node: int | None = None
    mpi_implementation: str | None = None
    ssh_auth_mount_path: str | None = None
    run_launcher_as_node: bool | None = None


class MLPolicy(_Model):
    """``mlPolicy``: the node count and at most one source (upstream's CRD allows one).
    JAX and XGBoost sources have no fields; Flux's are kept as the API returns them."""

    num_nodes: int | None = None
    torch: TorchPolicy | None = None
    mpi: MPIPolicy | None = None
    jax: dict[str, Any] | None = None
    xgboost: dict[str, Any] | None = None
    flux: dict[str, Any] | None = None


class TemplateMeta(_Model):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RuntimeTemplate(_Model):
    metadata: TemplateMeta = Field(default_factory=TemplateMeta)
    spec: dict[str, Any] = Field(default_factory=dict)


class TrainingRuntimeSpec(_Model):
    ml_policy: MLPolicy | None = None
    pod_group_policy: dict[str, Any] | None = None
    template: RuntimeTemplate = Field(default_factory=RuntimeTemplate)


class TrainingRuntime(_Model):
    """A TrainingRuntime or a ClusterTrainingRuntime (same spec; ``kind`` tells which)."""

    api_version: str = c.TRAINER_API_VERSION
    kind: str = c.CLUSTERTRAININGRUNTIME_KIND
    metadata: ObjectMeta
    spec: TrainingRuntimeSpec = Field(default_factory=TrainingRuntimeSpec)
