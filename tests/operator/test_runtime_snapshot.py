"""The runtime a TrainJob started from is kept beside it (upstream v2.3's runtime snapshot):
a ConfigMap ``<job>-runtime-snapshot`` controlled by the job. A later rebuild of the JobSet
(here: a runtime patch while suspended) uses the snapshot, so edits to the runtime made after
the job started do not reach it, and the job survives the runtime's deletion."""

from __future__ import annotations

import yaml

from clusters import fixtures
from clusters.testing import eventually
from trainjob import constants as c

TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)


def _node_container(jobset: dict) -> dict:
    node = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == c.NODE)
    return node["template"]["spec"]["template"]["spec"]["containers"][0]


def test_a_rebuild_uses_the_snapshot_not_the_edited_runtime(multicluster, namespace,
                                                            run_operator):
    worker = multicluster["worker-1"]
    runtime = fixtures.torch_runtime("snap", namespace=namespace)
    fixtures.install_runtime(worker.api, runtime)
    created = worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "kept"},
        "spec": {"runtimeRef": {"name": "snap", "kind": c.TRAININGRUNTIME_KIND},
                 "suspend": True}})
    run_operator(worker, "--namespace", namespace)

    def jobset():
        return worker.custom.get_namespaced_custom_object(*JOBSET, namespace, c.JOBSETS, "kept")

    first = eventually(jobset, lambda js: js is not None,
                       expected="JobSet kept built (suspended)", timeout=30)
    snapshot = worker.core.read_namespaced_config_map("kept-runtime-snapshot", namespace)
    assert [(r.kind, r.uid, r.controller) for r in snapshot.metadata.owner_references] == [
        (c.TRAINJOB_KIND, created["metadata"]["uid"], True)]
    kept = yaml.safe_load(snapshot.data["runtime"])
    assert (kept["kind"], kept["metadata"]["name"]) == (c.TRAININGRUNTIME_KIND, "snap")
    image = _node_container(first)["image"]

    # The runtime changes its image, then goes; the suspended job is rebuilt by a patch.
    runtime["spec"]["template"]["spec"]["replicatedJobs"][2]["template"]["spec"]["template"][
        "spec"]["containers"][0]["image"] = "edited:after-start"
    fixtures.install_runtime(worker.api, runtime)
    worker.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAININGRUNTIMES,
                                                  "snap")
    worker.custom.patch_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "kept", {
        "spec": {"runtimePatches": [{"manager": "example.com/queue", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": c.NODE, "template": {"spec": {
                "template": {"spec": {"nodeSelector": {"pool": "a"}}}}}}]}}}}]}},
        _content_type="application/merge-patch+json")
    rebuilt = eventually(jobset, lambda js: (js["spec"]["replicatedJobs"][2]["template"]["spec"]
                                             ["template"]["spec"].get("nodeSelector")
                                             == {"pool": "a"}),
                         expected="JobSet kept rebuilt with the runtime patch", timeout=30)
    assert _node_container(rebuilt)["image"] == image, (
        f"expected the snapshot's image {image!r} after the runtime changed and was deleted, "
        f"saw {_node_container(rebuilt)['image']!r}")
