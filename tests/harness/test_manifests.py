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
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kustomize
from clusters.crds import manifests_dir
from clusters.release import INSTALLS
from clusters.testing import eventually
from trainjob import constants as c

ROOT = Path(__file__).resolve().parents[2]
# Where each base belongs. operator-cert-manager needs cert-manager's CRDs, which the
# harness does not install: it is rendered and checked, not dry-run. The components are
# parts of the manager overlays, checked there.
MANAGER_BASES = ("crds", "multikueue-crds", "dispatcher", "manager", "manager-beside-kueue",
                 "manager-kueue", "samples", "remote-api")
WORKER_BASES = ("crds", "worker-namespace", "operator", "worker-access", "worker-reader",
                "worker", "worker-kueue")
RENDER_ONLY = ("operator-cert-manager",)
COMPONENTS = ("worker-secrets", "kueue-config-access", "prometheus-dispatcher",
              "prometheus-operator", "metrics-network-policy-dispatcher",
              "metrics-network-policy-operator")
# The dispatcher's Deployments, one per way to run it on a manager.
DISPATCHER_OVERLAYS = ("manager", "manager-beside-kueue", "manager-kueue")
# The namespaces the project creates for itself; any other is someone else's.
OWN_NAMESPACES = {"trainjob-system", "training-operator-system"}


def test_every_base_is_covered():
    bases = {p.parent.name for p in manifests_dir().glob("*/kustomization.yaml")}
    assert bases == set(MANAGER_BASES) | set(WORKER_BASES) | set(RENDER_ONLY) | set(COMPONENTS)


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
    # refused; the (empty) Namespaces are created for real first. So are those the base
    # needs and does not declare: worker-access's and worker-reader's, which
    # worker-namespace declares, and Kueue's, where the overlays for a manager with Kueue
    # put Roles (Kueue's release creates it).
    namespaces = by_kind(objects, "Namespace")
    declared = {o["metadata"]["name"] for o in namespaces}
    namespaces += [{"metadata": {"name": name}} for name in sorted(
        {o["metadata"].get("namespace") for o in objects} - {None} - declared)]
    for namespace in namespaces:
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


def _pod_args(deployment: dict) -> list[str]:
    """The container's args with ``$(POD_NAMESPACE)`` as the kubelet expands it."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
           for e in container.get("env") or []}
    args = container["args"]
    if any("$(POD_NAMESPACE)" in a for a in args):
        assert env.get("POD_NAMESPACE") == "metadata.namespace", env
    return [a.replace("$(POD_NAMESPACE)", deployment["metadata"]["namespace"]) for a in args]


def _dispatcher_config(deployment: dict):
    """The configuration the shipped dispatcher Pod runs with (its args, parsed and
    validated by the dispatcher's own CLI)."""
    from dispatcher.cli import build_parser, config_from_args

    args = build_parser().parse_args(_pod_args(deployment))
    assert args.config is None, "the Deployment's configuration is all in its args"
    return config_from_args(args)


def _rules(objects: list[dict], kind: str, name: str, namespace: str | None = None
           ) -> list[dict]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name
             and o["metadata"].get("namespace") == namespace]
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}; found {len(found)}"
    return found[0]["rules"]


def _allows(rules: list[dict], group: str, resource: str, verb: str,
            name: str | None = None) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


def _bound_to(objects: list[dict], kind: str, role: str, namespace: str | None
              ) -> set[tuple[str, str]]:
    """The ServiceAccounts the bindings of ``kind`` ``role`` (in ``namespace``) grant it to."""
    binding = "RoleBinding" if kind == "Role" else "ClusterRoleBinding"
    return {(s["namespace"], s["name"]) for o in objects if o["kind"] == binding
            and o["roleRef"]["kind"] == kind and o["roleRef"]["name"] == role
            and o["metadata"].get("namespace") == namespace
            for s in o["subjects"] if s["kind"] == "ServiceAccount"}


def _bound_accounts(objects: list[dict]) -> set[tuple[str, str]]:
    return {(s["namespace"], s["name"]) for o in objects if o["kind"].endswith("Binding")
            for s in o.get("subjects") or [] if s["kind"] == "ServiceAccount"}


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
    assert args.leader_elect is True and args.metrics_secure and args.metrics_port == 8443
    # The Lease the Role lets it renew is the one the dispatcher takes with the default origin.
    role = one(objects, "Role")
    named = [r for r in role["rules"] if "leases" in r["resources"] and r.get("resourceNames")]
    assert named and named[0]["resourceNames"] == [f"trainjob-dispatcher-{c.DEFAULT_ORIGIN}"]


def test_operator_webhook_service_and_deployment_fit_together():
    objects = kustomize.render("operator")
    deployment = one(objects, "Deployment")
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    service = next(o for o in by_kind(objects, "Service")
                   if o["metadata"]["name"] == webhook["clientConfig"]["service"]["name"])
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
    assert pod["spec"]["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_the_operator_keeps_its_own_webhook_certificates():
    """manifests/operator: the operator makes the Secret, writes the caBundle and serves
    the certificate from a writable directory, with RBAC for exactly those names."""
    objects = kustomize.render("operator")
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    from training_operator.cli import build_parser

    args = build_parser().parse_args(_pod_args(deployment))
    assert args.webhook_cert_management == "internal"
    configuration = one(objects, "ValidatingWebhookConfiguration")
    service = configuration["webhooks"][0]["clientConfig"]["service"]
    assert (args.webhook_config_name, args.webhook_service, args.webhook_cert_namespace) == (
        configuration["metadata"]["name"], service["name"], service["namespace"])
    assert "cert-manager.io/inject-ca-from" not in (configuration["metadata"].get("annotations")
                                                     or {})
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-certs")
    assert volume == {"name": "webhook-certs", "emptyDir": {}}, volume
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "webhook-certs")
    assert not mount.get("readOnly") and mount["mountPath"] == args.webhook_cert_dir
    account = (deployment["metadata"]["namespace"], pod["serviceAccountName"])
    roles = [o for o in objects if o["kind"] == "Role"
             and o["metadata"]["namespace"] == args.webhook_cert_namespace
             and account in _bound_to(objects, "Role", o["metadata"]["name"],
                                      args.webhook_cert_namespace)]
    rules = [r for role in roles for r in role["rules"]]
    secret = args.webhook_cert_secret
    assert all(_allows(rules, "", "secrets", verb, secret)
               for verb in ("create", "get", "list", "watch", "update")), rules
    assert not _allows(rules, "", "secrets", "get", "another-secret"), rules
    cluster_rules = _rules(objects, "ClusterRole", "training-operator-webhook-cert")
    assert _bound_to(objects, "ClusterRole", "training-operator-webhook-cert", None) == {account}
    assert all(_allows(cluster_rules, "admissionregistration.k8s.io",
                       "validatingwebhookconfigurations", verb, args.webhook_config_name)
               for verb in ("get", "patch")), cluster_rules
    assert not _allows(cluster_rules, "admissionregistration.k8s.io",
                       "validatingwebhookconfigurations", "patch", "someone-elses"), cluster_rules


def test_the_cert_manager_variant_leaves_the_certificates_to_cert_manager():
    objects = kustomize.render("operator-cert-manager")
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    from training_operator.cli import build_parser

    args = build_parser().parse_args(_pod_args(deployment))
    assert args.webhook_cert_management == "external"
    certificate = one(objects, "Certificate")
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-certs")
    assert volume == {"name": "webhook-certs",
                      "secret": {"secretName": certificate["spec"]["secretName"]}}, volume
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert args.webhook_cert_dir == mounts["webhook-certs"]
    annotation = one(objects, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotation["cert-manager.io/inject-ca-from"] == (
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}")
    assert not [o["metadata"]["name"] for o in objects
                if o["metadata"]["name"] == "training-operator-webhook-cert"], (
        "the operator's certificate RBAC is left out")


# --- what a user deploying beside Kueue gets ---------------------------------------------


@pytest.mark.parametrize("overlay", ["dispatcher", "manager", "manager-beside-kueue"])
def test_the_standalone_dispatcher_does_not_take_kueues_origin(overlay):
    """A standalone dispatcher with Kueue's origin refuses to start where Kueue runs
    (``beside_kueue.origin_conflict``: each would take the other's copies for its own).
    The shipped one has an origin of its own, and its Role lets it renew the Lease named
    after that origin."""
    objects = kustomize.render(overlay)
    deployment = one(objects, "Deployment")
    config = _dispatcher_config(deployment)
    assert config.mode == "standalone"
    assert config.origin != c.KUEUE_DEFAULT_ORIGIN, (
        f"manifests/{overlay}: origin {config.origin} is Kueue's default")
    account = (deployment["metadata"]["namespace"],
               deployment["spec"]["template"]["spec"]["serviceAccountName"])
    lease = f"trainjob-dispatcher-{config.origin}"
    rules = _rules(objects, "Role", "trainjob-dispatcher", config.namespace)
    assert all(_allows(rules, "coordination.k8s.io", "leases", verb, lease)
               for verb in ("create", "get", "update")), (lease, rules)
    assert _bound_to(objects, "Role", "trainjob-dispatcher", config.namespace) == {account}


# The bases a team installs the product with, and removes it with: none carries a CRD.
DEPLOY_BASES = ("manager", "manager-beside-kueue", "manager-kueue", "dispatcher", "worker",
                "worker-kueue", "worker-namespace", "operator", "operator-cert-manager",
                "worker-access", "worker-reader", *COMPONENTS)


@pytest.mark.parametrize("base", DEPLOY_BASES)
def test_no_deploy_base_installs_or_removes_a_crd(base):
    """CRDs are an install step of their own (manifests/crds where no Trainer CRDs exist,
    manifests/multikueue-crds where no Kueue runs): applying an overlay never replaces
    another project's CRD, and ``kubectl delete -k`` of it never deletes one, with every
    object of its kind."""
    crds = [o["metadata"]["name"] for o in kustomize.render(base)
            if o["kind"] == "CustomResourceDefinition"]
    assert crds == [], f"manifests/{base} carries the CRDs {crds}"


@pytest.mark.parametrize("base", sorted(set(MANAGER_BASES + WORKER_BASES + RENDER_ONLY
                                            + COMPONENTS)))
def test_no_base_owns_a_namespace_it_does_not_create_for_itself(base):
    """``kubectl delete -k`` deletes every Namespace a base declares, with all that is in
    it: no base declares Kueue's (or anyone else's). In Kueue's namespace the manager
    overlays put only the dispatcher's own Roles and bindings, which removal takes away."""
    objects = kustomize.render(base)
    declared = {o["metadata"]["name"] for o in by_kind(objects, "Namespace")}
    assert declared <= OWN_NAMESPACES, f"manifests/{base} declares {declared - OWN_NAMESPACES}"
    elsewhere = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"])
                 for o in objects if o["metadata"].get("namespace") not in OWN_NAMESPACES | {None}]
    assert all(kind in ("Role", "RoleBinding") and name.startswith("trainjob-dispatcher-")
               for kind, _, name in elsewhere), elsewhere


# Every object the project installs carries this label, so that it can be listed and
# removed by it; the CRDs, which are not the product's to remove, never do.
BUT_THE_CRDS = "app.kubernetes.io/name"


@pytest.mark.parametrize("base", sorted(set(MANAGER_BASES + WORKER_BASES + RENDER_ONLY
                                            + COMPONENTS) - {"samples"}))
def test_everything_but_the_crds_is_labelled_for_removal(base):
    named = {o["kind"]: [] for o in kustomize.render(base)}
    for obj in kustomize.render(base):
        named[obj["kind"]].append(BUT_THE_CRDS in (obj["metadata"].get("labels") or {}))
    crds = named.pop("CustomResourceDefinition", [])
    assert not any(crds), f"manifests/{base}: a CRD carries {BUT_THE_CRDS}"
    unlabelled = [kind for kind, labelled in named.items() if not all(labelled)]
    assert unlabelled == [], f"manifests/{base}: {unlabelled} without {BUT_THE_CRDS}"


def test_removing_the_dispatcher_leaves_kueues_namespace_alone(multicluster):
    """manifests/manager-beside-kueue applied and removed as docs/deploy.md says, with a
    plain ``kubectl delete -k``: the dispatcher's namespace and its Roles in Kueue's
    namespace go; Kueue's namespace, what Kueue keeps there and every CRD (which the
    session's clusters share) stay."""
    target = multicluster["worker-2"]  # nothing else here uses Kueue's namespace
    fixtures.ensure_namespace(target.api, c.KUEUE_NAMESPACE)
    kept = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="kueue-manager-config"),
                              data={"controller_manager_config.yaml": "multiKueue: {}\n"})
    try:
        target.core.create_namespaced_config_map(c.KUEUE_NAMESPACE, kept)
    except ApiException as err:
        assert err.status == 409, err.body
    overlay_dir = str(kustomize.base_path("manager-beside-kueue"))
    crds_before = _crd_names(target)
    applied = kustomize.kubectl(target.kubeconfig, "apply", "-k", overlay_dir)
    assert applied.returncode == 0, applied.stderr
    assert "customresourcedefinition" not in applied.stdout, applied.stdout
    rbac = client.RbacAuthorizationV1Api(target.api)

    def ours_in_kueues() -> list[str]:
        return sorted(r.metadata.name for r in rbac.list_namespaced_role(c.KUEUE_NAMESPACE).items
                      if r.metadata.name.startswith("trainjob-dispatcher-"))
    assert ours_in_kueues() == ["trainjob-dispatcher-kueue-config"]

    removed = kustomize.kubectl(target.kubeconfig, "delete", "-k", overlay_dir, "--wait=false")
    assert removed.returncode == 0, removed.stderr
    assert "customresourcedefinition" not in removed.stdout, removed.stdout
    namespace = target.core.read_namespace(c.KUEUE_NAMESPACE)
    assert namespace.metadata.deletion_timestamp is None and namespace.status.phase == "Active"
    assert target.core.read_namespaced_config_map("kueue-manager-config", c.KUEUE_NAMESPACE)
    assert ours_in_kueues() == []
    assert _crd_names(target) == crds_before

    def own_namespace() -> str | None:
        try:
            return target.core.read_namespace("trainjob-system").status.phase
        except ApiException as err:
            if err.status == 404:
                return None
            raise
    eventually(own_namespace, lambda phase: phase is None, timeout=60,
               expected="the dispatcher's namespace trainjob-system deleted")


def _crd_names(cluster) -> list[str]:
    return sorted(crd.metadata.name for crd in client.ApiextensionsV1Api(
        cluster.api).list_custom_resource_definition().items)


def _secret_rules(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(o, rule) for o in objects if o["kind"] in ("Role", "ClusterRole")
            for rule in o["rules"] if "secrets" in rule.get("resources", [])]


def test_worker_secrets_are_listed_in_one_place_for_every_mode():
    """The worker kubeconfig Secrets the dispatcher may read are named once, in
    manifests/worker-secrets, and every manager overlay grants exactly those, by name, where
    that overlay's dispatcher reads them: its own namespace, in kueue mode too (Kueue's
    Secrets of the same names, in Kueue's namespace, are never the dispatcher's)."""
    listed = [rule["resourceNames"]
              for _, rule in _secret_rules(kustomize.render("worker-secrets"))]
    assert len(listed) == 1 and listed[0], listed
    assert _secret_rules(kustomize.render("dispatcher")) == [], (
        "the dispatcher base itself names no worker's Secret")
    for name in DISPATCHER_OVERLAYS:
        objects = kustomize.render(name)
        deployment = one(objects, "Deployment")
        config = _dispatcher_config(deployment)
        rules = _secret_rules(objects)
        assert len(rules) == 1, f"manifests/{name}: {rules}"
        role, rule = rules[0]
        assert role["kind"] == "Role" and rule["resourceNames"] == listed[0] and \
            set(rule["verbs"]) == {"list", "watch"}, (name, role)
        assert role["metadata"]["namespace"] == config.worker_secrets_namespace, (
            f"manifests/{name}: the Secrets are read in {config.worker_secrets_namespace}; "
            f"the Role is in {role['metadata']['namespace']}")
        account = (deployment["metadata"]["namespace"],
                   deployment["spec"]["template"]["spec"]["serviceAccountName"])
        assert _bound_to(objects, "Role", role["metadata"]["name"],
                         config.worker_secrets_namespace) == {account}, name


def test_the_worker_reader_only_reads_what_kueue_mode_reads():
    """manifests/worker-reader, what a Kueue-mode dispatcher reads a worker with: a
    ServiceAccount of its own (never worker-access's writing one), bound cluster-wide to
    list and watch of exactly the resources its worker caches read (workers/connection.py,
    room/worker_quota.py, workers/warning_events.py), and nothing else; and a ClusterRole
    of the remote view's one other read, a Pod's log (get), bound to nobody by the base
    (the worker's administrator binds it per namespace)."""
    objects = kustomize.render("worker-reader")
    account = ("trainjob-system", "trainjob-dispatcher-reader")
    assert _bound_accounts(objects) == {account}
    writers = kustomize.render("worker-access")
    assert account not in {(s.get("namespace"), s["name"]) for o in writers
                           if o["kind"].endswith("Binding") for s in o.get("subjects") or []}
    bound = {o["roleRef"]["name"] for o in objects if o["kind"].endswith("Binding")}
    assert bound == {"trainjob-dispatcher-worker-reader"}, bound

    def grants(role: str) -> set[tuple[str, str, str]]:
        [found] = [o for o in objects if o["kind"] == "ClusterRole"
                   and o["metadata"]["name"] == role]
        return {(group, resource, verb) for r in found["rules"] for group in r["apiGroups"]
                for resource in r["resources"] for verb in r["verbs"]}

    assert {o["metadata"]["name"] for o in objects if o["kind"] in ("Role", "ClusterRole")} \
        == {"trainjob-dispatcher-worker-reader", "trainjob-dispatcher-reader-job-viewer"}
    assert grants("trainjob-dispatcher-worker-reader") == {
        (group, resource, verb) for group, resource in (
            ("trainer.kubeflow.org", "trainjobs"), ("trainer.kubeflow.org", "trainingruntimes"),
            ("trainer.kubeflow.org", "clustertrainingruntimes"), ("", "namespaces"),
            ("", "nodes"), ("", "pods"), ("", "events"), ("kueue.x-k8s.io", "localqueues"),
            ("kueue.x-k8s.io", "clusterqueues")) for verb in ("list", "watch")}
    assert grants("trainjob-dispatcher-reader-job-viewer") == {("", "pods/log", "get")}


def test_a_rollout_never_leaves_the_webhook_without_a_pod():
    """The webhook fails closed on every TrainJob write, so there is always a ready Pod to
    answer it: two replicas, a rolling update that starts a new Pod before it stops an old
    one, a PodDisruptionBudget against drains, readiness that waits for the webhook, a
    pause before a Pod stops serving. Two replicas reconcile only through a Lease their
    Role lets them hold."""
    objects = kustomize.render("operator")
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["failurePolicy"] == "Fail"
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    replicas = spec["replicas"]
    assert replicas >= 2
    assert spec["strategy"]["type"] == "RollingUpdate" and \
        spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, spec["strategy"]
    labels = spec["template"]["metadata"]["labels"]
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= budget["minAvailable"] < replicas, budget  # a drain still progresses
    container = spec["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] >= 1
    from training_operator.cli import build_parser
    from training_operator.controller import lease_name

    args = build_parser().parse_args(_pod_args(deployment))
    assert args.leader_elect and args.webhook_cert_dir
    account = (deployment["metadata"]["namespace"],
               spec["template"]["spec"]["serviceAccountName"])
    lease = lease_name(args.namespace)
    roles = [o for o in objects if o["kind"] == "Role"
             and o["metadata"]["namespace"] == args.leader_elect_namespace
             and account in _bound_to(objects, "Role", o["metadata"]["name"],
                                      args.leader_elect_namespace)]
    assert any(all(_allows(r["rules"], "coordination.k8s.io", "leases", verb, lease)
                   for verb in ("create", "get", "update")) for r in roles), (lease, roles)


@pytest.mark.parametrize("overlay", DISPATCHER_OVERLAYS)
def test_the_dashboard_is_not_served_on_every_interface(overlay):
    """Metrics (authenticated) and health listen on every interface of the Pod (scraping,
    probes); the dashboard and /api/state (every job, no authentication) only on its
    loopback."""
    from dispatcher.config import is_loopback

    deployment = one(kustomize.render(overlay), "Deployment")
    config = _dispatcher_config(deployment)
    address = config.dashboard_address()
    assert address is not None and is_loopback(address[0]), (
        f"manifests/{overlay}: the dashboard is served on {address or config.metrics_host}")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.metrics_port and address[1] not in ports.values()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "health"


def _listeners(base: str, deployment: dict):
    """Where the shipped Pod serves metrics and probes, as its own CLI resolves its args."""
    if base == "dispatcher":
        return _dispatcher_config(deployment).metrics_listeners()
    from controller_kit import listeners
    from training_operator.cli import PLAIN_METRICS_PORT, build_parser

    return listeners.from_args(build_parser().parse_args(_pod_args(deployment)),
                               PLAIN_METRICS_PORT)


@pytest.mark.parametrize("base, overlay, monitoring", [
    ("dispatcher", "manager", "prometheus-dispatcher"),
    ("operator", "worker", "prometheus-operator")])
def test_metrics_are_served_as_controller_runtime_serves_them(base, overlay, monitoring):
    """HTTPS metrics on every interface of both address families, each scrape checked
    with the apiserver by RBAC the Pod's identity holds; a reader role for Prometheus to
    bind (bound to no one here); probes plain on a port of their own, with a timeout a busy
    process meets; a Service for the metrics, and a ServiceMonitor that finds it only when
    its component is added."""
    objects = kustomize.render(base)
    deployment = one(objects, "Deployment")
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]
    where = _listeners(base, deployment)
    assert (where.metrics_secure, where.metrics_host, where.health_probe_host) == (
        True, "::", "::"), where
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ports["metrics"], ports["health"]) == (
        where.metrics_port, where.health_probe_port) == (8443, 8081), (ports, where)
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "health"}, probe
        assert container[probe]["timeoutSeconds"] >= 5, probe
    # A start on a busy node is not cut short by liveness: minutes to come up.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, startup
    account = (deployment["metadata"]["namespace"], pod["spec"]["serviceAccountName"])
    auth = _rules(objects, "ClusterRole", f"{name}-metrics-auth")
    assert _allows(auth, "authentication.k8s.io", "tokenreviews", "create")
    assert _allows(auth, "authorization.k8s.io", "subjectaccessreviews", "create")
    assert _bound_to(objects, "ClusterRole", f"{name}-metrics-auth", None) == {account}
    assert _rules(objects, "ClusterRole", f"{name}-metrics-reader") == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert _bound_to(objects, "ClusterRole", f"{name}-metrics-reader", None) == set()
    services = {o["metadata"]["name"]: o for o in by_kind(objects, "Service")}
    service = services[f"{name}-metrics"]
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("https", 8443, "metrics")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()

    monitor = one(kustomize.render(monitoring), "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert [n for n, o in services.items()
            if selector.items() <= (o["metadata"].get("labels") or {}).items()] == [
        service["metadata"]["name"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == (
        port["name"], "https", "/metrics")
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert by_kind(kustomize.render(overlay), "ServiceMonitor") == [], (
        f"manifests/{overlay} needs no Prometheus Operator: its ServiceMonitor is optional")


def test_the_kueue_mode_overlay_sets_what_kueue_mode_needs():
    """manifests/manager-kueue: the mode, Kueue's origin and the dispatcher name Kueue's
    Configuration names; Workloads and AdmissionChecks to read and nominate, no TrainJob or
    MultiKueueCluster writes (Kueue copies, syncs and reports); the Lease of that origin;
    Kueue's Configuration readable; no MultiKueue CRDs of ours (Kueue brings its own)."""
    from dispatcher.config import DEFAULT_DISPATCHER_NAME

    objects = kustomize.render("manager-kueue")
    deployment = one(objects, "Deployment")
    config = _dispatcher_config(deployment)
    assert (config.mode, config.origin, config.dispatcher_name, config.kueue_namespace) == (
        "kueue", c.KUEUE_DEFAULT_ORIGIN, DEFAULT_DISPATCHER_NAME, c.KUEUE_NAMESPACE)
    assert config.leader_elect and deployment["spec"]["replicas"] == 2
    account = (deployment["metadata"]["namespace"],
               deployment["spec"]["template"]["spec"]["serviceAccountName"])
    rules = _rules(objects, "ClusterRole", "trainjob-dispatcher")
    assert _bound_to(objects, "ClusterRole", "trainjob-dispatcher", None) == {account}
    for resource, verbs in (("workloads", ("list", "watch", "patch")),
                            ("workloads/status", ("patch",)),
                            ("admissionchecks", ("list", "watch")),
                            ("multikueueclusters", ("list", "watch")),
                            ("multikueueconfigs", ("list", "watch"))):
        assert all(_allows(rules, "kueue.x-k8s.io", resource, verb) for verb in verbs), resource
    assert all(_allows(rules, "trainer.kubeflow.org", "trainjobs", v) for v in ("list", "watch"))
    writes = [(group, resource, verb)
              for group, resource in (("trainer.kubeflow.org", "trainjobs"),
                                      ("trainer.kubeflow.org", "trainjobs/status"),
                                      ("kueue.x-k8s.io", "multikueueclusters/status"))
              for verb in ("create", "update", "patch", "delete")
              if _allows(rules, group, resource, verb)]
    assert writes == [], writes
    lease = _rules(objects, "Role", "trainjob-dispatcher", config.namespace)
    assert _allows(lease, "coordination.k8s.io", "leases", "update",
                   f"trainjob-dispatcher-{config.origin}")
    assert not _allows(lease, "coordination.k8s.io", "leases", "update",
                       f"trainjob-dispatcher-{c.DEFAULT_ORIGIN}")


@pytest.mark.parametrize("overlay", ["manager-beside-kueue", "manager-kueue"])
def test_overlays_for_a_manager_with_kueue_read_its_configuration(overlay):
    objects = kustomize.render(overlay)
    deployment = one(objects, "Deployment")
    config = _dispatcher_config(deployment)
    account = (deployment["metadata"]["namespace"],
               deployment["spec"]["template"]["spec"]["serviceAccountName"])
    readers = [o for o in objects if o["kind"] == "Role"
               and o["metadata"]["namespace"] == config.kueue_namespace
               and _allows(o["rules"], "", "configmaps", "get", "kueue-manager-config")]
    assert len(readers) == 1 and _bound_to(objects, "Role", readers[0]["metadata"]["name"],
                                           config.kueue_namespace) == {account}


def test_compose_init_uses_the_shipped_identities():
    init = _compose_init()
    expected = {
        "dispatcher": init.DISPATCHER, "worker-access": init.WORKER_ACCESS,
        "operator": init.OPERATOR}
    for base, account in expected.items():
        assert _bound_accounts(kustomize.render(base)) == {account}, base


# --- one owner each: what removing a base removes ------------------------------------


def _key(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _keys(base: str) -> set[str]:
    return {_key(o) for o in kustomize.render(base)}


def _includes(base: str) -> list[str]:
    """The other bases ``manifests/<base>`` takes whole (its ``../`` resources)."""
    kustomization = yaml.safe_load((kustomize.base_path(base) / "kustomization.yaml").read_text())
    return [r[3:] for r in kustomization.get("resources") or [] if r.startswith("../")]


# What each kind of cluster is made of: the bases that take no other base whole. The
# overlays (worker, worker-kueue, operator-cert-manager, the manager overlays) put them
# together, and a cluster takes one overlay per part.
PARTS = {"manager": ("crds", "multikueue-crds", "dispatcher", "worker-secrets",
                     "kueue-config-access", "prometheus-dispatcher"),
         "worker": ("crds", "worker-namespace", "operator", "worker-access", "worker-reader",
                    "prometheus-operator")}


@pytest.mark.parametrize("cluster", sorted(PARTS))
def test_every_object_is_declared_by_one_base(cluster):
    """Every namespace, identity and other object of a cluster is declared in one base
    only: ``trainjob-system`` on a worker by worker-namespace alone (worker-access and
    worker-reader live in it, so neither takes the other with it), each ServiceAccount by
    the base of its identity."""
    parts = PARTS[cluster]
    assert all(_includes(part) == [] for part in parts), "a part takes another base whole"
    owners: dict[str, list[str]] = {}
    for part in parts:
        for key in _keys(part):
            owners.setdefault(key, []).append(part)
    shared = {key: bases for key, bases in owners.items() if len(bases) > 1}
    assert shared == {}, f"declared by more than one base on a {cluster}: {shared}"
    assert owners["Namespace//trainjob-system"] == (
        ["dispatcher"] if cluster == "manager" else ["worker-namespace"])


@pytest.mark.parametrize("overlay, parts", [
    ("worker", ("worker-namespace", "operator", "worker-access")),
    ("worker-kueue", ("worker-namespace", "operator", "worker-reader"))])
def test_the_worker_overlays_are_their_parts(overlay, parts):
    """A worker overlay is its parts and nothing else: a Kueue-mode worker gets the
    read-only identity and no write identity of the dispatcher (Kueue writes there with its
    own), a standalone worker the write identity and no reader."""
    assert tuple(_includes(overlay)) == parts
    assert _keys(overlay) == set().union(*(_keys(part) for part in parts))
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"])
                for o in by_kind(kustomize.render(overlay), "ServiceAccount")}
    writer, reader = fixtures.WORKER_ACCESS_ACCOUNT, ("trainjob-system",
                                                      "trainjob-dispatcher-reader")
    assert (writer in accounts, reader in accounts) == (
        (False, True) if overlay == "worker-kueue" else (True, False)), accounts


def _removed(base: str, keys: dict[str, set[str]]) -> set[str]:
    """What ``kubectl delete -k manifests/<base>`` takes from a cluster holding ``keys``
    (base -> its objects): its own objects, and everything in a namespace it declares."""
    namespaces = {k.split("/", 2)[2] for k in keys[base] if k.startswith("Namespace//")}
    return keys[base] | {k for ks in keys.values() for k in ks
                         if k.split("/", 2)[1] in namespaces}


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_removing_a_base_removes_only_what_it_declared(install):
    """Each installation docs/deploy.md describes (clusters.release.INSTALLS, in apply
    order), its bases rendered: no object is declared by two of them; a base lives only in
    namespaces that it or a base applied before it declares (one base each), or another
    project's; and removing any base (``kubectl delete -k``: its objects, and all that is in
    a namespace it declares) leaves every object of every other base, but those of the bases
    applied after it in its namespace, which are removed first. So removing worker-reader
    from a worker for both kinds of dispatcher leaves the standalone identity and its
    namespace, and the other way round."""
    bases = INSTALLS[install]
    keys = {base: _keys(base) for base in bases}
    declared: dict[str, str] = {}
    for i, base in enumerate(bases):
        for other in bases[:i]:
            assert keys[base] & keys[other] == set(), (base, other, keys[base] & keys[other])
        declared.update({k.split("/", 2)[2]: base for k in keys[base]
                         if k.startswith("Namespace//")})
        lives_in = {k.split("/", 2)[1] for k in keys[base]} & OWN_NAMESPACES
        assert lives_in <= set(declared), (
            f"{install}: manifests/{base} lives in {lives_in - set(declared)}, which no base "
            "applied before it declares")
    for base in bases:
        gone = _removed(base, keys)
        for other in bases:
            in_its_namespace = any(declared.get(k.split("/", 2)[1]) == base for k in keys[other])
            if other != base and not in_its_namespace:
                assert gone & keys[other] == set(), (
                    f"{install}: removing manifests/{base} removes {gone & keys[other]} of "
                    f"manifests/{other}")


def _present(kubeconfig, base: str) -> set[str]:
    """The objects of ``manifests/<base>`` the cluster has (``kubectl get -k``)."""
    out = kustomize.kubectl(kubeconfig, "get", "-k", str(kustomize.base_path(base)),
                            "-o", "json", "--ignore-not-found")
    assert out.returncode == 0, out.stderr
    if not out.stdout.strip():
        return set()
    found = yaml.safe_load(out.stdout)
    return {_key(o) for o in (found["items"] if found["kind"] == "List" else [found])}


def test_removing_one_worker_identity_leaves_the_other(multicluster):
    """On a real apiserver, as docs/deploy.md says a worker for both kinds of dispatcher is
    set up and taken apart: worker-namespace, worker-access and worker-reader applied
    (``kubectl apply -k``); ``kubectl delete -k`` of either identity leaves the other whole,
    and the namespace; the namespace goes last."""
    target = multicluster["worker-2"]  # as the Kueue namespace test: its own namespace use
    bases = ("worker-namespace", "worker-access", "worker-reader")

    def apply(base: str) -> None:
        # Forcing conflicts: earlier modules of the session applied the same objects with
        # the harness's field manager (the least-privilege module leaves the policy).
        out = kustomize.kubectl(target.kubeconfig, "apply", "--server-side",
                                "--force-conflicts", "-k", str(kustomize.base_path(base)))
        assert out.returncode == 0, f"manifests/{base}: {out.stderr}"

    def delete(base: str) -> None:
        out = kustomize.kubectl(target.kubeconfig, "delete", "-k",
                                str(kustomize.base_path(base)), "--wait=false")
        assert out.returncode == 0, f"manifests/{base}: {out.stderr}"

    for base in bases:
        apply(base)
    assert all(_present(target.kubeconfig, b) == _keys(b) for b in bases)
    for removed, kept in (("worker-reader", "worker-access"), ("worker-access", "worker-reader")):
        delete(removed)
        assert _present(target.kubeconfig, removed) == set(), removed
        assert _present(target.kubeconfig, kept) == _keys(kept), f"{kept} after {removed}"
        namespace = target.core.read_namespace("trainjob-system")
        assert namespace.metadata.deletion_timestamp is None, f"after {removed}"
        apply(removed)
    for base in reversed(bases):
        delete(base)

    def namespace_phase() -> str | None:
        try:
            return target.core.read_namespace("trainjob-system").status.phase
        except ApiException as err:
            if err.status == 404:
                return None
            raise
    eventually(namespace_phase, lambda phase: phase is None, timeout=60,
               expected="trainjob-system deleted with worker-namespace, last")


# --- the cert-manager overlay with every kustomize -----------------------------------


def _patches(base: str) -> list[tuple[str, str]]:
    """Each patch of ``manifests/<base>``'s kustomization: (where, its text)."""
    folder = kustomize.base_path(base)
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return [(entry.get("path") or f"patches[{i}]",
             (folder / entry["path"]).read_text() if entry.get("path") else entry["patch"])
            for i, entry in enumerate(kustomization.get("patches") or [])]


@pytest.mark.parametrize("base", sorted(set(MANAGER_BASES + WORKER_BASES + RENDER_ONLY
                                            + COMPONENTS)))
def test_a_deleting_patch_deletes_one_object(base):
    """Several ``$patch: delete`` documents in one patch are refused by kustomize v5.0.1
    (kubectl 1.27) and crash v5.4.2 and v5.5.0 (kubectl 1.31, 1.32;
    kubernetes-sigs/kustomize#5471), whatever the harness's kubectl does with them: a
    patch that deletes is one document."""
    for where, text in _patches(base):
        documents = [d for d in yaml.safe_load_all(text) if d]
        if any(isinstance(d, dict) and d.get("$patch") == "delete" for d in documents):
            assert len(documents) == 1, f"manifests/{base}: {where} deletes {len(documents)}"


def test_the_cert_manager_overlay_is_the_operator_with_cert_managers_certificate():
    """manifests/operator-cert-manager, rendered by the harness's kubectl: the operator's
    objects without its certificate RBAC (the Role, ClusterRole and their bindings named
    training-operator-webhook-cert), with cert-manager's Issuer and Certificate, nothing
    else."""
    rbac = {f"{kind}/{namespace}/training-operator-webhook-cert" for kind, namespace in (
        ("Role", "training-operator-system"), ("RoleBinding", "training-operator-system"),
        ("ClusterRole", ""), ("ClusterRoleBinding", ""))}
    operator = _keys("operator")
    assert rbac <= operator
    assert _keys("operator-cert-manager") == (operator - rbac) | {
        "Issuer/training-operator-system/training-operator-selfsigned",
        "Certificate/training-operator-system/training-operator-webhook"}


# --- docker-compose and images --------------------------------------------------------


def _compose() -> dict:
    """docker-compose.yml as compose reads it with no variable set (each ``${VAR:-default}``
    becomes its default)."""
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", (ROOT / "docker-compose.yml").read_text())
    return yaml.safe_load(text)


def _compose_init():
    spec = importlib.util.spec_from_file_location("compose_init",
                                                  ROOT / "deploy" / "compose_init.py")
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
    from dispatcher.workers.kubeconfig_policy import check_kubeconfig

    assert check_kubeconfig(yaml.safe_dump(access)).ok


@pytest.mark.parametrize("overlay, component, cluster", [
    ("manager", "metrics-network-policy-dispatcher", "manager"),
    ("worker", "metrics-network-policy-operator", "worker-1")])
def test_the_metrics_network_policy_admits_only_the_monitoring_namespace(
        multicluster, tmp_path, overlay, component, cluster):
    """The opt-in NetworkPolicy components: added to their overlay, the policy selects the
    Deployment's Pods in their namespace and lets the metrics port be reached from the
    namespace ``monitoring`` alone; the operator's webhook and trainer status ports stay
    open to every source; no rule names the probes' port (the kubelet's probes come from
    the node, which a policy does not filter); the apiserver accepts it (server dry run);
    and the patch its kustomization documents names another monitoring namespace."""
    def rendered(name: str, **settings) -> list[dict]:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": [os.path.relpath(kustomize.base_path(overlay), directory)],
            "components": [os.path.relpath(kustomize.base_path(component), directory)],
            **settings}))
        out = kustomize.kubectl(None, "kustomize", str(directory))
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    objects = rendered("with-component")
    deployment, policy = one(objects, "Deployment"), one(objects, "NetworkPolicy")
    pod = deployment["spec"]["template"]
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= \
        pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sources = {port["port"]: rule.get("from") for rule in policy["spec"]["ingress"]
               for port in rule["ports"]}
    # The remote view's port is named by the Deployment once manifests/remote-api/serving
    # is added too; the apiserver calls it, from no Pod.
    serving = {p["name"] for p in one(rendered("with-serving", components=[
        os.path.relpath(kustomize.base_path(name), tmp_path / "with-serving")
        for name in (component, "remote-api/serving")]), "Deployment")["spec"]["template"][
        "spec"]["containers"][0]["ports"]} if overlay == "manager" else set()
    assert set(sources) <= ports | serving, \
        f"ports the Pod does not name: {set(sources) - ports - serving}"
    assert sources.pop("metrics") == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    if overlay == "manager":
        assert sources.pop("remote-api", "no rule") is None, "the remote view's port is " \
            "admitted from anywhere: the apiserver calls it"
    assert sources == ({"webhook": None, "trainer-status": None} if "webhook" in ports
                       else {}), sources  # no rule for the probes' port, "health"
    assert by_kind(kustomize.render(overlay), "NetworkPolicy") == [], (
        f"manifests/{overlay} admits everyone unless {component} is added")

    target = multicluster[cluster]
    try:
        target.core.create_namespace({"metadata": {"name": policy["metadata"]["namespace"]}})
    except ApiException as err:
        assert err.status == 409, err.body
    out = kustomize.apply(target.kubeconfig, [policy], "--dry-run=server")
    assert "(server dry run)" in out, out

    patched = one(rendered("patched", patches=[{
        "target": {"kind": "NetworkPolicy", "name": policy["metadata"]["name"]},
        "patch": "- op: replace\n  path: /spec/ingress/0/from/0/namespaceSelector/matchLabels\n"
                 "  value: {kubernetes.io/metadata.name: observability}\n"}]), "NetworkPolicy")
    assert patched["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "observability"}}}]
