"""An informer's watch on a resource nobody changes, against the manager's real apiserver:
a watch that stays open but silent past its read timeout is watched again from where it
was, quietly; it is not a failure, and what changes afterwards is still seen. A watch the
apiserver ends (its requested timeout) is watched again over the same connection."""

from __future__ import annotations

import functools
import inspect
import logging

import pytest
from kubernetes import client

from clusters.testing import eventually, holds_for
from controller_kit.informer import Informer

SILENCE = 1.0  # seconds without a byte before the watch's read gives up


def test_a_quiet_watch_is_watched_again_without_a_failure(multicluster, namespace, caplog):
    core = client.CoreV1Api(multicluster.manager.api)
    # The apiserver would end the watch later than the read gives up: the read timeout is
    # what ends each watch here.
    informer = Informer("quiet/configmaps",
                        functools.partial(core.list_namespaced_config_map, namespace),
                        watch_timeout=60, silence_timeout=SILENCE)
    caplog.set_level(logging.DEBUG, logger="controller_kit.informer")
    informer.start()
    try:
        assert informer.wait_synced(10), "the informer did not list the namespace in 10 s"

        def state() -> tuple:
            warnings = [r.getMessage() for r in caplog.records
                        if r.name == "controller_kit.informer" and r.levelno >= logging.WARNING]
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


def _connections_made(api: client.ApiClient) -> int:
    """Connections the client's pools opened so far (TCP and TLS each)."""
    pools = api.rest_client.pool_manager.pools
    return sum(pools[key].num_connections for key in pools.keys())


def test_a_quiet_watch_the_apiserver_ends_is_watched_again_on_the_same_connection(
        multicluster, namespace):
    manager = multicluster.manager
    api = client.ApiClient(manager.api.configuration)  # a pool of its own, to count
    list_configmaps = functools.partial(client.CoreV1Api(api).list_namespaced_config_map,
                                        namespace)
    asked: list[int] = []  # the timeout each watch asked the apiserver for

    def list_or_watch(**kwargs):
        if kwargs.get("watch"):
            asked.append(kwargs["timeout_seconds"])
        return list_configmaps(**kwargs)

    informer = Informer("ended/configmaps", list_or_watch, watch_timeout=2)
    informer.start()
    try:
        assert informer.wait_synced(10), "the informer did not list the namespace in 10 s"
        # Each watch asks to be ended within 1-2 s; its read would give up after 90 s.
        eventually(lambda: list(asked), lambda seen: len(seen) >= 3, timeout=30,
                   expected="the quiet watch ended by the apiserver and opened again twice")
        assert set(asked) <= {1, 2}, asked
        assert _connections_made(api) == 1, (
            "expected the list and every watch to share one connection, the apiserver "
            f"having ended each watch cleanly; the client opened {_connections_made(api)}")
        client.CoreV1Api(manager.api).create_namespaced_config_map(
            namespace, {"metadata": {"name": "after"}})
        eventually(lambda: informer.get(namespace, "after"), lambda obj: obj is not None,
                   expected=f"ConfigMap {namespace}/after in the cache after ended watches")
    finally:
        informer.stop()
        api.close()


def test_by_default_the_apiserver_ends_a_watch_before_its_read_would_time_out(
        multicluster, namespace):
    """So that a quiet watch keeps its connection (above), and the watches a process opens
    together do not all end together: each asks for a timeout of its own."""
    core = client.CoreV1Api(multicluster.manager.api)
    silence = inspect.signature(Informer).parameters["silence_timeout"].default
    asked: list[int] = []

    def list_or_watch(**kwargs):
        if kwargs.get("watch"):
            asked.append(kwargs["timeout_seconds"])
        return core.list_namespaced_config_map(namespace, **kwargs)

    informers = [Informer(f"default-{i}/configmaps", list_or_watch).start() for i in range(8)]
    try:
        eventually(lambda: list(asked), lambda seen: len(seen) >= 8, timeout=30,
                   expected="each of 8 informers watching")
        assert all(timeout < silence - 5 for timeout in asked), (silence, asked)
        assert len(set(asked)) > 1, f"expected timeouts of their own; saw {asked}"
    finally:
        for informer in informers:
            informer.stop()


def test_a_watch_timeout_under_a_second_is_refused_by_name():
    with pytest.raises(ValueError, match=r"informer quiet/configmaps: watch_timeout must be "
                                         r"at least 1 s, not 0"):
        Informer("quiet/configmaps", lambda **kwargs: None, watch_timeout=0)
