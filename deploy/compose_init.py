"""One-shot set-up of the docker-compose stack (docker-compose.yml), run in the dispatcher
image with the project's own code:

* ``certs``: per cluster a CA, the apiserver's serving certificate (for its container name
  and for 127.0.0.1), the service-account key, an admin kubeconfig for the containers and
  one for the host, and kubeconfigs for the shipped ServiceAccounts (client certificates
  whose CN is ``system:serviceaccount:<ns>:<name>``): the dispatcher on the manager, the
  operator and the dispatcher's worker-access identity on each worker.
  On each worker also the configurations of kube-scheduler, kwok (its Stages read from the
  kwok image's copy of its module) and the JobSet controller, with a serving certificate for
  JobSet's webhooks at its container name.
* ``setup``: once the apiservers answer, install the CRDs, the shipped identities (the
  Namespace, ServiceAccount, RBAC and policy objects of manifests/dispatcher, operator and
  worker-access, whose writer role is bound in ``default``, where the samples go), the
  sample runtime and a Node with capacity per worker, JobSet's CRD and
  webhooks on each worker (read from the JobSet image's copy of its module), and register
  the workers on the manager (Secret + MultiKueueCluster).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from clusters import crds, fixtures, worker_stack
from clusters.controlplane import wait_until
from clusters.pki import ClusterPKI, cert_pem, client_kubeconfig, key_pem, service_account_user
from controller_kit.kubeclient import api_client

# The identities as the manifests ship them (namespace, ServiceAccount name).
DISPATCHER = ("trainjob-system", "trainjob-dispatcher")
WORKER_ACCESS = ("trainjob-system", "trainjob-dispatcher")
OPERATOR = ("training-operator-system", "training-operator")
# With worker-access's policy, which holds the dispatcher's identity to its copies.
IDENTITY_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                  "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# Where the compose stack's jobs go (the samples'): opened to the dispatcher on each worker.
JOB_NAMESPACE = "default"
# The images' user: identity kubeconfigs must be readable by it, and by nobody else.
IMAGE_UID = 65532
APISERVER_PORT = 6443
JOBSET_WEBHOOK_PORT = 9443
JOBSET_HEALTH_PORT = 8081


def apiserver_host(cluster: str) -> str:
    return f"apiserver-{cluster}"


def jobset_host(cluster: str) -> str:
    return f"jobset-{cluster}"


def write_worker_files(pki: ClusterPKI, cluster: str) -> None:
    """What a worker's scheduler, kwok and JobSet read: their configurations, and a webhook
    serving certificate for JobSet's container name."""
    worker_stack.write_scheduler_config(pki.directory, pki.directory / "admin.kubeconfig")
    worker_stack.write_kwok_config(pki.directory)
    directory = pki.directory / "jobset"
    directory.mkdir(exist_ok=True)
    key, cert = pki.certificate_authority().issue(
        "jobset-webhook", dns_names=(jobset_host(cluster),), server=True)
    (directory / "serving.crt").write_bytes(cert_pem(cert))
    (directory / "serving.key").write_bytes(key_pem(key))
    (directory / "serving.key").chmod(0o600)
    worker_stack.write_jobset_config(directory, directory / "serving.crt",
                                     directory / "serving.key", JOBSET_WEBHOOK_PORT,
                                     JOBSET_HEALTH_PORT, "0.0.0.0")


def _write_kubeconfig(path: Path, config: dict, owner: int | None = None) -> None:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner, owner)


def write_certs(directory: Path, clusters: dict[str, int]) -> None:
    """PKI and kubeconfigs for each ``cluster -> host port``; existing PKI is kept."""
    for cluster, host_port in clusters.items():
        pki = ClusterPKI(directory / cluster)
        if not pki.exists():
            pki.generate(cluster, "127.0.0.1", extra_dns_names=(apiserver_host(cluster),))
        ca = pki.certificate_authority()
        internal = f"https://{apiserver_host(cluster)}:{APISERVER_PORT}"
        admin = (pki.admin_cert.read_bytes(), pki.admin_key.read_bytes())
        for name, server in (("admin", internal), ("admin-host", f"https://127.0.0.1:{host_port}")):
            _write_kubeconfig(pki.directory / f"{name}.kubeconfig", client_kubeconfig(
                cluster, server, pki.ca_cert.read_bytes(), "admin", *admin))
        accounts = {"dispatcher": DISPATCHER} if cluster == "manager" else {
            "operator": OPERATOR, "dispatcher-access": WORKER_ACCESS}
        for name, account in accounts.items():
            user, groups = service_account_user(*account)
            _write_kubeconfig(pki.directory / f"{name}.kubeconfig",
                              ca.user_kubeconfig(cluster, internal, user, groups), IMAGE_UID)
        if cluster != "manager":
            write_worker_files(pki, cluster)
    print(f"certificates and kubeconfigs for {', '.join(clusters)} in {directory}")


def identity_objects(base: str) -> list[dict]:
    """The identity objects a base lists (its resources carry their namespaces)."""
    folder = crds.manifests_dir() / base
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((folder / resource).read_text()):
            if doc and doc["kind"] in IDENTITY_KINDS:
                objects.append(doc)
    return objects


def _apply(api, objects: list[dict]) -> None:
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(api)
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        dynamic.server_side_apply(resource, body=obj, field_manager="trainjob-compose",
                                  force_conflicts=True)


def _answers(api) -> bool:
    from kubernetes import client

    try:
        client.VersionApi(api).get_code(_request_timeout=5)
        return True
    except Exception:  # noqa: BLE001 - the apiserver is still starting
        return False


def setup(directory: Path, clusters: list[str], timeout: float) -> None:
    """Install CRDs and identities, then register the workers on the manager."""
    apis = {c: api_client(directory / c / "admin.kubeconfig") for c in clusters}
    runtime = yaml.safe_load(
        (crds.manifests_dir() / "samples" / "runtime-torch-distributed.yaml").read_text())
    for cluster, api in apis.items():
        wait_until(f"{cluster}: apiserver", lambda api=api: _answers(api), timeout,
                   interval=1)
        role = "manager" if cluster == "manager" else "worker"
        crds.install_crds(api, crds.load_crds(crds.crd_dirs(role)), timeout)
        # worker-secrets: the Role naming the worker Secrets the dispatcher may read (the
        # sample names, which are compose's workers).
        bases = (["dispatcher", "worker-secrets"] if role == "manager"
                 else ["operator", "worker-namespace", "worker-access"])
        _apply(api, [obj for base in bases for obj in identity_objects(base)])
        if role == "worker":
            crds.install_crds(api, worker_stack.jobset_crds(), timeout)
            worker_stack.install_webhook_configurations(
                api, worker_stack.jobset_webhook_configurations(
                    f"https://{jobset_host(cluster)}:{JOBSET_WEBHOOK_PORT}",
                    ClusterPKI(directory / cluster).ca_cert.read_bytes()))
            fixtures.install_runtime(api, runtime)
            fixtures.open_namespace_to_dispatcher(api, JOB_NAMESPACE)
            fixtures.add_node(api, f"{cluster}-node", {"cpu": "64", "memory": "256Gi",
                                                       "pods": "110"})
        print(f"{cluster}: CRDs and identities installed")
    for cluster in clusters:
        if cluster != "manager":
            fixtures.register_worker(apis["manager"], cluster,
                                     directory / cluster / "dispatcher-access.kubeconfig",
                                     namespace=DISPATCHER[0])
            print(f"manager: worker {cluster} registered")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    certs = sub.add_parser("certs", help="write PKI and kubeconfigs")
    certs.add_argument("--dir", type=Path, required=True)
    certs.add_argument("--clusters", required=True,
                       help="comma-separated name=host-port, the manager first")
    run = sub.add_parser("setup", help="install CRDs and identities, register workers")
    run.add_argument("--dir", type=Path, required=True)
    run.add_argument("--clusters", required=True, help="comma-separated names")
    run.add_argument("--timeout", type=float, default=180)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "certs":
        pairs = dict(item.split("=", 1) for item in args.clusters.split(","))
        write_certs(args.dir, {name: int(port) for name, port in pairs.items()})
    else:
        setup(args.dir, args.clusters.split(","), args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
