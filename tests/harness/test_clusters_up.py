"""The session's clusters are real, separate Kubernetes 1.34 control planes."""

import re

from kubernetes import client

from clusters.binaries import KUBERNETES_VERSION


def test_every_cluster_reports_the_pinned_kubernetes_version(multicluster):
    names = [c.name for c in multicluster]
    assert names == ["manager", "worker-1", "worker-2"]
    minor = re.match(r"v\d+\.\d+", KUBERNETES_VERSION).group(0)
    for cluster in multicluster:
        version = client.VersionApi(cluster.api).get_code()
        assert version.git_version.startswith(minor + "."), (
            f"{cluster.name}: /version gitVersion {version.git_version}, expected {minor}.x"
        )
        assert version.git_version == KUBERNETES_VERSION


def test_clusters_are_separate_api_servers(multicluster, namespace):
    # The same name in each cluster holds different data: no shared etcd, no shared server.
    for cluster in multicluster:
        cluster.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="who"), data={"cluster": cluster.name}))
    for cluster in multicluster:
        seen = cluster.core.read_namespaced_config_map("who", namespace).data["cluster"]
        assert seen == cluster.name
    servers = {c.control_plane.server for c in multicluster}
    assert len(servers) == 3


def test_crds_are_established_on_every_cluster(multicluster):
    expected_everywhere = {
        "trainjobs.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
    }
    multikueue = {"multikueueclusters.kueue.x-k8s.io", "multikueueconfigs.kueue.x-k8s.io"}
    # Upstream JobSet's CRD, where its controller runs.
    jobset = {"jobsets.jobset.x-k8s.io"}
    for cluster in multicluster:
        crds = client.ApiextensionsV1Api(cluster.api).list_custom_resource_definition().items
        established = {
            crd.metadata.name for crd in crds
            if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
        }
        wanted = expected_everywhere | (multikueue if cluster.role == "manager" else jobset)
        assert wanted <= established, f"{cluster.name}: missing {wanted - established}"
        if cluster.role == "worker":
            assert not (multikueue & established), (
                f"{cluster.name}: MultiKueue CRDs belong on the manager only"
            )
        else:
            assert not (jobset & established), f"{cluster.name}: no JobSet controller runs here"
