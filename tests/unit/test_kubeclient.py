"""The per-cluster client rate limit, error descriptions, apply bodies, and which
kubeconfig the commands use (as kubectl finds it), each resolution step with temporary
kubeconfig files."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusters.machine_load import machine_load, stretched
from controller_kit.kubeclient import (
    FROM_ENVIRONMENT,
    FROM_FLAG,
    FROM_HOME,
    IN_CLUSTER,
    KubeconfigError,
    ThrottledTokenHook,
    TokenBucket,
    api_client,
    find_kubeconfig,
)


def test_token_bucket_spends_the_burst_then_paces():
    bucket = TokenBucket(qps=100, burst=5)
    waits = [bucket.acquire() for _ in range(5)]
    assert waits == [0.0] * 5  # the burst is free
    started = time.monotonic()
    for _ in range(5):
        bucket.acquire()
    elapsed = time.monotonic() - started
    # At most 0.5 s on an idle machine; each paced wait wakes as late as a loaded one says.
    assert 0.03 <= elapsed < stretched(0.5), (
        f"5 tokens past the burst at 100/s took {elapsed:.3f}s ({machine_load()})")


def test_the_token_hook_runs_at_most_once_a_second_and_stays_installed():
    """The client library's hook runs before every request and installs a new copy of
    itself each time it runs: the throttle runs the newest one, and only once per
    interval."""
    from kubernetes import client

    now = [100.0]
    calls = []

    def library_hook(name):
        def hook(configuration):
            calls.append(name)
            configuration.api_key["BearerToken"] = f"token-{len(calls)}"
            configuration.refresh_api_key_hook = library_hook(f"hook-{len(calls)}")
        return hook

    configuration = client.Configuration()
    configuration.refresh_api_key_hook = ThrottledTokenHook(library_hook("hook-0"),
                                                            interval=1.0, clock=lambda: now[0])
    throttle = configuration.refresh_api_key_hook
    for _ in range(5):
        assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    assert calls == ["hook-0"]
    assert configuration.refresh_api_key_hook is throttle
    now[0] += 1.0
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-2"
    assert calls == ["hook-0", "hook-1"]  # the copy the first run installed
    assert configuration.refresh_api_key_hook is throttle


def test_a_token_kubeconfig_still_sends_its_token():
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "abc"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    configuration = api_client(kubeconfig).configuration
    assert isinstance(configuration.refresh_api_key_hook, ThrottledTokenHook)
    for _ in range(3):
        assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc"
    assert configuration.host == "https://127.0.0.1:6443"


def test_an_api_error_is_one_line_with_code_reason_and_message():
    from kubernetes.client.exceptions import ApiException

    from controller_kit.kubeclient import describe_error

    err = ApiException(status=422, reason="Unprocessable Entity")
    err.body = ('{"kind":"Status","status":"Failure","reason":"Invalid","code":422,'
                '"message":"TrainJob.trainer.kubeflow.org \\"x\\" is invalid:\\n spec.a: bad"}')
    err.headers = {"Audit-Id": "1234"}
    assert describe_error(err) == \
        'HTTP 422 Invalid: TrainJob.trainer.kubeflow.org "x" is invalid: spec.a: bad'
    assert describe_error(ApiException(status=503, reason="Service Unavailable")) == \
        "HTTP 503 Service Unavailable"
    assert describe_error(ValueError("two\nlines")) == "ValueError: two lines"


def test_apply_bodies_write_characters_beyond_the_bmp_as_themselves():
    import json

    from controller_kit.kubeclient import apply_body

    body = {"data": {"init.sh": 'echo "\U0001f438 ready"'}}
    encoded = apply_body(body)
    # The apiserver's YAML decoder refuses the surrogate escapes json.dumps writes by default.
    assert b"\\ud83d" not in encoded and "\U0001f438".encode() in encoded
    assert json.loads(encoded) == body


# --- which kubeconfig: as kubectl finds it ----------------------------------------------


def write_kubeconfig(path: Path, servers: dict[str, str], current: str | None = None,
                     **extra) -> Path:
    """A kubeconfig with one context, cluster and user per entry of ``servers``
    (context name -> server URL); ``extra`` goes into each cluster entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **extra}}
                     for name, server in servers.items()],
        "users": [{"name": name, "user": {"token": f"token-{name}"}} for name in servers],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}
                     for name in servers],
    }
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def host(source, context=None) -> str:
    return api_client(source, context).configuration.host


@pytest.fixture
def places(tmp_path):
    """A home directory with ~/.kube/config, and a service account directory, neither used
    unless a test says so."""
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", {"home": "https://home.example:6443"}, "home")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("a-service-account-token")
    (account / "ca.crt").write_text("not checked until a request is made")
    return home, account


def test_the_flag_goes_before_kubeconfig_and_home(tmp_path, places):
    home, account = places
    flag = write_kubeconfig(tmp_path / "flag", {"flag": "https://flag.example:6443"}, "flag")
    env = write_kubeconfig(tmp_path / "env", {"env": "https://env.example:6443"}, "env")
    source = find_kubeconfig(str(flag), {"KUBECONFIG": str(env)}, home, account)
    assert (source.found_by, source.files) == (FROM_FLAG, (flag,))
    assert host(source) == "https://flag.example:6443"


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(tmp_path, places):
    """The first file to name a context, cluster or user, or to set current-context, wins;
    missing files are skipped; certificate files are read relative to their kubeconfig."""
    home, account = places
    first = write_kubeconfig(tmp_path / "a" / "first", {"a": "https://a.example:6443",
                                                       "shared": "https://first.example:6443"},
                             "shared", **{"certificate-authority": "ca.crt"})
    (tmp_path / "a" / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    second = write_kubeconfig(tmp_path / "b" / "second", {"b": "https://b.example:6443",
                                                         "shared": "https://second.example:6443"},
                              "b")
    listed = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
    source = find_kubeconfig(None, {"KUBECONFIG": listed}, home, account)
    assert (source.found_by, source.files) == (FROM_ENVIRONMENT, (first, second))
    api = api_client(source)
    assert api.configuration.host == "https://first.example:6443"  # first file's context
    assert api.configuration.ssl_ca_cert == str(tmp_path / "a" / "ca.crt")
    assert host(source, "b") == "https://b.example:6443"  # only in the second file
    assert host(source, "a") == "https://a.example:6443"


def test_home_when_kubeconfig_is_unset_or_empty(tmp_path, places):
    home, account = places
    for environ in ({}, {"KUBECONFIG": ""}):
        source = find_kubeconfig(None, environ, home, account)
        assert (source.found_by, source.files) == (FROM_HOME, (home / ".kube" / "config",))
        assert host(source) == "https://home.example:6443"
    # With no home argument, $HOME says where home is.
    assert find_kubeconfig(None, {"HOME": str(home)}, None, account).found_by == FROM_HOME


def test_in_cluster_last_and_only_in_a_pod(tmp_path, places):
    _, account = places
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    source = find_kubeconfig(None, pod, tmp_path / "nobody", account)
    assert (source.found_by, source.files) == (IN_CLUSTER, ())
    api = api_client(source)
    assert api.configuration.host == "https://10.96.0.1:443"
    assert api.configuration.auth_settings()["BearerToken"]["value"] == \
        "bearer a-service-account-token"
    with pytest.raises(KubeconfigError, match="--context other: there is no kubeconfig"):
        api_client(source, "other")


def test_a_set_kubeconfig_replaces_home_as_with_kubectl(tmp_path, places):
    """$KUBECONFIG naming only missing files does not fall back to ~/.kube/config (kubectl
    does not either); in a Pod the service account is used, elsewhere it is an error."""
    home, account = places
    missing = str(tmp_path / "gone")
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert find_kubeconfig(None, {"KUBECONFIG": missing, **pod}, home,
                           account).found_by == IN_CLUSTER
    with pytest.raises(KubeconfigError) as err:
        find_kubeconfig(None, {"KUBECONFIG": missing}, home, account)
    assert str(err.value) == (
        f"no Kubernetes configuration found: $KUBECONFIG lists {missing}, and it does not "
        "exist (with $KUBECONFIG set, ~/.kube/config is not read, as with kubectl); and this "
        "is not a Pod with a service account (KUBERNETES_SERVICE_HOST and "
        "KUBERNETES_SERVICE_PORT are not set). Give --kubeconfig FILE")


def test_nothing_found_names_everything_looked_for(tmp_path):
    account = tmp_path / "no-account"
    with pytest.raises(KubeconfigError) as err:
        find_kubeconfig(None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                               "KUBERNETES_SERVICE_PORT": "443"}, tmp_path, account)
    assert str(err.value) == (
        "no Kubernetes configuration found: no --kubeconfig, $KUBECONFIG is not set and "
        f"{tmp_path / '.kube' / 'config'} does not exist; and this is not a Pod with a "
        f"service account ({account / 'token'} does not exist). Give --kubeconfig FILE")


def test_context_mistakes_name_the_file_and_the_contexts(tmp_path, places):
    home, account = places
    path = write_kubeconfig(tmp_path / "two", {"a": "https://a.example", "b": "https://b.example"})
    source = find_kubeconfig(str(path), {}, home, account)
    assert host(source, "b") == "https://b.example"
    with pytest.raises(KubeconfigError) as err:
        api_client(source, "c")
    assert str(err.value) == f"--kubeconfig {path}: it has no context 'c' (--context); its " \
                             "contexts: a, b"
    with pytest.raises(KubeconfigError) as err:
        api_client(source)
    assert str(err.value) == f"--kubeconfig {path}: it sets no current-context; choose one " \
                             "of its contexts with --context: a, b"
    listed = find_kubeconfig(None, {"KUBECONFIG": os.pathsep.join([str(path), str(path)])},
                             home, account)
    assert listed.files == (path,)  # listed twice, read once
    broken = tmp_path / "broken"
    broken.write_text("clusters: [\n")
    both = find_kubeconfig(None, {"KUBECONFIG": os.pathsep.join([str(path), str(broken)])},
                           home, account)
    with pytest.raises(KubeconfigError) as err:
        api_client(both, "a")
    assert str(err.value) == f"$KUBECONFIG file {broken}: not valid YAML at line 2, column 1"


def _command(module: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("module, argv", [
    ("dispatcher", ["run", "--metrics-port", "0", "--no-leader-elect"]),
    ("dispatcher", ["status"]),
    ("training_operator", ["run", "--metrics-port", "0"]),
])
def test_the_commands_find_their_kubeconfig_and_say_when_there_is_none(tmp_path, module,
                                                                       argv):
    base = {k: v for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    done = _command(module, *argv, env={**base, "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(
        "error: no Kubernetes configuration found: no --kubeconfig, $KUBECONFIG is not set "
        f"and {tmp_path / '.kube' / 'config'} does not exist"), done.stderr
    # A context that $KUBECONFIG's file lacks is named with the file it was looked for in.
    path = write_kubeconfig(tmp_path / "env", {"a": "https://127.0.0.1:1"}, "a")
    done = _command(module, *argv, "--context", "nope",
                    env={**base, "HOME": str(tmp_path), "KUBECONFIG": str(path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"error: $KUBECONFIG file {path}: it has no context "
                                   "'nope' (--context); its contexts: a"), done.stderr


@pytest.mark.parametrize("module, prog", [("dispatcher", "python -m dispatcher"),
                                          ("training_operator", "training-operator")])
def test_version_is_the_package_version(module, prog):
    from importlib.metadata import version

    done = _command(module, "--version", env=dict(os.environ))
    assert (done.returncode, done.stdout.strip()) == (
        0, f"{prog} {version('trainjob-dispatcher')}"), done.stderr
