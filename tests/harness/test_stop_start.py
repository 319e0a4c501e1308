"""Stopping one cluster keeps its data and leaves the others serving."""

from kubernetes import client

from clusters.testing import eventually


def test_stop_and_start_one_cluster(multicluster, namespace):
    worker1 = multicluster["worker-1"]
    worker1.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="survivor"), data={"k": "v"}))

    info = multicluster.stop("worker-1")
    try:
        assert info.state == "stopped"
        assert not worker1.reachable(), "worker-1 still answers /readyz after stop"
        # The others keep answering, reads and writes.
        for name in ("manager", "worker-2"):
            other = multicluster[name]
            assert other.reachable(), f"{name} stopped answering while worker-1 was down"
            other.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="written-during-outage")))
    finally:
        info = multicluster.start("worker-1")
    assert info.state == "running"
    survivor = eventually(
        lambda: worker1.core.read_namespaced_config_map("survivor", namespace),
        lambda cm: cm.data == {"k": "v"},
        expected="ConfigMap survivor with data k=v to survive the restart",
    )
    assert survivor.metadata.name == "survivor"
    # Same address after the restart: the kubeconfig clients already hold keeps working.
    assert worker1.control_plane.server == multicluster.harness.status()[1].server
