"""kube-controller-manager's garbage collector really runs: owners take their dependents."""

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.testing import eventually

TRAINJOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


def _exists(read) -> bool:
    try:
        read()
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def test_deleting_a_trainjob_removes_the_jobset_it_owns(multicluster, namespace):
    worker = multicluster["worker-1"]
    trainjob = worker.custom.create_namespaced_custom_object(*TRAINJOBS[:2], namespace,
                                                             TRAINJOBS[2], {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "owner"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    })
    worker.custom.create_namespaced_custom_object(*JOBSETS[:2], namespace, JOBSETS[2], {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "owner", "ownerReferences": [{
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "name": "owner", "uid": trainjob["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }]},
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "node", "image": "busybox"}]}}}}}]},
    })
    # The real JobSet controller makes its Job; the collector takes that along too.
    batch = client.BatchV1Api(worker.api)
    eventually(lambda: [j.metadata.name for j in batch.list_namespaced_job(namespace).items],
               lambda names: names == ["owner-node-0"],
               expected="the JobSet controller to create Job owner-node-0")
    worker.custom.delete_namespaced_custom_object(
        *TRAINJOBS[:2], namespace, TRAINJOBS[2], "owner", propagation_policy="Background")
    eventually(
        lambda: _exists(lambda: worker.custom.get_namespaced_custom_object(
            *JOBSETS[:2], namespace, JOBSETS[2], "owner")),
        lambda exists: not exists,
        expected="JobSet owner to be garbage-collected after its TrainJob was deleted",
    )
    eventually(lambda: batch.list_namespaced_job(namespace).items, lambda jobs: not jobs,
               expected="Job owner-node-0 garbage-collected after its JobSet")


def test_foreground_deletion_waits_for_dependents(multicluster, namespace):
    core = multicluster["worker-2"].core
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(
        name="dependent", owner_references=[client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid,
            block_owner_deletion=True)])))
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Foreground")
    # Foreground deletion is carried out by the garbage collector alone: both objects
    # disappearing proves it is running and processing the foregroundDeletion finalizer.
    eventually(
        lambda: (_exists(lambda: core.read_namespaced_config_map("owner", namespace)),
                 _exists(lambda: core.read_namespaced_config_map("dependent", namespace))),
        lambda both: both == (False, False),
        expected="owner and dependent ConfigMaps both gone (owner, dependent exist = False, False)",
    )


def test_deleting_a_namespace_empties_it(multicluster, namespace):
    core = multicluster["manager"].core
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="content")))
    core.delete_namespace(namespace)
    eventually(
        lambda: _exists(lambda: core.read_namespace(namespace)),
        lambda exists: not exists,
        expected=f"namespace {namespace} finalized by the namespace controller and gone",
        timeout=90,
    )
