"""kind provider: the same manager + workers layout as kind clusters in the Docker engine
(``clusters.engine``), from the node image built on this machine (``clusters.kind_node``,
``kindest/node:v1.34.4``; built first when missing). No registry is reached: every image a
cluster runs is in the engine and ``kind load``-ed.

  python -m clusters up --provider kind --workers 2 [--nodes N] [--nodes-file F]
  python -m clusters status|stop NAME|start NAME|down --provider kind

Each cluster is kind cluster ``<prefix><name>`` (prefix ``trainjob-`` by default; tests use
their own, so a developer's clusters and a test session's never meet). Its nodes sit on a
Docker network of the same prefix (``<prefix>kind``, through kind's
KIND_EXPERIMENTAL_DOCKER_NETWORK), not kind's shared ``kind`` network: the project then owns
every container, volume and network it makes, and ``down`` removes them all while leaving
other kind clusters (and their ``kind`` network) alone.

Two kubeconfigs per cluster are written: ``<name>.kubeconfig`` for the host (the API server
published on 127.0.0.1), and ``<name>.internal.kubeconfig`` addressing the control-plane
container by name on that network, which is what a dispatcher running *inside* the manager
cluster needs in its MultiKueueCluster Secrets. kind's own kubeconfig edits go to the state
directory, never to ~/.kube/config.

The manager is one control-plane node. A worker is a control-plane node, which runs JobSet's
controller (``clusters.kind.jobset``), plus one kind worker node per Node of the layout (``up
--nodes N``: N; --nodes-file: labels and taints too; resources are refused, see
``clusters.kind.config``). `up` returns when every Node is Ready, the project's CRDs are
Established and, on workers, JobSet's controller is Available and its webhooks answer.

``up --kueue NAME`` (repeatable) installs Kueue from its release manifests on those clusters
(``clusters.kind.kueue``; a manager running it also gets JobSet's CRD, which Kueue's TrainJob
integration watches) and returns once Kueue's Deployment is rolled out and its webhooks
admit a Kueue object.

stop/start are ``docker stop``/``docker start`` of a cluster's node containers; etcd's data
and the loaded images live in each node's ``/var`` volume, so objects survive. What a later
command needs (prefix, network, which cluster is stopped) is in ``<state-dir>/kind-state.json``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import yaml
from kubernetes import client
from pydantic import BaseModel, Field

from clusters import binaries, crds, images, kind_node, local, nodes, state_owner, worker_stack
from clusters import kueue as local_kueue
from clusters.controlplane import ControlPlaneError
from clusters.engine import Engine, ensure_engine, find_engine
from clusters.kind import config as kind_config
from clusters.kind import jobset, kueue
from clusters.local import ClusterInfo, cluster_names
from clusters.state_dir import lock_state_dir, save_state
from controller_kit.kubeclient import api_client

log = logging.getLogger(__name__)

NODE_IMAGE = kind_node.NODE_IMAGE
PREFIX = "trainjob-"
# kind's labels on its node containers.
CLUSTER_LABEL = "io.x-k8s.kind.cluster"
ROLE_LABEL = "io.x-k8s.kind.role"
STATE_FILE = state_owner.STATE_FILES[state_owner.KIND]
GO_RUNTIME_FILES = "go-runtime" + state_owner.KIND_MOUNTS_SUFFIX

# Measured idle on a 2-core, 24 GiB machine (docker stats, 3 clusters up): a worker cluster
# of a control plane and two kind worker nodes, with JobSet, takes about 0.9 GiB (control
# plane 0.6-0.75, each worker node 0.12), the manager about 0.55 GiB; each control plane
# idles at 10-15 % of a core, each worker node at about 1 %. Two workers per core keeps
# the apiservers answering on a small machine.
KIND_WORKER_MEMORY_BYTES = 1024**3
KIND_WORKERS_PER_CORE = 2


class KindRecord(BaseModel):
    name: str
    role: Literal["manager", "worker"]
    stopped: bool = False
    trainer_crds: Literal["project", "upstream"] = crds.PROJECT
    # kind worker nodes (the manager has none).
    worker_nodes: int = 0
    # Kueue's MultiKueue dispatcherName when the cluster runs Kueue (``up --kueue``); None:
    # no Kueue.
    kueue_dispatcher: str | None = None
    # The job kinds Kueue manages there (Kueue's integration names; ``up --kueue``).
    kueue_integrations: list[str] = Field(default_factory=lambda: list(local_kueue.INTEGRATIONS))


class KindState(BaseModel):
    provider: Literal["kind"] = "kind"
    prefix: str = PREFIX
    node_image: str = NODE_IMAGE
    clusters: list[KindRecord] = Field(default_factory=list)

    @property
    def network(self) -> str:
        return f"{self.prefix}kind"


def machine_worker_limit() -> tuple[int, str]:
    """How many kind workers this machine holds, and why (cores, available memory)."""
    return local.machine_worker_limit(KIND_WORKERS_PER_CORE, KIND_WORKER_MEMORY_BYTES, "kind")


def _readyz(api: client.ApiClient) -> str | None:
    """Why the API server is not ready (None when its /readyz answers ok)."""
    try:
        method, url, headers, _, _ = api.param_serialize("GET", "/readyz")
        response = api.call_api(method, url, header_params=headers, _request_timeout=(3, 5))
        response.read()
        text = response.data.decode(errors="replace").strip()
    except Exception as err:  # noqa: BLE001 - the error is the answer
        return f"kube-apiserver {api.configuration.host} not ready: {type(err).__name__}"
    if response.status == 200 and text == "ok":
        return None
    return f"kube-apiserver /readyz answered {response.status}: {text[:200]}"


# kind's known issue on hosts with many nodes: every node's systemd, journald, containerd and
# kubelet take inotify instances from the host's per-user limit (root's, shared by all
# containers). At Debian's default of 128, the third cluster's nodes fail with "too many
# open files" and `kubeadm join` hangs. kind's documentation recommends these values.
INOTIFY_LIMITS = {"max_user_instances": 512, "max_user_watches": 524288}


def ensure_inotify_limits() -> None:
    """Raise the host's inotify limits to kind's recommended values (as root), or refuse
    with the command that does it."""
    for key, wanted in INOTIFY_LIMITS.items():
        path = Path("/proc/sys/fs/inotify") / key
        try:
            current = int(path.read_text())
        except (OSError, ValueError):
            continue  # not Linux, or not visible: kind will say what it lacks
        if current >= wanted:
            continue
        try:
            path.write_text(f"{wanted}\n")
        except OSError:
            raise ControlPlaneError(
                f"fs.inotify.{key} is {current}; kind nodes need {wanted} or more (kind's "
                f"known issue: \"too many open files\"). Run `sysctl -w "
                f"fs.inotify.{key}={wanted}` as root, then `up` again") from None
        log.warning("raised fs.inotify.%s from %d to %d for kind's nodes", key, current, wanted)


def _deadline_left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


class KindClusters:
    """kind clusters of one state directory (see the module doc).

    ``prefix`` names the kind clusters and their network; it is recorded at the first `up`
    and later commands read it from the state directory."""

    def __init__(self, state_dir: Path | str, *, prefix: str | None = None,
                 engine: Engine | None = None):
        self.state_dir = Path(state_dir).resolve()
        self._prefix = prefix
        self._engine = engine

    # --- state --------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def load(self) -> KindState:
        if self.state_file.exists():
            state = KindState.model_validate_json(self.state_file.read_text())
            if self._prefix is not None and self._prefix != state.prefix:
                raise ControlPlaneError(
                    f"{self.state_dir} holds kind clusters prefixed {state.prefix!r}, not "
                    f"{self._prefix!r}")
            return state
        return KindState(prefix=self._prefix if self._prefix is not None else PREFIX)

    def _save(self, state: KindState) -> None:
        save_state(self.state_file, state)

    def _locked(self):
        return lock_state_dir(self.state_dir)

    @property
    def prefix(self) -> str:
        return self.load().prefix

    def cluster_name(self, name: str) -> str:
        """The kind cluster's name of harness cluster ``name``."""
        return self.prefix + name

    def kubeconfig(self, name: str) -> Path:
        return self.state_dir / f"{name}.kubeconfig"

    def internal_kubeconfig(self, name: str) -> Path:
        return self.state_dir / f"{name}.internal.kubeconfig"

    # --- engine and kind ------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = ensure_engine()
        return self._engine

    def _kind(self, state: KindState, *args: str, timeout: float | None = None) -> str:
        kind = binaries.find_binaries(names=["kind"]).paths["kind"]
        env = {**self.engine.env(), "KIND_EXPERIMENTAL_DOCKER_NETWORK": state.network}
        argv = [str(kind), *args]
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"`kind {' '.join(args)}` did not finish within "
                               f"{timeout:.0f}s") from None
        if proc.returncode != 0:
            raise ControlPlaneError(f"`kind {' '.join(args)}` failed (exit {proc.returncode}):"
                                    f" {(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc.stdout

    def _kind_clusters(self, state: KindState) -> set[str]:
        return set(self._kind(state, "get", "clusters").split())

    def containers(self, name: str, state: KindState | None = None,
                   engine: Engine | None = None) -> dict[str, str]:
        """Node container -> its state (running, exited, ...) of cluster ``name``, the
        control plane first."""
        state = state or self.load()
        engine = engine or self.engine
        out = engine.docker("ps", "-a", "--filter",
                            f"label={CLUSTER_LABEL}={state.prefix}{name}",
                            "--format", f'{{{{.Names}}}}\t{{{{.State}}}}\t'
                            f'{{{{.Label "{ROLE_LABEL}"}}}}').stdout.decode()
        rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        rows.sort(key=lambda r: (r[2] != "control-plane", r[0]))
        return {r[0]: r[1] for r in rows}

    def load_images(self, name: str, names: tuple[str, ...] | list[str],
                    nodes_only: tuple[str, ...] = (), timeout: float = 300) -> None:
        """``kind load docker-image`` ``names`` (images in the engine) into cluster
        ``name``'s nodes (all, or the node containers in ``nodes_only``)."""
        state = self.load()
        self._record(state, name)
        missing = [n for n in names if not images.image_exists(self.engine, n)]
        if missing:
            raise ControlPlaneError(f"image(s) {', '.join(missing)} not in the engine "
                                    f"({self.engine.host}): build them with `python -m "
                                    "clusters images`")
        args = ["load", "docker-image", *names, "--name", state.prefix + name]
        if nodes_only:
            args += ["--nodes", ",".join(nodes_only)]
        self._kind(state, *args, timeout=timeout)

    # --- commands -----------------------------------------------------------------

    def up(self, workers: int = 2, timeout: float = 300,
           node_layout: nodes.NodeLayout | None = None,
           max_workers: int | None = None,
           upstream_crds: tuple[str, ...] = (), kueue_clusters: tuple[str, ...] = (),
           kueue_dispatcher: str = local_kueue.DISPATCHER_ALL_AT_ONCE,
           kueue_integrations: tuple[str, ...] = local_kueue.INTEGRATIONS) -> list[ClusterInfo]:
        """Bring up the manager and ``workers`` workers as kind clusters, each worker with a
        kind worker node per Node of ``node_layout`` (default: two); a no-op for what is
        up, and stopped clusters are started. More workers than ``max_workers`` (default:
        what this machine holds) are refused, as are layouts asking for Node resources.
        ``kueue_clusters`` run Kueue from its release (``clusters.kind.kueue``), with
        MultiKueue dispatcher ``kueue_dispatcher`` and the integrations
        ``kueue_integrations``."""
        if workers < 0:
            raise ValueError("--workers must be 0 or more")
        wanted = cluster_names(workers)
        kueue_integrations = local_kueue.check_integrations(kueue_integrations)
        for flag, names in (("--upstream-crds", upstream_crds), ("--kueue", kueue_clusters)):
            unknown = sorted(set(names) - set(wanted))
            if unknown:
                raise ValueError(f"{flag} {', '.join(unknown)}: no such cluster; "
                                 f"clusters: {', '.join(wanted)}")
        local.check_worker_count(workers, max_workers, machine_worker_limit(), "kind workers")
        node_layout = node_layout if node_layout is not None else nodes.NodeLayout()
        node_layout.check_workers(wanted[1:])
        kind_config.refuse_resources(node_layout)
        deadline = time.monotonic() + timeout
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.KIND, "up")
            state = self.load()
            existing = [c.name for c in state.clusters]
            if existing and existing != wanted:
                raise ControlPlaneError(
                    f"{self.state_dir} already holds kind clusters {existing}; asked for "
                    f"{wanted}. Run `python -m clusters down --provider kind` first, or use "
                    "another --state-dir.")
            engine = self.engine
            ensure_inotify_limits()
            self._ensure_images(engine, with_kueue=bool(kueue_clusters) or any(
                r.kueue_dispatcher is not None for r in state.clusters))
            known = self._kind_clusters(state)
            if not existing:
                taken = sorted(state.prefix + n for n in wanted if state.prefix + n in known)
                if taken:
                    raise ControlPlaneError(
                        f"kind cluster(s) {', '.join(taken)} already exist and are not "
                        f"{self.state_dir}'s: remove them (`kind delete cluster --name "
                        f"{taken[0]}`) or bring them down from the state directory that made "
                        "them")
                state.clusters = [KindRecord(
                    name=n, role="manager" if n == "manager" else "worker",
                    worker_nodes=0 if n == "manager" else
                    kind_config.node_count(node_layout.pools_for(n))) for n in wanted]
            configs = {}
            go_runtime = kind_config.write_go_runtime_files(self.state_dir / GO_RUNTIME_FILES)
            for record in state.clusters:
                pools = node_layout.pools_for(record.name) if record.role == "worker" else []
                configs[record.name] = kind_config.cluster_config(record.role, pools, go_runtime)
                made = self.state_dir / f"{record.name}.kind.yaml"
                if (state.prefix + record.name in known and made.is_file()
                        and kind_config.nodes_asked(yaml.safe_load(made.read_text()))
                        != kind_config.nodes_asked(configs[record.name])):
                    raise ValueError(
                        f"{record.name}: its kind nodes were made from {made}, and the Node "
                        "flags (--nodes, --nodes-file) now ask for others; kind cannot add, "
                        "remove or relabel a cluster's nodes. Repeat the flags it was made "
                        "with, or `python -m clusters down --provider kind` first")
            for record in state.clusters:
                record.stopped = False
                if record.name in upstream_crds:
                    record.trainer_crds = crds.UPSTREAM
                if record.name in kueue_clusters:
                    record.kueue_dispatcher = kueue_dispatcher
                    record.kueue_integrations = list(kueue_integrations)
            self._save(state)
            with ThreadPoolExecutor(max_workers=len(state.clusters)) as pool:
                futures = [pool.submit(self._bring_up, state, record, configs[record.name],
                                       state.prefix + record.name in known, deadline)
                           for record in state.clusters]
                errors = []
                for future in futures:
                    try:
                        future.result()
                    except Exception as err:  # noqa: BLE001 - all of them are reported
                        errors.append(err)
            if errors:
                # What was made stays: `up` again resumes it, `down` removes it.
                raise ControlPlaneError(
                    "; ".join(str(e) for e in errors) + " (the kind clusters made so far "
                    "stay: `python -m clusters up --provider kind` again resumes, `python -m "
                    "clusters down --provider kind` removes them)") from errors[0]
            return self._info(state, engine)

    def _ensure_images(self, engine: Engine, with_kueue: bool = False) -> None:
        """The node image and JobSet's image (and Kueue's, ``with_kueue``) in the engine,
        built here when missing."""
        if not images.image_exists(engine, NODE_IMAGE):
            log.info("building the kind node image %s", NODE_IMAGE)
            try:
                kind_node.build_node_image(engine)
            except kind_node.KindNodeError as err:
                raise ControlPlaneError(f"building the kind node image {NODE_IMAGE} "
                                        f"(`python -m clusters.kind_node`) failed: {err}"
                                        ) from err
        if not images.image_exists(engine, jobset.IMAGE):
            log.info("building %s", jobset.IMAGE)
            images.build_images(engine, only=("jobset-controller",))
        if with_kueue and not images.image_exists(engine, kueue.IMAGE):
            log.info("building %s", kueue.IMAGE)
            images.build_images(engine, only=(kueue.COMPONENT,))

    def _bring_up(self, state: KindState, record: KindRecord, config: dict, exists: bool,
                  deadline: float) -> None:
        name = record.name
        cluster = state.prefix + name
        config_file = self.state_dir / f"{name}.kind.yaml"
        if not exists:
            config_file.write_text(yaml.safe_dump(config, sort_keys=False))
            started = time.monotonic()
            self._kind(state, "create", "cluster", "--name", cluster, "--image",
                       state.node_image, "--config", str(config_file), "--kubeconfig",
                       str(self.kubeconfig(name)), "--wait", "0s",
                       timeout=_deadline_left(deadline))
            log.info("%s: kind create cluster took %.1fs", cluster, time.monotonic() - started)
        else:
            stopped = [c for c, s in self.containers(name, state).items() if s != "running"]
            if stopped:
                self.engine.docker("start", *stopped)
        self._write_kubeconfigs(state, name)
        with_kueue = record.kueue_dispatcher is not None
        with api_client(self.kubeconfig(name)) as api:
            self._wait_apiserver(api, name, deadline)
            # A manager running Kueue gets Kueue's MultiKueue CRDs from Kueue's release, and
            # JobSet's CRD, which Kueue's TrainJob integration watches (workers have JobSet).
            documents = crds.cluster_crds(record.role, record.trainer_crds,
                                          with_kueue=with_kueue)
            if with_kueue and record.role == "manager":
                documents += worker_stack.jobset_crds()
            crds.install_crds(api, documents, _deadline_left(deadline))
            control_plane = next(iter(self.containers(name, state)))
            if record.role == "worker":
                self.load_images(name, [jobset.IMAGE], nodes_only=(control_plane,),
                                 timeout=_deadline_left(deadline))
                jobset.install(self.kubeconfig(name))
            self._wait_nodes_ready(api, name, 1 + record.worker_nodes, deadline)
            if record.role == "worker":
                jobset.wait_ready(api, name, _deadline_left(deadline))
            if with_kueue:
                # After JobSet's controller is up: Kueue's pod webhook (failurePolicy Fail)
                # would otherwise hold JobSet's Pods back until Kueue answers.
                self.load_images(name, [kueue.IMAGE], nodes_only=(control_plane,),
                                 timeout=_deadline_left(deadline))
                kueue.install(self.kubeconfig(name), self.state_dir / f"{name}.kueue-pki",
                              record.kueue_dispatcher, tuple(record.kueue_integrations))
                kueue.wait_ready(api, name, _deadline_left(deadline))

    def _write_kubeconfigs(self, state: KindState, name: str) -> None:
        cluster = state.prefix + name
        for path, extra in ((self.kubeconfig(name), ()),
                            (self.internal_kubeconfig(name), ("--internal",))):
            text = self._kind(state, "get", "kubeconfig", "--name", cluster, *extra)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o600)
            tmp.replace(path)

    @staticmethod
    def _wait_apiserver(api: client.ApiClient, name: str, deadline: float) -> None:
        while True:
            problem = _readyz(api)
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{name}: {problem}")
            time.sleep(0.5)

    @staticmethod
    def _wait_nodes_ready(api: client.ApiClient, name: str, count: int,
                          deadline: float) -> None:
        core = client.CoreV1Api(api)
        while True:
            try:
                listed = core.list_node().items
                problems = [p for p in map(nodes.schedulable_problem, listed) if p]
                if len(listed) < count:
                    problems.append(f"{len(listed)} of {count} Nodes registered")
            except Exception as err:  # noqa: BLE001 - an apiserver coming back
                problems = [f"{type(err).__name__}: {err}"[:300]]
            if not problems:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{name}: Nodes not Ready: {'; '.join(problems[:3])}")
            time.sleep(0.5)

    def status(self) -> list[ClusterInfo]:
        state = self.load()
        return self._info(state, find_engine() if state.clusters else None)

    def stop(self, name: str) -> ClusterInfo:
        """``docker stop`` every node of cluster ``name``; its /var volumes (etcd, images)
        stay, so objects survive."""
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.KIND, "stop", name)
            state = self.load()
            record = self._record(state, name)
            running = [c for c, s in self.containers(name, state).items() if s == "running"]
            if running:
                self.engine.docker("stop", *running)
            record.stopped = True
            self._save(state)
            return next(i for i in self._info(state, self.engine) if i.name == name)

    def start(self, name: str, timeout: float = 300,
              progress: Callable[[str], None] = binaries.stderr_progress) -> ClusterInfo:
        """``docker start`` cluster ``name``'s nodes (the control plane first); return when
        its API server answers and its Nodes (and, on a worker, JobSet) are ready again,
        saying on ``progress`` what it waits for. A restarted node starts its kubelet and
        every Pod again, the product's too where it is deployed: minutes, not seconds."""
        deadline = time.monotonic() + timeout
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.KIND, "start", name)
            state = self.load()
            record = self._record(state, name)
            containers = self.containers(name, state)
            ensure_inotify_limits()
            if not containers:
                raise ControlPlaneError(f"{name}: kind cluster {state.prefix}{name} has no "
                                        "node containers; run `up` again")
            stopped = [c for c, s in containers.items() if s != "running"]
            if stopped:
                self.engine.docker("start", *stopped)
            record.stopped = False
            self._save(state)
            # kind publishes the API server on a fixed host port, but a restarted node may
            # get another address on the network: the kubeconfigs are written again.
            self._write_kubeconfigs(state, name)
            with api_client(self.kubeconfig(name)) as api:
                progress(f"{name}: waiting for its API server (up to {timeout:.0f} s in all)")
                self._wait_apiserver(api, name, deadline)
                progress(f"{name}: waiting for its {1 + record.worker_nodes} Nodes to be Ready")
                self._wait_nodes_ready(api, name, 1 + record.worker_nodes, deadline)
                if record.role == "worker":
                    progress(f"{name}: waiting for JobSet's controller and its webhook")
                    jobset.wait_ready(api, name, _deadline_left(deadline))
                if record.kueue_dispatcher is not None:
                    progress(f"{name}: waiting for Kueue's controller and its webhooks")
                    kueue.wait_ready(api, name, _deadline_left(deadline))
            return next(i for i in self._info(state, self.engine) if i.name == name)

    def down(self) -> bool:
        """Delete every kind cluster of this state directory (containers and their
        volumes), its Docker network, and the files kind made there; whether the state
        directory is gone (it stays while it holds what another provider made)."""
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.KIND, "down")
            state = self.load()
            if state.clusters:
                engine = self.engine
                known = self._kind_clusters(state)
                ours = [r for r in state.clusters if state.prefix + r.name in known]
                with ThreadPoolExecutor(max_workers=max(1, len(ours))) as pool:
                    for future in [pool.submit(
                            self._kind, state, "delete", "cluster", "--name",
                            state.prefix + r.name, "--kubeconfig", str(self.kubeconfig(r.name)),
                            timeout=300) for r in ours]:
                        future.result()
                self._remove_network(engine, state.network)
            state_owner.remove_own_files(self.state_dir, state_owner.KIND)
        return state_owner.remove_if_emptied(self.state_dir)

    @staticmethod
    def _remove_network(engine: Engine, network: str) -> None:
        """The clusters' network, unless a container not of these clusters still uses it
        (then it stays, and the log says which)."""
        inspected = engine.docker("network", "inspect", network, check=False)
        if inspected.returncode != 0:
            return
        attached = [c.get("Name") for c in
                    (json.loads(inspected.stdout)[0].get("Containers") or {}).values()]
        if attached:
            log.warning("network %s kept: still used by %s", network, ", ".join(attached))
            return
        engine.docker("network", "rm", network)

    # --- internals ----------------------------------------------------------------

    @staticmethod
    def _record(state: KindState, name: str) -> KindRecord:
        for record in state.clusters:
            if record.name == name:
                return record
        known = ", ".join(c.name for c in state.clusters) or "none (run `up` first)"
        raise ControlPlaneError(f"no kind cluster named {name!r}; clusters: {known}")

    def _server(self, name: str) -> str:
        try:
            config = yaml.safe_load(self.kubeconfig(name).read_text())
            return config["clusters"][0]["cluster"]["server"]
        except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
            return ""

    def _readyz(self, name: str) -> str | None:
        """Why the cluster's API server is not ready (None when /readyz says ok)."""
        try:
            with api_client(self.kubeconfig(name), request_timeout=3) as api:
                return _readyz(api)
        except Exception as err:  # noqa: BLE001 - reported as the problem
            return f"kubeconfig {self.kubeconfig(name)}: {type(err).__name__}: {err}"[:300]

    def _info(self, state: KindState, engine: Engine | None) -> list[ClusterInfo]:
        infos = []
        for record in state.clusters:
            if engine is None:
                containers, problems = {}, ["no Docker engine answers"]
            else:
                containers, problems = self.containers(record.name, state, engine), []
            running = [c for c, s in containers.items() if s == "running"]
            if record.stopped and not running:
                status, problems = "stopped", []
            elif containers and len(running) == len(containers):
                problem = self._readyz(record.name)
                status, problems = ("running", []) if problem is None else ("degraded",
                                                                             [problem])
            elif running:
                status = "degraded"
                problems = [f"node container {c} is {s}" for c, s in containers.items()
                            if s != "running"]
            else:
                status = "down"
                if engine is not None and not containers:
                    problems = [f"kind cluster {state.prefix}{record.name} has no node "
                                "containers (deleted outside the harness?)"]
            infos.append(ClusterInfo(
                name=record.name, role=record.role, server=self._server(record.name),
                kubeconfig=str(self.kubeconfig(record.name)), state=status,
                problems=problems))
        return infos
