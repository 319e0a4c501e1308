"""Faults and bad input around the dispatcher: the manager's apiserver restarting, broken
worker registrations, jobs nothing can run, unusual but valid objects."""

from __future__ import annotations

import base64
import json
import secrets

import yaml
from kubernetes import client

from clusters import fixtures
from clusters.testing import eventually, holds_for

from dispatch_helpers import (
    CONFIG,
    MK,
    active,
    create,
    get,
    placement,
    remotes,
    trainjob,
    wait_no_namespace_terminating,
    wait_pending,
    wait_placed,
)


def test_the_manager_apiserver_restarting(dispatch_env, namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("before"))
    wait_placed(env, namespace, "before")
    restarts = env.dispatcher.lease_restarts
    env.multicluster.stop("manager")
    env.multicluster.start("manager")
    # The leader could not renew its lease meanwhile: it stopped writing and exited, as
    # a leader must, and its supervisor (here: the test's, as a Deployment would) started
    # it again.
    eventually(lambda: env.dispatcher.lease_restarts, lambda count: count > restarts,
               timeout=30, expected="the leader to exit after losing its lease, and be "
                                    "started again")
    log = env.dispatcher.log_file.read_text()
    assert "lost leadership: stopping" in log, env.dispatcher.log_tail(60)
    assert "(supervision: exit code 1 after a lost Lease" in log, env.dispatcher.log_tail(60)
    # Objects created while it starts again are handled once it runs.
    create(env.manager, namespace, trainjob("during"))
    eventually(env.dispatcher.readyz, lambda answer: answer[0] == 200, timeout=60,
               expected="the restarted dispatcher ready")
    create(env.manager, namespace, trainjob("after"))
    for name in ("before", "during", "after"):
        wait_placed(env, namespace, name)


def test_broken_registrations_are_reported_and_nothing_else_suffers(dispatch_env, namespace):
    env = dispatch_env
    core = env.manager.core
    name = f"broken-{namespace}"[:60]
    secret_name = f"{name}-kubeconfig"
    env.manager.custom.create_cluster_custom_object(*MK, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
        "metadata": {"name": name},
        "spec": {"clusterSource": {"kubeConfig": {"location": secret_name}}}})
    fixtures.register_config(env.manager.api, CONFIG, ["worker-1", "worker-2", name])
    dead = yaml.safe_load(env.multicluster["worker-1"].kubeconfig.read_text())
    dead["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens
    good = env.multicluster["worker-1"].kubeconfig.read_bytes()

    def put(data: dict[str, bytes] | None) -> None:
        if data is None:
            return
        body = client.V1Secret(metadata=client.V1ObjectMeta(name=secret_name),
                               data={k: base64.b64encode(v).decode() for k, v in data.items()})
        try:
            core.replace_namespaced_secret(secret_name, "kueue-system", body)
        except client.exceptions.ApiException:
            core.create_namespaced_secret("kueue-system", body)

    cases = [
        (None, "BadKubeConfig", "not found"),
        ({"other-key": b"x"}, "BadKubeConfig", "has no key 'kubeconfig'"),
        ({"kubeconfig": b""}, "BadKubeConfig", "has no key 'kubeconfig'"),
        ({"kubeconfig": b"{ not: yaml: ["}, "BadKubeConfig", "not valid YAML"),
        ({"kubeconfig": yaml.safe_dump(dead).encode()}, "ClientConnectionFailed", "cannot reach"),
    ]
    try:
        for i, (data, reason, words) in enumerate(cases):
            put(data)
            seen = eventually(lambda: active(env, name),
                              lambda cond, r=reason, w=words: cond.get("reason") == r
                              and w in cond.get("message", ""), timeout=30,
                              expected=f"case {i}: Active=False {reason} mentioning {words!r}")
            assert seen["status"] == "False"
            # Everything else keeps working.
            create(env.manager, namespace, trainjob(f"ok-{i}"))
            worker, _ = wait_placed(env, namespace, f"ok-{i}")
            assert worker in ("worker-1", "worker-2")
        # Fixing the Secret recovers without a restart: it connects, and (worker-1's
        # kubeconfig) is recognised as a second registration of worker-1.
        put({"kubeconfig": good})
        eventually(lambda: active(env, name),
                   lambda cond: cond.get("reason") == "DuplicateRegistration"
                   and "worker-1" in cond.get("message", ""), timeout=30,
                   expected="connected once the Secret is fixed, and known as worker-1")
    finally:
        fixtures.register_config(env.manager.api, CONFIG, ["worker-1", "worker-2"])
        env.manager.custom.delete_cluster_custom_object(*MK, name)
        try:
            core.delete_namespaced_secret(secret_name, "kueue-system")
        except client.exceptions.ApiException:
            pass


def test_a_job_nothing_can_run_waits_quietly(dispatch_env, namespace):
    env = dispatch_env
    # Pods of earlier tests going away change the free capacity that a pending job's
    # message quotes; "nothing changes" needs them gone first.
    wait_no_namespace_terminating(env)
    create(env.manager, namespace, trainjob("nowhere", runtime="no-such-runtime"))
    create(env.manager, namespace, trainjob("too-big", requests={"cpu": "1000"}))
    messages = {}
    for name, words in (("nowhere", "ClusterTrainingRuntime no-such-runtime not found"),
                        ("too-big", "needs 1000.2 cpu")):
        placed = wait_pending(env, namespace, name, f"worker-1: {words}", f"worker-2: {words}")
        messages[name] = placed["message"]

    def warnings() -> list[tuple[str, str, int]]:
        return sorted((e.involved_object.name, e.message, e.count or 1) for e in
                      env.manager.core.list_namespaced_event(namespace).items
                      if e.reason == "NoWorkerFits")

    # Events are recorded asynchronously, after the condition write.
    before = eventually(warnings, lambda seen: all((n, m) in {s[:2] for s in seen}
                                                 for n, m in messages.items()),
                        expected=f"a NoWorkerFits Event with each final message {messages}")
    # No hot loop: nothing is rewritten and no further Event is emitted while nothing changes.
    snapshot = {n: get(env.manager, namespace, n)["metadata"]["resourceVersion"]
                for n in ("nowhere", "too-big")}
    holds_for(lambda: {n: get(env.manager, namespace, n)["metadata"]["resourceVersion"]
                       for n in snapshot}, lambda now: now == snapshot, seconds=3,
              expected=f"pending jobs left unwritten at {snapshot}")
    assert warnings() == before, "expected no NoWorkerFits Event while nothing changed"
    assert remotes(env, namespace, "nowhere") == {} and placement(
        get(env.manager, namespace, "too-big")) is None


def test_unusual_but_valid_jobs_are_mirrored_exactly(dispatch_env, namespace):
    env = dispatch_env
    long_name = ("x" * 62) + "y"  # 63 characters, the limit for a DNS label
    job = trainjob(long_name)
    job["metadata"]["labels"] = {"team": "ml-platform", "example.com/" + "k" * 50: "v" * 63}
    job["metadata"]["annotations"] = {"description": "Обучение модели — 学習 — 🚀 " * 20}
    job["spec"]["trainer"]["env"] = [{"name": f"VAR_{i}", "value": "é" * 100} for i in range(400)]
    created = create(env.manager, namespace, job)
    _, remote = wait_placed(env, namespace, long_name)
    assert remote["metadata"]["labels"]["example.com/" + "k" * 50] == "v" * 63
    assert remote["metadata"]["annotations"]["description"] == \
        created["metadata"]["annotations"]["description"]
    assert remote["spec"]["trainer"]["env"] == created["spec"]["trainer"]["env"]


def test_a_broken_kubeconfig_never_echoes_its_content(dispatch_env, tmp_path):
    """A token planted in a kubeconfig that is not valid YAML, in a Secret and in a Path
    file, shows up in no status, Event, log line or dashboard field: the error says where
    the YAML breaks, not what the line holds."""
    env = dispatch_env
    token = f"s3cr3t-{secrets.token_hex(8)}"
    broken = (f"apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n"
              f"    token: {token}: [unclosed\n").encode()
    path = tmp_path / "worker.kubeconfig"
    path.write_bytes(broken)
    env.manager.core.create_namespaced_secret("kueue-system", client.V1Secret(
        metadata=client.V1ObjectMeta(name="leaky-kubeconfig"),
        data={"kubeconfig": base64.b64encode(broken).decode()}))
    for name, source in (("leaky-secret", {"location": "leaky-kubeconfig"}),
                         ("leaky-path", {"location": str(path), "locationType": "Path"})):
        env.manager.custom.create_cluster_custom_object(*MK, {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
            "metadata": {"name": name}, "spec": {"clusterSource": {"kubeConfig": source}}})
    fixtures.register_config(env.manager.api, CONFIG,
                             ["worker-1", "worker-2", "leaky-secret", "leaky-path"])
    try:
        for name in ("leaky-secret", "leaky-path"):
            seen = eventually(lambda n=name: active(env, n),
                              lambda cond: cond.get("reason") == "BadKubeConfig", timeout=30,
                              expected=f"{name} Active=False BadKubeConfig")
            assert "not valid YAML at line 6, column" in seen["message"], seen
        state = env.dispatcher.get("/api/state")[1]
        assert "leaky-path" in state
        places = {
            "MultiKueueClusters": json.dumps(env.manager.custom.list_cluster_custom_object(
                *MK)["items"]),
            "Events": json.dumps([e.to_dict() for e in
                                  env.manager.core.list_event_for_all_namespaces().items],
                                 default=str),
            "dispatcher log": env.dispatcher.log_file.read_text(),
            "dashboard /api/state": state,
        }
        leaked = [where for where, text in places.items() if token in text]
        assert leaked == [], f"the planted token appears in {leaked}"
    finally:
        fixtures.register_config(env.manager.api, CONFIG, ["worker-1", "worker-2"])
        for name in ("leaky-secret", "leaky-path"):
            env.manager.custom.delete_cluster_custom_object(*MK, name)
        env.manager.core.delete_namespaced_secret("leaky-kubeconfig", "kueue-system")
