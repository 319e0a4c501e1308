"""What the dispatcher says when things go wrong, read from its log as a user reads it: a
worker that keeps failing, a bad --kubeconfig, a manager without the CRDs it needs."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes import client

from clusters import fixtures
from clusters.testing import eventually, holds_for, machine_load, stretched

MK = ("kueue.x-k8s.io", "v1beta2")


def active_condition(manager, name: str) -> dict:
    obj = manager.custom.get_cluster_custom_object(*MK, "multikueueclusters", name)
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x.get("type") == "Active"), {})


def lines_about(log_file, words: str) -> list[str]:
    return [line for line in log_file.read_text(errors="replace").splitlines()
            if words in line]


@pytest.fixture
def closed_port_worker(multicluster, tmp_path):
    """A MultiKueueCluster (and a MultiKueueConfig of its own) whose kubeconfig points at a
    port where nothing listens."""
    manager = multicluster.manager
    name = f"closed-{secrets.token_hex(3)}"
    dead = yaml.safe_load(multicluster["worker-1"].kubeconfig.read_text())
    dead["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(dead))
    fixtures.register_worker(manager.api, name, path)
    fixtures.register_config(manager.api, name, [name])
    yield name
    manager.custom.delete_cluster_custom_object(*MK, "multikueueconfigs", name)
    manager.custom.delete_cluster_custom_object(*MK, "multikueueclusters", name)
    client.CoreV1Api(manager.api).delete_namespaced_secret(f"{name}-kubeconfig", "kueue-system")


def test_a_failing_worker_logs_its_state_changes_not_every_retry(
        multicluster, closed_port_worker, run_dispatcher):
    manager = multicluster.manager
    dispatcher = run_dispatcher(manager, "--multikueue-config", closed_port_worker)
    # Every retry used to log: urllib3's "Retrying ..." warnings several times a second and
    # each informer's "list failed ... retrying" at every backoff step (at most 10 s apart).
    # Now each of the worker's informers says once that it fails, and then nothing until
    # its summary a minute later.
    eventually(lambda: lines_about(dispatcher.log_file, f"{closed_port_worker}/"), bool,
               timeout=30, expected=f"the dispatcher logging that {closed_port_worker} fails")
    started = time.monotonic()

    def lines_per_informer() -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in lines_about(dispatcher.log_file, f"{closed_port_worker}/"):
            informer = line.split(f"{closed_port_worker}/", 1)[1].split(":", 1)[0]
            counts[informer] = counts.get(informer, 0) + 1
        return counts

    holds_for(lines_per_informer, lambda counts: all(n == 1 for n in counts.values()),
              seconds=20, expected=f"one line per informer of {closed_port_worker} while it "
                                   f"keeps failing (log: {dispatcher.log_file})")
    assert time.monotonic() - started < 60, "the window must end before the first summary"
    log = dispatcher.log_file.read_text(errors="replace")
    assert "Retrying (Retry(" not in log, log
    assert "HTTP response headers" not in log, log
    assert all(len(line) < 1000 for line in log.splitlines()), log


def test_an_unreachable_worker_delays_neither_the_start_nor_the_stop(
        multicluster, closed_port_worker, run_dispatcher):
    """The first placements wait for the workers' caches, but a worker whose caches fail
    must not hold up the start (it waited out a 60 s sync timeout), and SIGTERM ends the
    process at once (it was ignored until the start was over)."""
    started = time.monotonic()
    dispatcher = run_dispatcher(multicluster.manager, "--multikueue-config",
                                closed_port_worker)
    eventually(lambda: lines_about(dispatcher.log_file, "leading: dispatching"), bool,
               timeout=20, expected=f"the dispatcher leading within seconds although "
                                    f"{closed_port_worker} does not answer")
    # 20 s on an idle machine; on a busy one the start is as much slower as the load says,
    # but still well short of the 60 s sync timeout it must not wait out.
    took = time.monotonic() - started
    assert took < min(stretched(20), 50), f"leading after {took:.1f}s ({machine_load()})"
    stopping = time.monotonic()
    dispatcher.stop()
    took = time.monotonic() - stopping
    assert dispatcher.proc.returncode == 0 and took < stretched(5), (
        f"expected a clean exit within 5 s of SIGTERM; exit code {dispatcher.proc.returncode} "
        f"after {took:.1f}s ({machine_load()})")


@pytest.mark.parametrize("module, command", [("dispatcher", "status"), ("dispatcher", "run"),
                                             ("training_operator", "run")])
@pytest.mark.parametrize("content, words", [
    (None, "cannot read it: No such file or directory"),
    ("", "not a kubeconfig (it lists no clusters or contexts)"),
    ("just some text\n", "the top level must be a mapping"),
    ("clusters: [\n", "not valid YAML at line 2, column 1"),
], ids=["missing", "empty", "text", "broken-yaml"])
def test_a_bad_kubeconfig_file_is_named_with_what_is_wrong(tmp_path, module, command,
                                                           content, words):
    path = tmp_path / "manager.kubeconfig"
    if content is not None:
        path.write_text(content)
    done = subprocess.run([sys.executable, "-m", module, command, "--kubeconfig", str(path),
                           "--metrics-port", "0"][:None if command == "run" else -2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.strip() == f"error: --kubeconfig {path}: {words}", done.stderr


@pytest.mark.parametrize("module, command, cluster, words", [
    # A worker serves TrainJobs but no MultiKueue CRDs; the manager serves no JobSets.
    ("dispatcher", "status", "worker-1",
     "the manager cluster does not serve multikueueclusters.kueue.x-k8s.io/v1beta2, "
     "multikueueconfigs.kueue.x-k8s.io/v1beta2; install the CRDs with: "
     "kubectl apply -k manifests/multikueue-crds"),
    ("dispatcher", "run", "worker-1",
     "the manager cluster does not serve multikueueclusters.kueue.x-k8s.io/v1beta2, "
     "multikueueconfigs.kueue.x-k8s.io/v1beta2; install the CRDs with: "
     "kubectl apply -k manifests/multikueue-crds"),
    ("training_operator", "run", "manager",
     "the worker cluster does not serve jobsets.jobset.x-k8s.io/v1alpha2; install the CRDs "
     "with: kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"),
], ids=["dispatcher-status", "dispatcher-run", "operator-run"])
def test_missing_crds_are_named_with_how_to_install_them(multicluster, module, command,
                                                         cluster, words):
    argv = [sys.executable, "-m", module, command,
            "--kubeconfig", str(multicluster[cluster].kubeconfig)]
    if command == "run":
        argv += ["--metrics-port", "0"] + (["--no-leader-elect"] if module == "dispatcher" else [])
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert words in done.stderr, done.stderr
    assert "404" not in done.stderr and "HTTP response headers" not in done.stderr, done.stderr
    # A start on a busy machine is slower, but must end well before the 60 s sync timeout.
    took = time.monotonic() - started
    assert took < min(stretched(30), 50), (
        f"it must not wait for a cache that never syncs; it took {took:.1f}s ({machine_load()})")


@pytest.mark.parametrize("module, command, cluster", [
    ("dispatcher", "status", "manager"), ("dispatcher", "run", "manager"),
    ("training_operator", "run", "worker")], ids=["dispatcher-status", "dispatcher-run",
                                                 "operator-run"])
def test_an_api_server_that_does_not_answer_is_named(multicluster, tmp_path, module, command,
                                                      cluster):
    """A kubeconfig whose server nothing listens on (as when the apiserver is down while
    the component starts): one line naming the server and why, exit code 1, no traceback;
    the Deployment's restarts try again."""
    config = yaml.safe_load(multicluster.manager.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    path = tmp_path / "down.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", module, command, "--kubeconfig", str(path)]
    if command == "run":
        argv += ["--metrics-port", "0"] + (["--no-leader-elect"] if module == "dispatcher" else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert (f"error: cannot reach the {cluster} cluster's API server at https://127.0.0.1:1: "
            in done.stderr), done.stderr
    assert "Connection refused" in done.stderr and "Traceback" not in done.stderr, done.stderr


def events_about(manager, name: str, reason: str) -> list[str]:
    return [e.message for e in manager.core.list_namespaced_event("default").items
            if e.involved_object.name == name and e.reason == reason]


def test_registration_mistakes_are_said_once_with_an_event(multicluster, tmp_path,
                                                           run_dispatcher):
    """A MultiKueueConfig naming a cluster that does not exist, a static worker whose
    kubeconfig is missing, and one named like a MultiKueueCluster."""
    manager = multicluster.manager
    tag = secrets.token_hex(3)
    clash, absent, config = f"clash-{tag}", f"absent-{tag}", f"mistakes-{tag}"
    profile = f"profile-{tag}"
    fixtures.register_worker(manager.api, clash, multicluster["worker-2"].kubeconfig)
    # Kueue's schema allows a ClusterProfile instead of a kubeconfig; this dispatcher
    # does not reach workers that way and must say so on the object.
    manager.custom.create_cluster_custom_object(*MK, "multikueueclusters", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
        "metadata": {"name": profile},
        "spec": {"clusterSource": {"clusterProfileRef": {"name": "gpu-pool"}}}})
    fixtures.register_config(manager.api, config, [clash, absent, profile])
    config_file = tmp_path / "dispatcher.yaml"
    config_file.write_text(yaml.safe_dump({"workers": [
        {"name": clash, "kubeconfig": str(multicluster["worker-1"].kubeconfig)},
        {"name": f"static-{tag}", "kubeconfig": str(tmp_path / "no-such.kubeconfig")}]}))
    try:
        dispatcher = run_dispatcher(manager, "--multikueue-config", config, "--config",
                                    str(config_file))
        eventually(lambda: events_about(manager, config, "ClusterNotFound"), bool,
                   expected=f"a ClusterNotFound Event on MultiKueueConfig {config}")
        eventually(lambda: events_about(manager, clash, "NameClash"), bool,
                   expected=f"a NameClash Event on MultiKueueCluster {clash}")
        # The MultiKueueCluster is the one used: it reaches worker-2, not worker-1.
        eventually(lambda: active_condition(manager, clash),
                   lambda cond: cond.get("status") == "True",
                   expected=f"{clash} Active=True through its MultiKueueCluster")
        cond = eventually(lambda: active_condition(manager, profile),
                          lambda cond: cond.get("status") == "False",
                          expected=f"{profile} Active=False, its ClusterProfile unsupported")
        assert cond["reason"] == "UnsupportedClusterSource", cond
        assert cond["message"].startswith("spec.clusterSource.clusterProfileRef gpu-pool: "
                                          "ClusterProfile references are not supported"), cond
        log = dispatcher.log_file.read_text(errors="replace")
        assert log.count(f"lists {absent}, but no MultiKueueCluster has that name") == 1, log
        assert log.count(f"workers[0] is named {clash}") == 1, log
        assert f"worker static-{tag} cannot be used: BadKubeConfig: cannot read " \
               f"{tmp_path / 'no-such.kubeconfig'}" in log, log
        shown = subprocess.run([sys.executable, "-m", "dispatcher", "status", "--kubeconfig",
                                str(manager.kubeconfig)], capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0, shown.stderr
        row = next((line.split() for line in shown.stdout.splitlines()
                    if line.startswith(absent)), None)
        assert row == [absent, "Missing", "NotFound", "-"], shown.stdout
    finally:
        manager.custom.delete_cluster_custom_object(*MK, "multikueueconfigs", config)
        manager.custom.delete_cluster_custom_object(*MK, "multikueueclusters", clash)
        manager.custom.delete_cluster_custom_object(*MK, "multikueueclusters", profile)
        client.CoreV1Api(manager.api).delete_namespaced_secret(f"{clash}-kubeconfig",
                                                               "kueue-system")
