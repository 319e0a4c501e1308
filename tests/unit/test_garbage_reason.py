"""Which remote copies the garbage collector removes (pure)."""

from dispatcher.standalone.garbage_collection import garbage_reason
from trainjob import constants as c


def remote(origin="multikueue", uid="m-1"):
    return {"metadata": {"name": "j", "namespace": "n", "uid": "r-1",
                         "labels": {c.MULTIKUEUE_ORIGIN_LABEL: origin},
                         "annotations": {c.MANAGER_UID_ANNOTATION: uid}}}


def manager(placed="worker-1", uid="m-1", deleting=False):
    meta = {"name": "j", "namespace": "n", "uid": uid,
            "annotations": {c.PLACEMENT_ANNOTATION: placed} if placed else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_a_wanted_copy_stays():
    assert garbage_reason(remote(), manager(), "worker-1", "multikueue") is None


def test_someone_elses_object_is_never_garbage():
    assert garbage_reason(remote(origin="other"), None, "worker-1", "multikueue") is None


def test_garbage_cases():
    assert "gone" in garbage_reason(remote(), None, "worker-1", "multikueue")
    assert "being deleted" in garbage_reason(remote(), manager(deleting=True), "worker-1",
                                             "multikueue")
    assert "earlier" in garbage_reason(remote(uid="old"), manager(), "worker-1", "multikueue")
    assert "placed on worker-2" in garbage_reason(remote(), manager("worker-2"), "worker-1",
                                                  "multikueue")
    assert "no worker" in garbage_reason(remote(), manager(None), "worker-1", "multikueue")
