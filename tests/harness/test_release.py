"""``python -m clusters release``: one installable file per base each kind of cluster takes,
images set to the release's, nothing else changed, and a worker's files accepted by a real
apiserver as they are, in each mode."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from clusters import kustomize
from clusters.release import BASES, INSTALLS, Release, write_release

REGISTRY = "registry.example.com/ml"


def _objects(path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _images(objects: list[dict]) -> set[str]:
    return {container["image"] for o in objects if o["kind"] == "Deployment"
            for container in o["spec"]["template"]["spec"]["containers"]}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    written = write_release(Release("1.2.3", REGISTRY, ("eu-1-kubeconfig", "us-1-kubeconfig")),
                            out)
    return {path.stem: path for path in written}


def test_every_base_is_written_with_the_release_images(release):
    assert sorted(release) == sorted(BASES)
    for base, path in release.items():
        objects = _objects(path)
        assert path.read_text().startswith("# trainjob-dispatcher 1.2.3: ")
        # Nothing but the images and the Secret list differs from the shipped base.
        assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
            (o["kind"], o["metadata"]["name"]) for o in kustomize.render(base)], base
        images = _images(objects)
        assert all(image.startswith(f"{REGISTRY}/") and image.endswith(":1.2.3")
                   for image in images), (base, images)
    assert _images(_objects(release["manager"])) == {f"{REGISTRY}/trainjob-dispatcher:1.2.3"}
    for worker in ("worker", "worker-kueue", "operator-cert-manager"):
        assert _images(_objects(release[worker])) == {f"{REGISTRY}/training-operator:1.2.3"}


def test_every_installation_has_its_files(release):
    """Every base an installation of docs/deploy.md takes is written (worker-reader and
    worker-namespace too), and nothing no installation takes."""
    wanted = {base for bases in INSTALLS.values() for base in bases}
    assert wanted == set(release), (wanted ^ set(release))


def test_a_kueue_mode_worker_installs_no_write_identity(release):
    """worker-kueue.yaml: the dispatcher reads a Kueue-mode worker with worker-reader's
    ServiceAccount; worker-access's, which writes copies, and its policy are not there."""
    objects = _objects(release["worker-kueue"])
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"])
                for o in objects if o["kind"] == "ServiceAccount"}
    assert ("trainjob-system", "trainjob-dispatcher-reader") in accounts
    assert ("trainjob-system", "trainjob-dispatcher") not in accounts
    assert not [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")]


def test_crds_are_files_of_their_own(release):
    for base, path in release.items():
        kinds = {o["kind"] for o in _objects(path)}
        if base.endswith("crds"):
            assert kinds == {"CustomResourceDefinition"}, (base, kinds)
        else:
            assert "CustomResourceDefinition" not in kinds, base


def test_the_worker_secret_list_is_the_one_given(release):
    for base in ("manager", "manager-beside-kueue", "manager-kueue"):
        roles = [o for o in _objects(release[base])
                 if o["kind"] == "Role" and any("secrets" in r["resources"] for r in o["rules"])]
        assert [r["rules"][0]["resourceNames"] for r in roles] == [
            ["eu-1-kubeconfig", "us-1-kubeconfig"]], base


@pytest.mark.parametrize("install", [name for name in INSTALLS
                                     if name.startswith("worker") and "cert-manager" not in name])
def test_a_worker_installs_from_its_files(multicluster, release, install):
    """The files of a worker's installation, in their order, but the CRDs the session's
    clusters have already (cert-manager's installations need its CRDs, which the harness
    does not install)."""
    target = multicluster["worker-1"]
    files = [release[base] for base in INSTALLS[install] if base != "crds"]
    objects = [o for path in files for o in _objects(path)]
    # A dry run persists nothing, so the Namespaces it creates are made for real first.
    for namespace in (o for o in objects if o["kind"] == "Namespace"):
        try:
            target.core.create_namespace(namespace)
        except ApiException as err:
            assert err.status == 409, err.body
    # Earlier modules of the session may have applied the same objects under the harness's
    # field manager; a fresh worker has no other owner, so the dry run takes their fields.
    out = kustomize.kubectl(target.kubeconfig, "apply", "--server-side", "--dry-run=server",
                            "--force-conflicts",
                            *(arg for path in files for arg in ("-f", str(path))))
    assert out.returncode == 0, out.stderr
    assert len([line for line in out.stdout.splitlines() if line.strip()]) == len(objects)


@pytest.mark.parametrize("args,refusal", [
    (["--version", "1.0/x", "--registry", REGISTRY], "--version '1.0/x': not a valid image tag"),
    (["--version", "1.0", "--registry", "https://r.example.com"],
     "--registry 'https://r.example.com': not a registry"),
    (["--version", "1.0", "--registry", REGISTRY, "--worker-secret", "Bad_Name"],
     "--worker-secret Bad_Name: not a valid Secret name"),
])
def test_bad_input_is_refused_by_its_flag_and_nothing_is_written(tmp_path, args, refusal):
    out = subprocess.run([sys.executable, "-m", "clusters", "release", *args,
                          "--out", str(tmp_path / "dist")], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 1 and refusal in out.stderr, out.stderr
    assert not (tmp_path / "dist").exists()
