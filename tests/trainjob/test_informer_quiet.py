"""An informer's watch on a resource nobody changes, against the manager's real apiserver:
a watch that stays open but silent past its read timeout is watched again from where it
was, quietly; it is not a failure, and what changes afterwards is still seen."""

from __future__ import annotations

import functools
import logging

from kubernetes import client

from clusters.testing import eventually, holds_for
from trainjob.informer import Informer

SILENCE = 1.0  # seconds without a byte before the watch's read gives up


def test_a_quiet_watch_is_watched_again_without_a_failure(multicluster, namespace, caplog):
    core = client.CoreV1Api(multicluster.manager.api)
    informer = Informer("quiet/configmaps",
                        functools.partial(core.list_namespaced_config_map, namespace),
                        silence_timeout=SILENCE)
    caplog.set_level(logging.DEBUG, logger="trainjob.informer")
    informer.start()
    try:
        assert informer.wait_synced(10), "the informer did not list the namespace in 10 s"

        def state() -> tuple:
            warnings = [r.getMessage() for r in caplog.records
                        if r.name == "trainjob.informer" and r.levelno >= logging.WARNING]
            return informer.last_error, informer.relists, warnings

        holds_for(state, lambda seen: seen == (None, 1, []), seconds=SILENCE * 3.5,
                  expected="no failure, no relist after the first list and no warning while "
                           "the watch is only quiet")
        quiet = [r for r in caplog.records if "quiet" in r.getMessage()]
        assert len(quiet) >= 2, ("expected the watch to have gone quiet and been opened "
                                 f"again at least twice in {SILENCE * 3.5:.1f}s; log: "
                                 f"{[r.getMessage() for r in caplog.records]}")
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "late"}})
        eventually(lambda: informer.get(namespace, "late"), lambda obj: obj is not None,
                   expected=f"ConfigMap {namespace}/late in the cache after quiet watches")
    finally:
        informer.stop()
