"""The deployment artefacts: every kustomize base under manifests/ applied with
``kubectl apply --dry-run=server -k`` against the real apiservers, the rendered objects
checked against each other and the code, and the docker-compose stack and images checked
as far as a machine without a Docker engine can: the file parses, everything it refers to
exists, its commands parse with the project's own CLIs, host ports do not clash."""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from clusters import kustomize
from clusters.crds import manifests_dir
from trainjob import constants as c

ROOT = Path(__file__).resolve().parents[2]
# Where each base belongs. operator-cert-manager needs cert-manager's CRDs, which the
# harness does not install: it is rendered and checked, not dry-run.
MANAGER_BASES = ("crds", "multikueue-crds", "dispatcher", "manager", "samples")
WORKER_BASES = ("crds", "operator", "worker-access", "worker")
RENDER_ONLY = ("operator-cert-manager",)


def test_every_base_is_covered():
    bases = {p.parent.name for p in manifests_dir().glob("*/kustomization.yaml")}
    assert bases == set(MANAGER_BASES) | set(WORKER_BASES) | set(RENDER_ONLY)


def overlay(directory: Path, bases: list[str], **settings) -> Path:
    """A kustomization in ``directory`` over ``bases`` (kustomize wants relative paths)."""
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(kustomize.base_path(b), directory) for b in bases],
        **settings}))
    return directory


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}; found {[o['metadata']['name'] for o in found]}"
    return found[0]


@pytest.mark.parametrize("cluster,base", [("manager", b) for b in MANAGER_BASES]
                         + [("worker-1", b) for b in WORKER_BASES])
def test_server_side_dry_run(multicluster, cluster, base):
    target = multicluster[cluster]
    objects = kustomize.render(base)
    # A dry run persists nothing, so objects in a Namespace the same base creates would be
    # refused; the (empty) Namespaces are created for real first.
    for namespace in by_kind(objects, "Namespace"):
        try:
            target.core.create_namespace(namespace)
        except ApiException as err:
            assert err.status == 409, err.body
    out = kustomize.kubectl(target.kubeconfig, "apply", "--dry-run=server", "-k",
                            str(kustomize.base_path(base)))
    assert out.returncode == 0, f"dry run of manifests/{base} on {cluster}:\n{out.stderr}"
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == len(objects), out.stdout
    assert all(line.endswith("(server dry run)") for line in lines), out.stdout
    for obj in objects:
        name = obj["metadata"]["name"]
        assert any(f"/{name} " in line for line in lines), f"{obj['kind']} {name} not applied"


def test_dry_run_reports_a_broken_manifest(multicluster, tmp_path):
    # The check above can fail: an invalid Deployment in an overlay is refused by name.
    broken = overlay(tmp_path / "broken", ["dispatcher"], patches=[{
        "target": {"kind": "Deployment"},
        "patch": "- op: replace\n  path: /spec/replicas\n  value: -1\n"}])
    out = kustomize.kubectl(multicluster.manager.kubeconfig, "apply", "--dry-run=server",
                            "-k", str(broken))
    assert out.returncode != 0
    assert "trainjob-dispatcher" in out.stderr and "spec.replicas" in out.stderr, out.stderr


def test_images_are_overridable_with_kustomize(tmp_path):
    custom = overlay(tmp_path / "overlay", ["manager", "operator"], images=[
        {"name": "trainjob-dispatcher", "newName": "registry.example/dispatcher",
         "newTag": "1.2.3"},
        {"name": "training-operator", "newName": "registry.example/operator", "newTag": "1.2.3"}])
    out = kustomize.kubectl(None, "kustomize", str(custom))
    assert out.returncode == 0, out.stderr
    images = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
              for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"}
    assert images == {"trainjob-dispatcher": "registry.example/dispatcher:1.2.3",
                      "training-operator": "registry.example/operator:1.2.3"}


def _deployment_args(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _bound_accounts(objects: list[dict]) -> set[tuple[str, str]]:
    return {(s["namespace"], s["name"]) for o in objects if o["kind"].endswith("Binding")
            for s in o["subjects"] if s["kind"] == "ServiceAccount"}


def test_dispatcher_deployment_matches_its_identity_and_flags():
    objects = kustomize.render("dispatcher")
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    account = one(objects, "ServiceAccount")["metadata"]
    assert pod["serviceAccountName"] == account["name"]
    assert _bound_accounts(objects) == {(account["namespace"], account["name"])}
    assert deployment["spec"]["replicas"] == 2 and "--leader-elect" in _deployment_args(deployment)
    assert pod["containers"][0]["image"] == "trainjob-dispatcher:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The flags parse with the dispatcher's own CLI.
    from dispatcher.cli import build_parser

    args = build_parser().parse_args(_deployment_args(deployment))
    assert args.leader_elect is True and args.metrics_port == 8081
    # The Lease the Role lets it renew is the one the dispatcher takes with the default origin.
    role = one(objects, "Role")
    named = [r for r in role["rules"] if "leases" in r["resources"] and r.get("resourceNames")]
    assert named and named[0]["resourceNames"] == [f"trainjob-dispatcher-{c.DEFAULT_ORIGIN}"]


def test_operator_webhook_service_and_deployment_fit_together():
    objects = kustomize.render("operator")
    deployment = one(objects, "Deployment")
    service = one(objects, "Service")
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    pod = deployment["spec"]["template"]
    assert webhook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    assert webhook["clientConfig"]["service"]["namespace"] == service["metadata"]["namespace"]
    assert webhook["clientConfig"]["service"]["port"] == service["spec"]["ports"][0]["port"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    from training_operator.cli import build_parser

    args = build_parser().parse_args(_deployment_args(deployment))
    assert args.webhook_port == ports["webhook"] and args.metrics_port == ports["metrics"]
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert args.webhook_cert_dir == mounts["webhook-certs"]
    secret = next(v for v in pod["spec"]["volumes"] if v["name"] == "webhook-certs")
    certificate = one(kustomize.render("operator-cert-manager"), "Certificate")
    assert certificate["spec"]["secretName"] == secret["secret"]["secretName"]
    annotation = one(objects, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotation["cert-manager.io/inject-ca-from"] == (
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}")
    assert pod["spec"]["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_compose_init_uses_the_shipped_identities():
    init = _compose_init()
    expected = {
        "dispatcher": init.DISPATCHER, "worker-access": init.WORKER_ACCESS,
        "operator": init.OPERATOR}
    for base, account in expected.items():
        assert _bound_accounts(kustomize.render(base)) == {account}, base


# --- docker-compose and images --------------------------------------------------------


def _compose() -> dict:
    """docker-compose.yml as compose reads it with no variable set (each ``${VAR:-default}``
    becomes its default)."""
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", (ROOT / "docker-compose.yml").read_text())
    return yaml.safe_load(text)


def _compose_init():
    spec = importlib.util.spec_from_file_location("compose_init", ROOT / "deploy" / "compose_init.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dockerfile_stages(path: Path) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if match := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = [line]
            stages[match.group(2) or match.group(1)] = current
        else:
            current.append(line)
    return stages


def _stage_setting(stages: dict[str, list[str]], stage: str, keyword: str) -> str | None:
    """The last ``keyword`` in ``stage`` or the stages it is built FROM."""
    lines = stages[stage]
    for line in reversed(lines[1:]):
        if line.upper().startswith(keyword + " "):
            return line.split(None, 1)[1]
    parent = lines[0].split()[1]
    return _stage_setting(stages, parent, keyword) if parent in stages else None


def test_images_are_slim_non_root_and_run_the_console_scripts():
    dockerfile = ROOT / "images" / "Dockerfile"
    stages = _dockerfile_stages(dockerfile)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for stage, script in (("dispatcher", "trainjob-dispatcher"),
                          ("training-operator", "training-operator")):
        assert _stage_setting(stages, stage, "USER") == "65532:65532", stage
        assert f'["{script}"]' == _stage_setting(stages, stage, "ENTRYPOINT"), stage
        assert script in scripts
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    assert base and base.group(1) == "python:3.11-slim-bookworm", "the default Python base"
    assert all(s[0].split()[1] == "${PYTHON_IMAGE}" for s in stages.values()
               if s[0].split()[1] not in stages)
    for line in stages["build"]:
        if line.startswith("COPY") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such path"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_compose_references_exist_and_commands_parse():
    compose = _compose()
    services = compose["services"]
    stages = _dockerfile_stages(ROOT / "images" / "Dockerfile")
    init = _compose_init()
    from dispatcher.cli import build_parser as dispatcher_parser
    from training_operator.cli import build_parser as operator_parser

    parsers = {"dispatcher": dispatcher_parser(), "training-operator": operator_parser()}
    for name, service in services.items():
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, f"{name}: depends_on {dependency}: no such service"
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: volume {volume}: no such path"
            else:
                assert source in compose.get("volumes", {}), f"{name}: volume {source} undeclared"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"]).is_dir()
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
            assert build["target"] in stages, f"{name}: no stage {build['target']}"
            command = service.get("command") or []
            if service.get("entrypoint"):
                # The project image running the one-shot set-up script from ./deploy.
                assert service["entrypoint"] == ["python", "/deploy/compose_init.py"]
                assert any(v.startswith("./deploy:/deploy") for v in service["volumes"])
                init.build_parser().parse_args(command)
            else:
                parsers[build["target"]].parse_args(command)
        else:
            assert service["image"].startswith("registry.k8s.io/"), name


def test_compose_host_ports_are_loopback_and_distinct():
    published = []
    for name, service in _compose()["services"].items():
        for port in service.get("ports") or []:
            address, host_port, _ = str(port).split(":")
            assert address == "127.0.0.1", f"{name}: {port} is published beyond loopback"
            published.append(int(host_port))
    assert published and len(published) == len(set(published)), published


def test_compose_control_planes_use_the_files_init_writes(tmp_path):
    compose = _compose()
    services = compose["services"]
    certs = services["certs"]["command"]
    clusters = dict(item.split("=") for item in certs[certs.index("--clusters") + 1].split(","))
    init = _compose_init()
    init.write_certs(tmp_path, {name: int(port) for name, port in clusters.items()})
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    for name, service in services.items():
        for word in [*(service.get("command") or [])]:
            for path in re.findall(r"/pki/(\S+)", word):
                assert path in written, f"{name}: {word}: compose init writes no {path}"
    # Each cluster's apiserver publishes the host port its host kubeconfig points at.
    for cluster, port in clusters.items():
        ports = services[f"apiserver-{cluster}"]["ports"]
        assert f"127.0.0.1:{port}:{init.APISERVER_PORT}" in ports
        host = yaml.safe_load((tmp_path / cluster / "admin-host.kubeconfig").read_text())
        assert host["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{port}"
    # The worker kubeconfigs the manager's Secrets get address the apiserver containers.
    access = yaml.safe_load((tmp_path / "worker-1" / "dispatcher-access.kubeconfig").read_text())
    assert access["clusters"][0]["cluster"]["server"] == "https://apiserver-worker-1:6443"
    assert "apiserver-worker-1" in services
    from dispatcher.kubeconfig_policy import check_kubeconfig

    assert check_kubeconfig(yaml.safe_dump(access)).ok
