"""Kueue in the harness: the controller runs beside each cluster that asks for it, with its
CRDs and webhooks from its module, and the manager serves Kueue's MultiKueue CRDs (v1beta2
stored, v1beta1 converted by Kueue itself) instead of the project's."""

from __future__ import annotations

from kubernetes import client

from clusters import fixtures, kueue
from clusters.testing import eventually
from trainjob import constants as c


def test_kueue_runs_and_serves_its_multikueue_crds(kueue_multicluster):
    infos = {i.name: i for i in kueue_multicluster.harness.status()}
    assert {n: (i.state, i.problems) for n, i in infos.items()} == {
        n: ("running", []) for n in ("manager", "worker-1", "worker-2")}, (
        f"expected every Kueue cluster running with no problem; saw {infos}")
    manager = kueue_multicluster.manager
    served = client.ApiextensionsV1Api(manager.api).read_custom_resource_definition(
        f"{c.MULTIKUEUECLUSTERS}.{c.KUEUE_GROUP}")
    versions = {v.name: (v.served, v.storage) for v in served.spec.versions}
    assert versions == {"v1beta1": (True, False), "v1beta2": (True, True)}, (
        f"expected Kueue's MultiKueueCluster CRD (v1beta2 stored, v1beta1 served); saw {versions}")
    assert served.spec.conversion.strategy == "Webhook", (
        f"expected conversion through Kueue's webhook; saw {served.spec.conversion.strategy}")

    fixtures.register_worker(manager.api, "harness-probe",
                             kueue_multicluster["worker-1"].kubeconfig, namespace=kueue.NAMESPACE)
    try:
        old = eventually(
            lambda: manager.custom.get_cluster_custom_object(
                c.KUEUE_GROUP, "v1beta1", c.MULTIKUEUECLUSTERS, "harness-probe"),
            lambda obj: bool(obj.get("spec")),
            expected="the MultiKueueCluster read back at v1beta1 (converted by Kueue)")
        assert old["spec"].get("kubeConfig") == {
            "location": "harness-probe-kubeconfig", "locationType": "Secret"}, (
            f"expected v1beta1's spec.kubeConfig converted from v1beta2's "
            f"spec.clusterSource.kubeConfig; saw {old['spec']}")
        # Kueue's MultiKueue controller connects to the worker and says so.
        eventually(lambda: manager.custom.get_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, "harness-probe"),
            lambda obj: any(x["type"] == "Active" and x["status"] == "True"
                            for x in (obj.get("status") or {}).get("conditions") or []),
            expected="Kueue's Active=True on the MultiKueueCluster", timeout=60)
    finally:
        manager.custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                    c.MULTIKUEUECLUSTERS, "harness-probe")
