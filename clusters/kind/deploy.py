"""``python -m clusters deploy --provider kind``: the product into the kind clusters of a
state directory, as a team deploys it, from the shipped manifests:

1. the project's images, built here from the working tree (``clusters.images``), are
   ``kind load``-ed: the dispatcher's into the manager, the training operator's and the
   workload's into each worker's kind worker nodes (where pods run);
2. on each worker, the TrainJob CRDs where it has none (``manifests/crds``, a step of its
   own: ``up`` installs them, the project's or upstream's, and they are kept), then
   ``kubectl apply --server-side -k manifests/worker``: the training operator (two
   replicas, its webhook Service and configuration; it makes its webhook certificate and
   puts its CA into the configuration itself) and the identity the dispatcher uses there;
3. on the manager, the TrainJob and MultiKueue CRDs where it has none, then ``kubectl apply
   --server-side -k manifests/manager``: the dispatcher (two replicas electing a leader with
   a Lease); ``--manager-overlay manager-beside-kueue`` applies that overlay instead, beside
   the Kueue ``up --kueue manager`` installed (Kueue brings the MultiKueue CRDs);
   ``--manager-overlay manager-kueue`` runs the dispatcher in Kueue mode, as the external
   MultiKueue dispatcher of the Kueue ``up --kueue manager --kueue worker-1 ...
   --kueue-dispatcher trainjob-dispatcher.io/capacity`` installed on every cluster;
4. each worker registered on the manager: a kubeconfig addressing the worker's control-plane
   container on the kind network, authenticated as the worker-access ServiceAccount (its
   token Secret), in the Secret ``<worker>-kubeconfig``, and a MultiKueueCluster naming it.
   In Kueue mode each worker gets ``manifests/worker-kueue`` instead of ``manifests/worker``
   (the read-only worker-reader identity in place of worker-access's, which only a
   standalone dispatcher uses) and Kueue's own MultiKueue identity
   (``kueue.multikueue_worker_identity``); the dispatcher's Secret holds the worker-reader
   identity, and Kueue's Secret of the same name in kueue-system, which the
   MultiKueueCluster names for Kueue, holds Kueue's;
5. wait until both Deployments are rolled out, the operators' webhooks answer, a dispatcher
   holds the Lease and every worker is Active (the dispatcher's condition; in Kueue mode
   Kueue's, about its own connection; beside Kueue, whose MultiKueue controller owns that
   condition, only the rollout and the Lease are waited for);
6. ``--remote-api``: in step 3 the manager's overlay is applied with the component
   ``manifests/remote-api/serving``, and ``manifests/remote-api`` but its APIService right
   after it (the remote view's aggregated API, ``clusters.kind.remote_api``; its RBAC lets
   a replica serve it, which its readiness waits for); after step 5, once its Service
   routes to both dispatcher replicas, the APIService is applied and deploy waits until it
   is Available.

The queues are the team's own, never deploy's: in Kueue mode, the MultiKueueConfig,
AdmissionCheck, ClusterQueues and LocalQueues (Kueue's MultiKueue guide) come from the team.

Safe to repeat: apply is declarative, and a registration already in place is kept.
``kubectl delete -k`` of the same two bases removes it all (delete the TrainJobs first, while
the dispatcher runs to clear its finalizers; see docs/kind.md).
"""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import binaries, fixtures, images, kustomize
from clusters.controlplane import ControlPlaneError
from clusters.kind import KindClusters, remote_api, waits
from clusters.kind import kueue as kind_kueue
from controller_kit.kubeclient import api_client
from trainjob import constants as c

MANAGER_BASE = "manager"
# The manager overlays `deploy --manager-overlay` takes: without Kueue, and beside a Kueue
# that `up --kueue manager` installed.
BESIDE_KUEUE = "manager-beside-kueue"
# Kueue mode: the dispatcher as Kueue's external MultiKueue dispatcher.
KUEUE_MODE = "manager-kueue"
MANAGER_OVERLAYS = (MANAGER_BASE, BESIDE_KUEUE, KUEUE_MODE)
WORKER_BASE = "worker"
# A Kueue-mode worker: the same, with the read-only identity a Kueue-mode dispatcher reads
# a worker with (worker-reader) in place of worker-access.
WORKER_KUEUE_BASE = "worker-kueue"
WORKER_READER_BASE = "worker-reader"
WORKER_READER_USER = "trainjob-dispatcher-reader"
FIELD_MANAGER = "trainjob-deploy"
# Who the manager's dispatcher authenticates as on a worker (manifests/worker-access).
WORKER_ACCESS_USER = "trainjob-dispatcher"
TOKEN_SECRET_TYPE = "kubernetes.io/service-account-token"


@dataclass(frozen=True)
class Shipped:
    """The names deploy needs, read from the rendered bases rather than repeated here, so
    they cannot drift from what is applied."""
    operator_namespace: str
    operator_deployment: str
    access_namespace: str
    token_secret: str
    dispatcher_namespace: str
    dispatcher_deployment: str
    dispatcher_lease: str
    worker_secrets: tuple[str, ...]
    reader_namespace: str
    reader_token_secret: str

    @classmethod
    def read(cls, manager_base: str = MANAGER_BASE) -> Shipped:
        worker = kustomize.render(WORKER_BASE)
        manager = kustomize.render(manager_base)

        def one(objects: list[dict], kind: str, base: str, where=lambda o: True) -> dict:
            found = [o for o in objects if o["kind"] == kind and where(o)]
            if len(found) != 1:
                raise ControlPlaneError(f"manifests/{base}: expected one {kind}, found "
                                        f"{[o['metadata']['name'] for o in found]}")
            return found[0]

        operator = one(worker, "Deployment", WORKER_BASE)
        token = one(worker, "Secret", WORKER_BASE, lambda o: o.get("type") == TOKEN_SECRET_TYPE)
        reader = one(kustomize.render(WORKER_READER_BASE), "Secret", WORKER_READER_BASE,
                     lambda o: o.get("type") == TOKEN_SECRET_TYPE)
        dispatcher = one(manager, "Deployment", manager_base)

        def rules(o: dict) -> list[dict]:
            return o.get("rules") or []

        lease = one(manager, "Role", manager_base, lambda o: any(
            "leases" in r.get("resources", []) and r.get("resourceNames")
            for r in rules(o)))
        lease_name = next(n for r in rules(lease) if "leases" in r.get("resources", [])
                          for n in r.get("resourceNames") or [])
        secrets_role = one(manager, "Role", manager_base, lambda o: any(
            "secrets" in r.get("resources", []) for r in rules(o)))
        return cls(
            operator_namespace=operator["metadata"]["namespace"],
            operator_deployment=operator["metadata"]["name"],
            access_namespace=token["metadata"]["namespace"],
            token_secret=token["metadata"]["name"],
            dispatcher_namespace=dispatcher["metadata"]["namespace"],
            dispatcher_deployment=dispatcher["metadata"]["name"],
            dispatcher_lease=lease_name,
            worker_secrets=tuple(n for r in rules(secrets_role)
                                 for n in r.get("resourceNames") or []),
            reader_namespace=reader["metadata"]["namespace"],
            reader_token_secret=reader["metadata"]["name"])


@dataclass
class DeployReport:
    """What was done, per cluster, with the seconds each step took."""
    steps: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, cluster: str, step: str, started: float) -> None:
        self.steps.setdefault(cluster, []).append(
            f"{step} ({time.monotonic() - started:.0f} s)")


def apply_base(kubeconfig: Path, base: str) -> None:
    """``kubectl apply --server-side -k manifests/<base>``. Conflicts are forced: a deploy
    again after a change to the manifests takes the fields over from the one before."""
    apply_kustomization(kubeconfig, kustomize.base_path(base), f"manifests/{base}")


def apply_kustomization(kubeconfig: Path, directory: Path, what: str) -> None:
    """``kubectl apply --server-side -k <directory>`` (``what`` names it in a failure)."""
    out = kustomize.kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts",
                            f"--field-manager={FIELD_MANAGER}", "-k", str(directory),
                            timeout=180)
    if out.returncode != 0:
        raise ControlPlaneError(f"kubectl apply -k {what} failed: "
                                f"{out.stderr.strip()[-2000:]}")


# The CRDs a cluster needs before its overlay, each an install step of its own, applied only
# where the cluster has none: Trainer's (or the project's) and, on a manager, Kueue's
# MultiKueue ones (Kueue brings them where it runs).
TRAINER_CRDS = (f"{c.TRAINJOBS}.{c.TRAINER_GROUP}", "crds")
MULTIKUEUE_CRDS = (f"{c.MULTIKUEUECLUSTERS}.{c.KUEUE_GROUP}", "multikueue-crds")


def ensure_crds(kubeconfig: Path, api: client.ApiClient,
                wanted: tuple[tuple[str, str], ...]) -> list[str]:
    """Apply each ``(crd, base)`` of ``wanted`` whose CRD the cluster lacks; the bases
    applied. A CRD already there, the project's or upstream's, is left as it is."""
    extensions = client.ApiextensionsV1Api(api)
    applied = []
    for crd, base in wanted:
        try:
            extensions.read_custom_resource_definition(crd)
            continue
        except ApiException as err:
            if err.status != 404:
                raise
        apply_base(kubeconfig, base)
        applied.append(base)
    return applied


def _crds_step(applied: list[str]) -> str:
    return (f"CRDs applied ({', '.join(f'manifests/{b}' for b in applied)})" if applied
            else "CRDs already installed, left as they are")


def webhook_problem(api: client.ApiClient) -> str | None:
    """Why the operator's TrainJob webhook does not answer yet (None once it does): a
    server-side dry-run create goes through it; its own refusal is an answer too."""
    probe = {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
             "metadata": {"name": "deploy-probe", "namespace": "default"},
             "spec": {"runtimeRef": {"name": "deploy-probe"}}}
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, "default", c.TRAINJOBS, probe, dry_run="All")
    except ApiException as err:
        body = err.body or ""
        if "failed calling webhook" in body or err.status in (500, 502, 503, 504):
            return f"dry-run TrainJob create: {err.status} {body[:300]}"
    return None


def worker_access_kubeconfig(kind: KindClusters, name: str, token: str,
                             user: str = WORKER_ACCESS_USER) -> dict:
    """The worker's in-network kubeconfig (its control-plane container by name, as kind's
    ``--internal`` writes it) with ``token`` (the worker-access one by default) instead of
    kind's admin user."""
    internal = yaml.safe_load(kind.internal_kubeconfig(name).read_text())
    cluster = internal["clusters"][0]["cluster"]
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": cluster["server"],
            "certificate-authority-data": cluster["certificate-authority-data"]}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }


def _token(api: client.ApiClient, namespace: str, name: str, deadline: float) -> str:
    """A ServiceAccount's token, once the token controller has filled in its Secret
    ``namespace/name``."""
    core = client.CoreV1Api(api)
    found: dict[str, str] = {}

    def problem() -> str | None:
        secret = core.read_namespaced_secret(name, namespace)
        if not (secret.data or {}).get("token"):
            return f"Secret {namespace}/{name} has no token yet"
        found["token"] = base64.b64decode(secret.data["token"]).decode()
        return None

    waits.wait_for(f"the token of Secret {namespace}/{name}", problem, deadline)
    return found["token"]


@dataclass(frozen=True)
class WorkerTokens:
    """The tokens a worker's registrations carry: worker-access's (standalone), and in
    Kueue mode worker-reader's (the dispatcher's) and Kueue's own."""
    access: str | None = None
    reader: str | None = None
    kueue: str | None = None


def _deadline_left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _load(kind: KindClusters, name: str, names: list[str], workers_only: bool,
          deadline: float) -> None:
    """``kind load`` into the cluster's nodes where pods run (a worker's control plane runs
    only JobSet's controller, so it is skipped there)."""
    nodes = list(kind.containers(name))
    only = tuple(nodes[1:]) if workers_only and len(nodes) > 1 else ()
    kind.load_images(name, names, nodes_only=only, timeout=_deadline_left(deadline))


def deploy_worker(kind: KindClusters, name: str, shipped: Shipped, report: DeployReport,
                  deadline: float, kueue_mode: bool = False) -> WorkerTokens:
    """Steps 1-3 and the rollout wait on one worker (``kueue_mode``: worker-kueue, with
    worker-reader in place of worker-access, and Kueue's identity); return the tokens its
    registrations carry."""
    started = time.monotonic()
    _load(kind, name, [images.OPERATOR_IMAGE, images.WORKLOAD_IMAGE], True, deadline)
    report.add(name, "images loaded", started)
    started = time.monotonic()
    with api_client(kind.kubeconfig(name)) as api:
        report.add(name, _crds_step(ensure_crds(kind.kubeconfig(name), api, (TRAINER_CRDS,))),
                   started)
        started = time.monotonic()
        base = WORKER_KUEUE_BASE if kueue_mode else WORKER_BASE
        apply_base(kind.kubeconfig(name), base)
        report.add(name, f"manifests/{base} applied", started)
        started = time.monotonic()
        waits.wait_for(f"{name}: the training operator", lambda: (
            waits.deployment_problem(api, shipped.operator_namespace,
                                     shipped.operator_deployment)
            or webhook_problem(api)), deadline)
        report.add(name, "training operator rolled out, webhook answering", started)
        if not kueue_mode:
            return WorkerTokens(
                _token(api, shipped.access_namespace, shipped.token_secret, deadline))
        started = time.monotonic()
        kustomize.apply(kind.kubeconfig(name), kind_kueue.multikueue_worker_identity())
        report.add(name, "Kueue's MultiKueue identity applied", started)
        return WorkerTokens(
            reader=_token(api, shipped.reader_namespace, shipped.reader_token_secret, deadline),
            kueue=_token(api, kind_kueue.NAMESPACE, kind_kueue.MULTIKUEUE_TOKEN_SECRET,
                         deadline))


def lease_problem(api: client.ApiClient, shipped: Shipped) -> str | None:
    """Why no dispatcher Pod leads yet (None once one of the Deployment's Pods holds the
    Lease)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            shipped.dispatcher_lease, shipped.dispatcher_namespace)
    except ApiException as err:
        return f"Lease {shipped.dispatcher_namespace}/{shipped.dispatcher_lease}: {err.status}"
    holder = lease.spec.holder_identity or ""
    pods = [p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(
        shipped.dispatcher_namespace).items if p.metadata.deletion_timestamp is None]
    if not any(holder.startswith(p) for p in pods):
        return f"Lease held by {holder or 'nobody'}; dispatcher pods: {pods}"
    return None


def workers_problem(api: client.ApiClient, workers: list[str]) -> str | None:
    """Why not every worker is Active on the manager yet (its MultiKueueCluster condition,
    which the dispatcher writes)."""
    objects = client.CustomObjectsApi(api)
    problems = []
    for name in workers:
        cluster = objects.get_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                    c.MULTIKUEUECLUSTERS, name)
        active = next((x for x in (cluster.get("status") or {}).get("conditions") or []
                       if x.get("type") == "Active"), None)
        if not active or active.get("status") != "True":
            problems.append(f"{name}: " + (f"Active={active.get('status')} "
                                           f"{active.get('reason')}: {active.get('message')}"
                                           if active else "no Active condition yet"))
    return "; ".join(problems) or None


def deploy(kind: KindClusters, timeout: float = 300,
           progress: binaries.Progress = binaries.stderr_progress,
           manager_overlay: str = MANAGER_BASE, with_remote_api: bool = False) -> DeployReport:
    """Deploy the product into ``kind``'s clusters (see the module doc), the manager from
    ``manager_overlay`` (one of ``MANAGER_OVERLAYS``); ``with_remote_api``: with the remote
    view's serving component and base (step 6)."""
    begun = time.monotonic()
    deadline = begun + timeout
    state = kind.load()
    names = [r.name for r in state.clusters]
    stopped = [r.name for r in state.clusters if r.stopped]
    if not names or names[0] != "manager":
        raise ControlPlaneError(f"{kind.state_dir}: no kind clusters to deploy into; run "
                                "`python -m clusters up --provider kind` first")
    if stopped:
        raise ControlPlaneError(f"cluster(s) {', '.join(stopped)} are stopped: `python -m "
                                f"clusters start --provider kind {stopped[0]}` first")
    with_kueue = state.clusters[0].kueue_dispatcher is not None
    kueue_mode = manager_overlay == KUEUE_MODE
    if manager_overlay not in MANAGER_OVERLAYS:
        raise ValueError(f"--manager-overlay {manager_overlay}: not one of "
                         f"{', '.join(MANAGER_OVERLAYS)}")
    if with_kueue != (manager_overlay != MANAGER_BASE):
        raise ValueError(
            f"--manager-overlay {manager_overlay}: the manager "
            + ("runs Kueue (`up --kueue manager`): use manifests/" + BESIDE_KUEUE
               if with_kueue else "runs no Kueue: it is for a manager running Kueue (`up "
               "--kueue manager`); use manifests/" + MANAGER_BASE))
    workers = names[1:]
    without = [r.name for r in state.clusters[1:] if r.kueue_dispatcher is None]
    if kueue_mode and without:
        raise ValueError(
            f"--manager-overlay {KUEUE_MODE}: worker(s) {', '.join(without)} run no Kueue; "
            "in Kueue mode Kueue copies the jobs to workers that run Kueue: `up --kueue "
            f"{without[0]}` (every worker)")
    shipped = Shipped.read(manager_overlay)
    unlisted = [w for w in workers if f"{w}-kubeconfig" not in shipped.worker_secrets]
    if unlisted:
        raise ControlPlaneError(
            f"worker(s) {', '.join(unlisted)}: their Secrets "
            f"({', '.join(f'{w}-kubeconfig' for w in unlisted)}) "
            f"are not among those manifests/worker-secrets lets the dispatcher read "
            f"({', '.join(shipped.worker_secrets)}); add them there")
    report = DeployReport()
    started = time.monotonic()
    progress("building the project's images (from the working tree)")
    images.build_images(kind.engine, only=("dispatcher", "training-operator", "workload"),
                        progress=progress)
    report.add("images", "built", started)
    progress(f"deploying into {', '.join(names)}")
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        manager = pool.submit(_deploy_manager, kind, shipped, report, deadline,
                              manager_overlay, with_remote_api)
        tokens = {w: pool.submit(deploy_worker, kind, w, shipped, report, deadline, kueue_mode)
                  for w in workers}
        manager.result()
        for worker, token in tokens.items():
            _register(kind, worker, token.result(), shipped, kueue_mode)
            progress(f"manager: worker {worker} registered")
    with api_client(kind.kubeconfig("manager")) as api:
        started = time.monotonic()
        # Beside Kueue, Kueue's MultiKueue controller writes the Active conditions (about its
        # own connection), so they say nothing of the dispatcher's; in Kueue mode they say
        # Kueue reaches every worker with the identity deploy made for it.
        waits.wait_for("manager: the dispatcher", lambda: (
            waits.deployment_problem(api, shipped.dispatcher_namespace,
                                     shipped.dispatcher_deployment)
            or lease_problem(api, shipped)
            or (None if with_kueue and not kueue_mode else workers_problem(api, workers))),
            deadline)
        report.add("manager", "dispatcher rolled out, leading"
                   + ("" if with_kueue and not kueue_mode else ", every worker Active"),
                   started)
        if with_remote_api:
            started = time.monotonic()
            waits.wait_for("manager: the remote view's Service routing to both replicas",
                           lambda: remote_api.endpoints_problem(
                               api, shipped.dispatcher_namespace,
                               shipped.dispatcher_deployment), deadline)
            apply_base(kind.kubeconfig("manager"), remote_api.BASE)
            waits.wait_for("manager: the remote view's APIService on both replicas", lambda: (
                remote_api.endpoints_problem(api, shipped.dispatcher_namespace,
                                             shipped.dispatcher_deployment)
                or remote_api.apiservice_problem(api)), deadline)
            report.add("manager", "the remote view's APIService Available on both replicas",
                       started)
    report.seconds = time.monotonic() - begun
    return report


def manager_kustomization(kind: KindClusters, overlay: str = MANAGER_BASE,
                          with_remote_api: bool = False) -> tuple[Path, str]:
    """The directory deploy applies on the manager, and how a failure names it:
    ``manifests/<overlay>``, or with the remote view's serving component, the overlay
    ``clusters.kind.remote_api`` writes in the state directory (``kubectl delete -k`` of
    either removes the manager's part)."""
    if not with_remote_api:
        return kustomize.base_path(overlay), f"manifests/{overlay}"
    directory = remote_api.overlay(kind.state_dir, overlay)
    return directory, f"{directory} (manifests/{overlay} + manifests/{remote_api.COMPONENT})"


def _deploy_manager(kind: KindClusters, shipped: Shipped, report: DeployReport,
                    deadline: float, overlay: str = MANAGER_BASE,
                    with_remote_api: bool = False) -> None:
    started = time.monotonic()
    _load(kind, "manager", [images.DISPATCHER_IMAGE], False, deadline)
    report.add("manager", "image loaded", started)
    started = time.monotonic()
    with api_client(kind.kubeconfig("manager")) as api:
        applied = ensure_crds(kind.kubeconfig("manager"), api, (TRAINER_CRDS, MULTIKUEUE_CRDS))
    report.add("manager", _crds_step(applied), started)
    started = time.monotonic()
    directory, what = manager_kustomization(kind, overlay, with_remote_api)
    apply_kustomization(kind.kubeconfig("manager"), directory, what)
    report.add("manager", f"{what} applied", started)
    if with_remote_api:
        # Before any wait: a replica serving the remote view is ready only once it reads
        # the front proxy's settings and keeps its certificate, which this base's RBAC
        # allows. Its APIService comes last (deploy, once the Service routes to ready
        # Pods): the aggregator keeps the connection of its first discovery check, and
        # one made before kube-proxy programmed the Service's address leaves the node
        # unrouted, where whatever answers holds the APIService unavailable.
        started = time.monotonic()
        objects = [o for o in kustomize.render(remote_api.BASE) if o["kind"] != "APIService"]
        out = kustomize.kubectl(kind.kubeconfig("manager"), "apply", "--server-side",
                                "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                                "-f", "-", stdin=yaml.safe_dump_all(objects), timeout=180)
        if out.returncode != 0:
            raise ControlPlaneError(f"kubectl apply of manifests/{remote_api.BASE} but its "
                                    f"APIService failed: {out.stderr.strip()[-2000:]}")
        report.add("manager", f"manifests/{remote_api.BASE} applied but its APIService",
                   started)


def _write_kubeconfig(path: Path, kubeconfig: dict) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def _register(kind: KindClusters, worker: str, tokens: WorkerTokens, shipped: Shipped,
              kueue_mode: bool = False) -> None:
    """Step 4 for ``worker``: its Secret(s) and MultiKueueCluster on the manager."""
    dispatchers = kind.state_dir / f"{worker}.dispatcher.kubeconfig"
    with api_client(kind.kubeconfig("manager")) as api:
        if not kueue_mode:
            _write_kubeconfig(dispatchers, worker_access_kubeconfig(kind, worker,
                                                                    tokens.access))
            fixtures.register_worker(api, worker, dispatchers,
                                     namespace=shipped.dispatcher_namespace)
            return
        _write_kubeconfig(dispatchers, worker_access_kubeconfig(
            kind, worker, tokens.reader, WORKER_READER_USER))
        fixtures.store_kubeconfig(api, f"{worker}-kubeconfig", dispatchers,
                                  shipped.dispatcher_namespace)
        kueues = _write_kubeconfig(kind.state_dir / f"{worker}.kueue.kubeconfig",
                                   worker_access_kubeconfig(kind, worker, tokens.kueue,
                                                            kind_kueue.MULTIKUEUE_ACCOUNT))
        fixtures.register_worker(api, worker, kueues, namespace=kind_kueue.NAMESPACE)

