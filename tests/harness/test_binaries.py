"""Where the harness binaries come from (lookup order and errors); the only build here is
one that must fail."""

import os

import pytest

from clusters import binaries


def _fake_binary(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def empty_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERS_CACHE_DIR", str(tmp_path / "cache"))
    for name in (*binaries.ENV_OVERRIDES.values(), "KUBEBUILDER_ASSETS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_explicit_paths_win(empty_environment, monkeypatch):
    paths = {}
    for binary, variable in binaries.ENV_OVERRIDES.items():
        paths[binary] = _fake_binary(empty_environment / "mine" / binary)
        monkeypatch.setenv(variable, str(paths[binary]))
    found = binaries.find_binaries(build=False, names=binaries.COMPONENTS)
    assert found.as_dict() == {k: str(v) for k, v in paths.items()}


def test_kubebuilder_assets_then_cache(empty_environment, monkeypatch):
    assets = empty_environment / "envtest"
    _fake_binary(assets / "etcd")
    _fake_binary(assets / "kube-apiserver")
    _fake_binary(assets / "kubectl")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    # setup-envtest has no kube-controller-manager: it comes from the cache.
    cached = _fake_binary(binaries.cached_path("kube-controller-manager"))
    found = binaries.find_binaries(
        build=False, names=("etcd", "kube-apiserver", "kubectl", "kube-controller-manager"))
    assert found.etcd == assets / "etcd"
    assert found.kube_apiserver == assets / "kube-apiserver"
    assert found.kubectl == assets / "kubectl"
    assert found.kube_controller_manager == cached
    assert str(cached).startswith(str(empty_environment / "cache"))
    assert binaries.KUBERNETES_VERSION in str(cached)


def test_a_broken_override_is_refused_by_name(empty_environment, monkeypatch):
    monkeypatch.setenv("TEST_ASSET_KUBE_APISERVER", str(empty_environment / "nope"))
    with pytest.raises(binaries.ProvisioningError,
                       match="TEST_ASSET_KUBE_APISERVER=.*nope: not an executable"):
        binaries.find_binaries(build=False)


def test_missing_binary_without_build_says_how_to_get_it(empty_environment):
    with pytest.raises(binaries.ProvisioningError) as err:
        binaries.find_binaries(build=False)
    message = str(err.value)
    assert "etcd not found" in message
    assert "TEST_ASSET_ETCD" in message and "python -m clusters provision" in message


def test_scratch_module_replaces_every_staging_module(tmp_path):
    staging = "v0" + binaries.KUBERNETES_VERSION[2:]
    binaries._scratch_module(
        tmp_path, "example.local/x", f"k8s.io/kubernetes {binaries.KUBERNETES_VERSION}",
        [f"k8s.io/{m} => k8s.io/{m} {staging}" for m in binaries.STAGING_MODULES],
        ["k8s.io/kubernetes/cmd/kube-apiserver"],
    )
    gomod = (tmp_path / "go.mod").read_text()
    for module in binaries.STAGING_MODULES:
        assert f"replace k8s.io/{module} => k8s.io/{module} {staging}\n" in gomod
    assert "godebug default=go1.24" in gomod
    assert '_ "k8s.io/kubernetes/cmd/kube-apiserver"' in (tmp_path / "tools.go").read_text()


def test_version_stamp_covers_both_version_packages():
    flags = binaries._version_ldflags("v1.34.4")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.34.4" in flags
        assert f"-X {pkg}.gitMinor=34" in flags


def test_upstream_binaries_are_not_taken_from_kubebuilder_assets(empty_environment,
                                                                 monkeypatch):
    assets = empty_environment / "envtest"
    _fake_binary(assets / "kwok")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    with pytest.raises(binaries.ProvisioningError, match="kwok not found: set TEST_ASSET_KWOK,"):
        binaries.find_binaries(build=False, names=("kwok",))


def test_a_failed_build_names_module_version_step_and_retry(empty_environment):
    missing = binaries.Component("kwok", "module", "v0.0.1-no-such-version", "TEST_ASSET_KWOK",
                                 module="sigs.k8s.io/kwok", package="sigs.k8s.io/kwok/cmd/kwok")
    lines = []
    with pytest.raises(binaries.ProvisioningError) as err:
        binaries.build_module(missing, progress=lines.append)
    message = str(err.value)
    assert "building kwok from sigs.k8s.io/kwok v0.0.1-no-such-version failed" in message
    assert "at step `go get`" in message
    assert "retry with: python -m clusters provision --only kwok" in message
    assert lines[0] == "building kwok (sigs.k8s.io/kwok v0.0.1-no-such-version)"
    assert not binaries.cached_path("kwok").exists()


def test_cached_binaries_report_the_pinned_versions():
    # The real binaries the rest of the suite runs on (make test provisions them first).
    found = binaries.find_binaries(build=False, names=binaries.PROVISIONED)
    for name in binaries.KUBE_COMMANDS[:-1]:
        assert binaries.KUBERNETES_VERSION in binaries.binary_version(found.paths[name])
    for name in binaries.PROVISIONED:
        component = binaries.COMPONENTS[name]
        if component.kind == "module" and not os.environ.get(component.env_var):
            assert binaries.binary_version(found.paths[name]) == component.source
    assert (binaries.binary_version(found.kubectl)
            == f"Client Version: {binaries.KUBERNETES_VERSION}")
    if not os.environ.get("TEST_ASSET_ETCD") and not os.environ.get("KUBEBUILDER_ASSETS"):
        assert binaries.ETCD_VERSION.lstrip("v") in binaries.binary_version(found.etcd)
