"""API groups, well-known values, labels and condition vocabulary shared by both sides."""

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINER_API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
TRAINJOBS = "trainjobs"
TRAININGRUNTIMES = "trainingruntimes"
CLUSTERTRAININGRUNTIMES = "clustertrainingruntimes"
TRAINJOB_KIND = "TrainJob"
TRAININGRUNTIME_KIND = "TrainingRuntime"
CLUSTERTRAININGRUNTIME_KIND = "ClusterTrainingRuntime"

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSETS = "jobsets"
# The label the JobSet controller puts on every pod of a JobSet.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# ... and the name of the replicated job the pod belongs to.
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_KIND = "JobSet"

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
MULTIKUEUECLUSTERS = "multikueueclusters"
MULTIKUEUECONFIGS = "multikueueconfigs"

# spec.managedBy: the project's CRD sets no default; unset or empty means the built-in
# operator, and so do the seed's value and upstream Trainer's (its CRD default). Who owns
# which value is decided in one place: ``trainjob.managed_by``.
MANAGED_BY_TRAINING_OPERATOR = "kubeflow.org/training-operator"
MANAGED_BY_TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# Replicated-job roles, by name or by this label on the replicated job's template.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ROLE_DATASET_INITIALIZER = "dataset-initializer"
ROLE_MODEL_INITIALIZER = "model-initializer"
ROLE_TRAINER = "trainer"
ROLE_LAUNCHER = "launcher"
INITIALIZER_ROLES = (ROLE_DATASET_INITIALIZER, ROLE_MODEL_INITIALIZER)

# Replicated-job and container names.
NODE = "node"
LAUNCHER = "launcher"
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"

# TrainJob condition types and reasons.
CONDITION_SUSPENDED = "Suspended"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
# A TrainJob with either of these True is finished, for good.
FINISHED_CONDITIONS = (CONDITION_COMPLETE, CONDITION_FAILED)
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
# The dispatcher's own conditions on a manager TrainJob (the rest of its status is the
# copy's), and their reasons.
CONDITION_PLACED = "Placed"
# Placed=True (and the Event of a placement): the job has a worker, named in the message.
REASON_PLACED = "Placed"
CONDITION_WORKER_REACHABLE = "WorkerReachable"
REASON_NO_WORKER = "NoWorkerFits"
REASON_REMOTE_DELETED = "RemoteDeleted"
REASON_WORKER_UNREACHABLE = "WorkerUnreachable"
REASON_WORKER_LOST = "WorkerLost"
REASON_WORKER_REMOVED = "WorkerRemoved"

# JobSet condition types.
JOBSET_COMPLETED = "Completed"
JOBSET_FAILED = "Failed"
JOBSET_SUSPENDED = "Suspended"

# MultiKueue conventions.
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
# The dispatcher's own origin (standalone mode). Not Kueue's default: a standalone dispatcher
# beside Kueue must not label its copies as Kueue does (dispatcher/standalone/beside_kueue.py).
DEFAULT_ORIGIN = "trainjob-dispatcher"
# Kueue's multiKueue.origin when its Configuration sets none; kueue mode's default, since
# there the origin must be Kueue's.
KUEUE_DEFAULT_ORIGIN = "multikueue"
# Where Kueue's release installs it: its Configuration ConfigMap and the kubeconfig Secrets
# of its MultiKueueClusters.
KUEUE_NAMESPACE = "kueue-system"
# Kueue's: the LocalQueue a job is submitted to (a label); and, on a copy Kueue made, its
# Workload (an annotation since Kueue 0.19, a label before).
KUEUE_QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
# The spec.runtimePatches entry Kueue's TrainJob webhook adds to every TrainJob it sees.
KUEUE_RUNTIME_PATCH_MANAGER = "kueue.x-k8s.io/manager"

# The dispatcher's own keys. On the manager TrainJob: where it was placed, and the finalizer
# that holds deletion until the remote copy is gone. On the remote copy: the manager
# object's UID (a same-named manager object created later is a different job) and the
# job's footprint (so capacity reservations survive a dispatcher restart).
PLACEMENT_ANNOTATION = "trainjob-dispatcher.io/cluster"
# The User-Agent of every request each component makes (its name, then the client's).
DISPATCHER_USER_AGENT = "trainjob-dispatcher"
OPERATOR_USER_AGENT = "training-operator"
# The field manager of every write the dispatcher makes (manager TrainJobs and Workloads,
# MultiKueueCluster conditions, copies on workers): Kueue mode reads its nomination time
# back from this entry of a Workload's managed fields.
DISPATCHER_FIELD_MANAGER = "trainjob-dispatcher"
DISPATCH_FINALIZER = "trainjob-dispatcher.io/remote-cleanup"
MANAGER_UID_ANNOTATION = "trainjob-dispatcher.io/manager-uid"
REQUESTS_ANNOTATION = "trainjob-dispatcher.io/requests"
