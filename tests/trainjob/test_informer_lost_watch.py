"""An informer whose watch fails, against the manager's real apiserver: it is not resumed
but followed by a fresh list, and ``current`` is clear from the failure until that list is
complete (what placement waits for before trusting a worker's room again); what changed
meanwhile is in the cache afterwards. A watch the apiserver ends on time is resumed, with
no list."""

from __future__ import annotations

import functools
import threading

import urllib3
from kubernetes import client

from clusters.testing import eventually, holds_for
from controller_kit.informer import Informer


class FailingWatch:
    """The client's list call, but the next watch it opens after ``fail_next`` fails as a
    dropped connection does; ``current_seen`` records ``current`` at that moment."""

    def __init__(self, list_fn):
        self._list_fn = list_fn
        self.fail = threading.Event()
        self.informer: Informer | None = None
        self.current_when_listing: list[bool] = []

    def __call__(self, **kwargs):
        if kwargs.get("watch") and self.fail.is_set():
            self.fail.clear()
            raise urllib3.exceptions.ProtocolError("connection dropped by the test")
        if not kwargs.get("watch") and self.informer is not None:
            self.current_when_listing.append(self.informer.current.is_set())
        return self._list_fn(**kwargs)


def test_a_failed_watch_is_followed_by_a_fresh_list_and_current_meanwhile_is_clear(
        multicluster, namespace):
    core = client.CoreV1Api(multicluster.manager.api)
    failing = FailingWatch(functools.partial(core.list_namespaced_config_map, namespace))
    # Short watches: the apiserver ends each within 2 s, so the next one opens soon.
    informer = Informer("lost/configmaps", failing, watch_timeout=2, silence_timeout=10,
                        backoff_initial=0.1)
    failing.informer = informer
    informer.start()
    try:
        assert informer.wait_synced(10), "the informer did not list the namespace in 10 s"
        assert informer.current.is_set(), "a complete list leaves the cache current"
        # Watches the apiserver ends on time are resumed: no second list.
        holds_for(lambda: informer.relists, lambda count: count == 1, seconds=3,
                  expected="no list after watches the apiserver ended on time")
        failing.fail.set()
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "during"}})
        eventually(lambda: informer.relists, lambda count: count >= 2, timeout=15,
                   expected="a fresh list after the failed watch")
        assert failing.current_when_listing[1:] and not any(failing.current_when_listing[1:]), (
            "current must be clear while the fresh list runs; seen at each list: "
            f"{failing.current_when_listing}")
        eventually(informer.current.is_set, bool, timeout=10,
                   expected="current again once the fresh list is complete")
        eventually(lambda: informer.get(namespace, "during"), lambda obj: obj is not None,
                   expected=f"ConfigMap {namespace}/during in the cache after the relist")
        assert informer.last_error is None, informer.last_error
    finally:
        informer.stop()


def test_a_write_observed_while_a_relist_runs_is_not_undone_by_it(multicluster, namespace):
    """The list a relist replaces the cache with was served before this process's own
    write, which it put in the cache (``observe``) meanwhile: the write stays, as it is
    seen when the relist's synced handlers run (before the next watch can bring it)."""
    core = client.CoreV1Api(multicluster.manager.api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "placed"}})
    listing = functools.partial(core.list_namespaced_config_map, namespace)
    failing = FailingWatch(listing)
    written: list[dict] = []

    def list_then_write(**kwargs):
        response = failing(**kwargs)
        if not kwargs.get("watch") and informer.relists == 1 and not written:
            # Served already; now this process writes, and puts what it wrote in the cache.
            obj = client.ApiClient().sanitize_for_serialization(core.patch_namespaced_config_map(
                "placed", namespace, {"metadata": {"annotations": {"placed": "worker-2"}}}))
            informer.observe(obj)
            written.append(obj)
        return response

    informer = Informer("observed/configmaps", list_then_write, watch_timeout=2,
                        silence_timeout=10, backoff_initial=0.1)
    seen_after_relist: list[dict | None] = []
    informer.add_synced_handler(lambda: seen_after_relist.append(
        informer.get(namespace, "placed")) if informer.relists >= 2 else None)
    informer.start()
    try:
        assert informer.wait_synced(10), "the informer did not list the namespace in 10 s"
        failing.fail.set()
        eventually(lambda: seen_after_relist, bool, timeout=15,
                   expected="a relist after the failed watch, with the write made during it")
        assert written, "the write was not made during the relist"
        cached = seen_after_relist[0]
        assert cached is not None and (cached["metadata"].get("annotations") or {}).get(
            "placed") == "worker-2", (
            f"the relist put back the version listed before the write "
            f"(written at resourceVersion {written[0]['metadata']['resourceVersion']}): "
            f"{cached and cached['metadata']}")
    finally:
        informer.stop()
