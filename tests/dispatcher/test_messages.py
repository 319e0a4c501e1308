"""What the dispatcher says when things go wrong, read from its log as a user reads it: a
worker that keeps failing, a bad --kubeconfig, a manager without the CRDs it needs."""

from __future__ import annotations

import secrets
import time

import pytest
import yaml
from kubernetes import client

from clusters import fixtures
from clusters.testing import eventually, holds_for

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
              seconds=30, expected=f"one line per informer of {closed_port_worker} while it "
                                   f"keeps failing (log: {dispatcher.log_file})")
    assert time.monotonic() - started < 60, "the window must end before the first summary"
    log = dispatcher.log_file.read_text(errors="replace")
    assert "Retrying (Retry(" not in log, log
    assert "HTTP response headers" not in log, log
    assert all(len(line) < 1000 for line in log.splitlines()), log


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
    import subprocess
    import sys

    path = tmp_path / "manager.kubeconfig"
    if content is not None:
        path.write_text(content)
    done = subprocess.run([sys.executable, "-m", module, command, "--kubeconfig", str(path),
                           "--metrics-port", "0"][:None if command == "run" else -2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.strip() == f"error: --kubeconfig {path}: {words}", done.stderr
