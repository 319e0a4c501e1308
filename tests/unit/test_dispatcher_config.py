"""Dispatcher configuration and the worker-kubeconfig rules (pure)."""

import pytest
import yaml

from dispatcher.config import ConfigError, load_config
from dispatcher.workers.kubeconfig_policy import (
    BAD_KUBECONFIG,
    INSECURE_KUBECONFIG,
    check_kubeconfig,
)
from trainjob import constants as c


def test_defaults_follow_multikueue():
    config = load_config()
    assert config.namespace == "kueue-system"
    assert config.origin == c.DEFAULT_ORIGIN == "trainjob-dispatcher"
    assert config.gc_interval_seconds == 60
    assert config.worker_lost_timeout_seconds == 900
    # The interpreter's frozen objects are swept every 6 hours (controller_kit/gc_pauses.py).
    assert config.python_gc_sweep_seconds == 6 * 3600
    assert config.client.qps >= 100
    # The manager's apiserver has its own priority and fairness: no client-side limit.
    assert (config.manager_client.qps, config.manager_client.burst) == (None, None)


def test_the_default_origin_is_not_kueues_but_kueue_mode_defaults_to_kueues():
    """Standalone beside Kueue, Kueue's own origin is refused (kueue_presence.origin_conflict):
    a default equal to Kueue's default would make the shipped dispatcher refuse to start on
    every manager that runs Kueue. In kueue mode the origin must be Kueue's."""
    assert load_config().origin != c.KUEUE_DEFAULT_ORIGIN == "multikueue"
    kueue_mode = {"mode": "kueue", "namespace": "trainjob-system"}
    assert load_config(None, kueue_mode).origin == c.KUEUE_DEFAULT_ORIGIN
    assert load_config(None, {**kueue_mode, "origin": "team-a"}).origin == "team-a"
    assert load_config(None, {"origin": "team-a"}).origin == "team-a"


def test_worker_secrets_are_read_in_the_dispatchers_own_namespace_in_both_modes():
    for mode in ("standalone", "kueue"):
        config = load_config(None, {"namespace": "trainjob-system", "mode": mode})
        assert (config.worker_secrets_namespace, config.kueue_namespace) == (
            "trainjob-system", c.KUEUE_NAMESPACE), mode


def test_kueue_mode_refuses_kueues_namespace_as_its_own():
    """Secrets of the names MultiKueueClusters give, in Kueue's namespace, are Kueue's
    (Kueue's write identity on each worker): kueue mode never reads them, so its own
    namespace must be another, the default included."""
    flags = {"mode": "--mode", "namespace": "--namespace", "kueue_namespace": "--kueue-namespace"}
    for given in ({"mode": "kueue"},
                  {"mode": "kueue", "namespace": "kueue", "kueue_namespace": "kueue"}):
        with pytest.raises(ConfigError) as err:
            load_config(None, given, flags)
        same = given.get("namespace", c.KUEUE_NAMESPACE)
        assert "--mode kueue needs" in str(err.value) and f"(both {same})" in str(err.value) \
            and "Kueue's own Secrets" in str(err.value), str(err.value)
    assert "--namespace to differ from --kueue-namespace" in str(err.value), str(err.value)


@pytest.mark.parametrize("settings, address", [
    ({}, None),  # metrics on loopback: the dashboard is served beside them
    ({"metrics_host": "::1"}, None),
    ({"metrics_host": "localhost"}, None),
    ({"metrics_host": "0.0.0.0"}, ("127.0.0.1", 8082)),
    ({"metrics_host": "10.1.2.3"}, ("127.0.0.1", 8082)),
    ({"metrics_host": "dispatcher.example.com"}, ("127.0.0.1", 8082)),
    ({"metrics_host": "0.0.0.0", "dashboard_port": 0}, ("127.0.0.1", 0)),
    ({"dashboard_port": 9000}, ("127.0.0.1", 9000)),
    ({"dashboard_host": "0.0.0.0"}, ("0.0.0.0", 8082)),  # asked for, explicitly
])
def test_the_dashboard_follows_metrics_only_onto_loopback(settings, address):
    """The dashboard and /api/state show every job without authentication: metrics and
    health on every interface (in a Pod) do not take them along."""
    assert load_config(None, settings).dashboard_address() == address


def test_manager_client_limit_from_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"manager-client": {"qps": 50, "burst": 100}}))
    config = load_config(path)
    assert (config.manager_client.qps, config.manager_client.burst) == (50, 100)


def test_file_then_flags(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"origin": "team-a", "client": {"qps": 50},
                                    "gc-interval-seconds": 5}))
    config = load_config(path, {"origin": "team-b", "multikueue_config": None})
    assert (config.origin, config.client.qps, config.gc_interval_seconds) == ("team-b", 50, 5)


def test_the_python_gc_sweep_interval_from_the_flag_over_the_file(tmp_path):
    from dispatcher.cli import build_parser, config_from_args

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"python_gc_sweep_seconds": 600}))
    args = build_parser().parse_args(["run", "--config", str(path)])
    assert config_from_args(args).python_gc_sweep_seconds == 600
    args = build_parser().parse_args(["run", "--config", str(path),
                                      "--python-gc-sweep-interval", "0"])
    assert config_from_args(args).python_gc_sweep_seconds == 0


@pytest.mark.parametrize("content, key", [
    ({"client": {"qps": 0}}, "client.qps"),
    ({"manager_client": {"qps": -1}}, "manager_client.qps"),
    ({"manager_client": {"burst": 0}}, "manager_client.burst"),
    ({"origin": "not a label!"}, "origin"),
    ({"gc_interval_seconds": -1}, "gc_interval_seconds"),
    ({"python_gc_sweep_seconds": -1}, "python_gc_sweep_seconds"),
    ({"unknown_key": 1}, "unknown_key"),
    ({"workers": [{"name": "w"}]}, "workers.0.kubeconfig"),
])
def test_invalid_configuration_names_the_key(tmp_path, content, key):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(path)


def test_unreadable_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError,
                       match="config file .*missing.yaml: cannot read it: No such file"):
        load_config(tmp_path / "missing.yaml")


def kubeconfig(cluster=None, user=None):
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "u"}}],
        "clusters": [{"name": "w", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority-data": "Q0E=",
                                               **(cluster or {})}}],
        "users": [{"name": "u", "user": {"client-certificate-data": "Qw==",
                                         "client-key-data": "Sw==", **(user or {})}}],
    })


def test_embedded_certificates_are_accepted():
    assert check_kubeconfig(kubeconfig()).ok


@pytest.mark.parametrize("cluster, user, reason, words", [
    ({"insecure-skip-tls-verify": True}, None, INSECURE_KUBECONFIG, "insecure-skip-tls-verify"),
    ({"certificate-authority": "/etc/ca.crt"}, None, INSECURE_KUBECONFIG, "certificate-authority"),
    (None, {"tokenFile": "/var/run/token"}, INSECURE_KUBECONFIG, "tokenFile"),
    (None, {"client-key": "/k"}, INSECURE_KUBECONFIG, "client-key"),
    (None, {"username": "a", "password": "b"}, INSECURE_KUBECONFIG, "basic authentication"),
    (None, {"exec": {"command": "aws"}}, INSECURE_KUBECONFIG, "exec"),
    (None, {"auth-provider": {"name": "gcp"}}, INSECURE_KUBECONFIG, "auth-provider"),
    ({"server": ""}, None, BAD_KUBECONFIG, "empty server"),
    ({"server": "https://bad_host!:6443"}, None, INSECURE_KUBECONFIG,
     "neither an IP address nor a DNS name"),
])
def test_kubeconfigs_multikueue_refuses(cluster, user, reason, words):
    verdict = check_kubeconfig(kubeconfig(cluster, user))
    assert not verdict.ok and verdict.reason == reason and words in verdict.message


def test_every_cluster_and_user_is_checked_not_only_the_current_ones():
    document = yaml.safe_load(kubeconfig())
    document["clusters"].append({"name": "spare", "cluster": {
        "server": "https://spare.example.com", "insecure-skip-tls-verify": True}})
    verdict = check_kubeconfig(yaml.safe_dump(document))
    assert not verdict.ok and "cluster 'spare'" in verdict.message, verdict
    document = yaml.safe_load(kubeconfig())
    document["users"].append({"name": "other", "user": {"tokenFile": "/var/run/token"}})
    verdict = check_kubeconfig(yaml.safe_dump(document))
    assert not verdict.ok and "user 'other' reads tokenFile" in verdict.message, verdict
    assert check_kubeconfig(kubeconfig({"server": "https://Worker-1.Example.com:6443"})).ok


@pytest.mark.parametrize("text", ["{", "- a list", "", "current-context: nope\ncontexts: []"])
def test_garbage_is_a_bad_kubeconfig(text):
    verdict = check_kubeconfig(text)
    assert not verdict.ok and verdict.reason == BAD_KUBECONFIG


def test_lease_timings_must_let_a_leader_stop_before_a_standby_starts(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"lease_duration_seconds": 5, "renew_deadline_seconds": 8}))
    with pytest.raises(ConfigError, match="renew_deadline_seconds must be less than"):
        load_config(path)


@pytest.mark.parametrize("flag, value, says", [
    ("--workers", "0", "argument --workers: must be at least 1, got 0"),
    ("--workers", "-1", "argument --workers: must be at least 1, got -1"),
    ("--gc-interval", "inf", "argument --gc-interval: must be a finite number of seconds"),
    ("--worker-lost-timeout", "nan", "argument --worker-lost-timeout: must be a finite"),
    ("--python-gc-sweep-interval", "-5",
     "argument --python-gc-sweep-interval: must be a finite number of seconds, 0 or more"),
])
def test_flags_out_of_range_are_refused_by_their_name(flag, value, says):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "dispatcher", "run", flag, value],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and says in result.stderr, result.stderr


def test_an_infinite_duration_in_the_file_is_refused_by_its_key(tmp_path):
    path = tmp_path / "dispatcher.yaml"
    path.write_text("gc_interval_seconds: .inf\n")
    with pytest.raises(ConfigError, match="gc_interval_seconds.*finite"):
        load_config(path, {})


def test_a_refused_flag_is_named_as_typed_and_a_file_key_as_written(tmp_path):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "dispatcher", "run", *args],
                              capture_output=True, text=True, timeout=60).stderr

    said = run("--lease-duration", "1", "--renew-deadline", "5")
    assert "--renew-deadline must be less than --lease-duration" in said, said
    assert "renew_deadline_seconds" not in said, said
    assert "error: --origin: must be a valid label value" in run("--origin", "bad value!")
    path = tmp_path / "dispatcher.yaml"
    path.write_text("origin: 'bad value!'\n")
    assert "error: config key 'origin': must be a valid label" in run("--config", str(path))
