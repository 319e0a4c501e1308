"""Local provider: a manager and N worker control planes as processes on this machine.

All that a later command needs (ports, PIDs, which cluster is stopped) is in
``<state-dir>/state.json``; ``up``, ``status``, ``stop``, ``start`` and ``down`` can each run
in a new process. Bring-up is phased across clusters (every etcd, then every apiserver, then
CRDs, then every controller-manager) so the slow steps overlap instead of adding up, while
every process is still spawned from the calling thread (see ``processes.spawn``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

from clusters import crds, kueue, nodes, processes, state_owner, worker_stack
from clusters.binaries import (
    HARNESS_BINARIES,
    KUBERNETES_VERSION,
    ControlPlaneBinaries,
    find_binaries,
)
from clusters.controlplane import (
    WORKER_PORTS,
    ControlPlane,
    ControlPlaneError,
    components,
    free_port,
    port_is_free,
    wait_until,
)
from clusters.state_dir import lock_state_dir, save_state
from controller_kit.kubeclient import api_client
from trainjob.constants import TRAINER_GROUP

log = logging.getLogger(__name__)

MANAGER = "manager"
BIND_ADDRESS = "127.0.0.1"
# Seconds a cluster's apiserver and controllers get to exit on SIGTERM before SIGKILL.
SERVER_STOP_GRACE = 3.0


class ClusterRecord(BaseModel):
    name: str
    role: Literal["manager", "worker"]
    apiserver_port: int
    etcd_client_port: int
    etcd_peer_port: int
    controller_manager_port: int
    # Ports of a worker's scheduler, JobSet controller and kwok.
    ports: dict[str, int] = Field(default_factory=dict)
    stopped: bool = False
    pids: dict[str, int] = Field(default_factory=dict)
    # Whose TrainJob and runtime CRDs the cluster serves: the project's or upstream
    # Trainer's (``crds.TRAINER_CRD_FLAVOURS``).
    trainer_crds: Literal["project", "upstream"] = crds.PROJECT
    # Kueue's MultiKueue dispatcherName when the cluster runs Kueue (``up --kueue``); None:
    # no Kueue. A manager with Kueue serves Kueue's CRDs instead of the project's
    # MultiKueue ones.
    kueue_dispatcher: str | None = None
    # The job kinds that Kueue manages (Kueue's integration names; ``up --kueue``).
    kueue_integrations: list[str] = Field(default_factory=lambda: list(kueue.INTEGRATIONS))

    @property
    def components(self) -> tuple[str, ...]:
        return components(self.role, self.kueue_dispatcher is not None)


class HarnessState(BaseModel):
    provider: Literal["local"] = "local"
    kubernetes_version: str = KUBERNETES_VERSION
    clusters: list[ClusterRecord] = Field(default_factory=list)


class ClusterInfo(BaseModel):
    """What `up` and `status` report for one cluster."""

    name: str
    role: Literal["manager", "worker"]
    server: str
    kubeconfig: str
    state: Literal["running", "stopped", "degraded", "down"]
    # What is wrong in a degraded cluster: each component not running or not healthy.
    problems: list[str] = Field(default_factory=list)


# What one worker's processes take, measured idle on the local harness (apiserver, etcd,
# controller-manager, scheduler, JobSet controller, kwok; at processes.GO_RUNTIME_DEFAULTS),
# and how many a core can start and run without the load running away.
WORKER_MEMORY_BYTES = 950 * 1024**2
WORKERS_PER_CORE = 4


def check_worker_count(workers: int, max_workers: int | None, limit: tuple[int, str],
                       what: str = "workers") -> None:
    """Refuse more workers than ``limit`` (count, why) allows unless --max-workers says so."""
    count, why = limit
    if workers > (max_workers if max_workers is not None else count):
        raise ValueError(f"--workers {workers}: this machine holds at most {count} {what} "
                         f"({why}); pass --max-workers {workers} to start them anyway")


def machine_worker_limit(per_core: int = WORKERS_PER_CORE,
                         memory_bytes: int = WORKER_MEMORY_BYTES,
                         provider: str = "") -> tuple[int, str]:
    """How many workers this machine can hold, and why: by cores, and by available memory
    after the manager (which takes as much as a worker)."""
    cores = os.cpu_count() or 1
    try:
        meminfo = Path("/proc/meminfo").read_text()
        available = int(next(line.split()[1] for line in meminfo.splitlines()
                             if line.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration, ValueError):
        available = memory_bytes * 64
    by_memory = max(0, (available - memory_bytes) // memory_bytes)
    by_cores = cores * per_core
    why = (f"{provider + ': ' if provider else ''}{cores} cores at {per_core} workers each; "
           f"{available / 1024**3:.1f} GiB available at {memory_bytes // 1024**2} MiB each")
    return int(min(by_memory, by_cores)), why


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT ignored for the duration (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cluster_names(workers: int) -> list[str]:
    return [MANAGER] + [f"worker-{i}" for i in range(1, workers + 1)]


class LocalClusters:
    """The local multi-cluster harness rooted at one state directory.

    ``tied_to_caller`` makes every process die with the calling process (for test sessions);
    without it the clusters keep running after the CLI returns.
    """

    def __init__(self, state_dir: Path | str, *, tied_to_caller: bool = False,
                 binaries: ControlPlaneBinaries | None = None):
        self.state_dir = Path(state_dir).resolve()
        self.tied_to_caller = tied_to_caller
        self._binaries = binaries

    # --- state --------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / state_owner.STATE_FILES[state_owner.LOCAL]

    def load(self) -> HarnessState:
        if not self.state_file.exists():
            return HarnessState()
        return HarnessState.model_validate_json(self.state_file.read_text())

    def _save(self, state: HarnessState) -> None:
        save_state(self.state_file, state)

    def _locked(self):
        return lock_state_dir(self.state_dir)

    def binaries(self) -> ControlPlaneBinaries:
        wanted = set(HARNESS_BINARIES)
        if any(r.kueue_dispatcher is not None for r in self.load().clusters):
            wanted.add(kueue.COMPONENT)
        if self._binaries is None or not wanted <= set(self._binaries.paths):
            self._binaries = find_binaries(build=True, names=sorted(wanted))
        return self._binaries

    def control_plane(self, record: ClusterRecord) -> ControlPlane:
        return ControlPlane(
            name=record.name,
            directory=self.state_dir / record.name,
            kubeconfig_path=self.kubeconfig(record.name),
            bind_address=BIND_ADDRESS,
            apiserver_port=record.apiserver_port,
            etcd_client_port=record.etcd_client_port,
            etcd_peer_port=record.etcd_peer_port,
            controller_manager_port=record.controller_manager_port,
            role=record.role,
            ports=record.ports,
            kueue_dispatcher=record.kueue_dispatcher,
            kueue_integrations=tuple(record.kueue_integrations),
        )

    def issue_serving_certificate(self, name: str, directory: Path,
                                  hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Path:
        """Write ``tls.crt``/``tls.key`` signed by cluster ``name``'s CA into ``directory``
        (for a webhook server the apiserver calls); return the CA file to use as caBundle."""
        import ipaddress

        from clusters.pki import CertificateAuthority, cert_pem, key_pem

        pki = self.control_plane(self._record(self.load(), name)).pki
        ca = CertificateAuthority.load(pki.ca_cert, pki.ca_key)
        ips, dns = [], []
        for host in hosts:
            try:
                ipaddress.ip_address(host)
                ips.append(host)
            except ValueError:
                dns.append(host)
        key, cert = ca.issue("webhook", dns_names=tuple(dns), ip_addresses=tuple(ips),
                             server=True)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tls.crt").write_bytes(cert_pem(cert))
        (directory / "tls.key").write_bytes(key_pem(key))
        (directory / "tls.key").chmod(0o600)
        return pki.ca_cert

    def issue_user_kubeconfig(self, name: str, user: str, groups: tuple[str, ...],
                              path: Path) -> Path:
        """Write a kubeconfig for cluster ``name`` that authenticates as ``user`` in
        ``groups`` (a client certificate from the cluster's CA) to ``path``.

        With ``clusters.pki.service_account_user(ns, sa)`` it is that ServiceAccount to RBAC,
        so Roles and bindings are exercised exactly as shipped."""
        record = self._record(self.load(), name)
        plane = self.control_plane(record)
        config = plane.pki.certificate_authority().user_kubeconfig(
            name, plane.server, user, groups)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    def kubeconfig(self, name: str) -> Path:
        return self.state_dir / f"{name}.kubeconfig"

    def _running(self, record: ClusterRecord, component: str) -> bool:
        return processes.is_harness_process(record.pids.get(component), self.state_dir)

    # --- commands -----------------------------------------------------------------

    def up(self, workers: int = 2, timeout: float = 120,
           node_layout: nodes.NodeLayout | None = None,
           max_workers: int | None = None,
           upstream_crds: tuple[str, ...] = (), kueue_clusters: tuple[str, ...] = (),
           kueue_dispatcher: str = kueue.DISPATCHER_ALL_AT_ONCE,
           kueue_integrations: tuple[str, ...] = kueue.INTEGRATIONS) -> list[ClusterInfo]:
        """Bring up the manager and ``workers`` workers, each worker with the kwok Nodes of
        ``node_layout`` (default: two Nodes of 8 cpu and 32Gi); a no-op for what is up.
        More workers than ``max_workers`` (default: what this machine holds) are refused.
        The clusters named in ``upstream_crds`` serve upstream Trainer's CRDs; those in
        ``kueue_clusters`` run Kueue (MultiKueue dispatcher ``kueue_dispatcher``), managing
        the job kinds of ``kueue_integrations`` (Kueue's integration names, among
        ``kueue.SUPPORTED_INTEGRATIONS``; e.g. ``kueue.MULTIKUEUE_TEAM_INTEGRATIONS``)."""
        if workers < 0:
            raise ValueError("--workers must be 0 or more")
        kueue_integrations = kueue.check_integrations(kueue_integrations)
        for flag, names in (("--upstream-crds", upstream_crds), ("--kueue", kueue_clusters)):
            unknown = sorted(set(names) - set(cluster_names(workers)))
            if unknown:
                raise ValueError(f"{flag} {', '.join(unknown)}: no such cluster; clusters: "
                                 f"{', '.join(cluster_names(workers))}")
        check_worker_count(workers, max_workers, machine_worker_limit())
        node_layout = node_layout if node_layout is not None else nodes.NodeLayout()
        node_layout.check_workers(cluster_names(workers)[1:])
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.LOCAL, "up")
            state = self.load()
            wanted = cluster_names(workers)
            existing = [c.name for c in state.clusters]
            if existing and existing != wanted:
                raise ControlPlaneError(
                    f"{self.state_dir} already holds clusters {existing}; asked for {wanted}. "
                    "Run `python -m clusters down` first, or use another --state-dir."
                )
            if not existing:
                state.clusters = [self._new_record(name) for name in wanted]
                self._save(state)
            for record in state.clusters:
                record.stopped = False  # `up` means every cluster up, stopped ones included
                if record.name in upstream_crds:
                    record.trainer_crds = crds.UPSTREAM
                if record.name in kueue_clusters:
                    record.kueue_dispatcher = kueue_dispatcher
                    record.kueue_integrations = list(kueue_integrations)
                    for port in kueue.PORTS:
                        record.ports.setdefault(port, free_port(BIND_ADDRESS))
            self._save(state)
            was_running = {
                (r.name, c) for r in state.clusters for c in r.components
                if self._running(r, c)
            }
            try:
                deadline = time.monotonic() + timeout
                self._bring_up(state, [c.name for c in state.clusters], timeout)
                self._create_nodes(state, node_layout, deadline - time.monotonic())
            except BaseException:
                # A failed or interrupted `up` takes back what it started; whatever ran
                # before it keeps running. A second Ctrl-C must not cut this short.
                with _interrupts_deferred():
                    kept = {r.pids.get(c) for r in state.clusters for c in r.components
                            if (r.name, c) in was_running}
                    for record in state.clusters:
                        record.pids = {c: pid for c, pid in record.pids.items() if pid in kept}
                    # Every process of this state directory but those: recorded or not yet
                    # (spawned just as the interrupt came).
                    processes.terminate_all(
                        [pid for pid in processes.harness_processes(self.state_dir)
                         if pid not in kept], self.state_dir)
                    self._save(state)
                raise
            return self._info(state)

    def start(self, name: str, timeout: float = 60) -> ClusterInfo:
        """Start a stopped cluster again on the same ports and data."""
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.LOCAL, "start", name)
            state = self.load()
            record = self._record(state, name)
            record.stopped = False
            self._save(state)
            self._bring_up(state, [name], timeout)
            return next(i for i in self._info(state) if i.name == name)

    def use_trainer_crds(self, name: str, flavour: str, timeout: float = 60) -> str:
        """Serve ``flavour``'s TrainJob and runtime CRDs on running cluster ``name`` from now
        on (also across `start`); returns the flavour it served before, once the apiserver
        serves the new schemas. Stored objects stay, read through the new schema."""
        if flavour not in crds.TRAINER_CRD_FLAVOURS:
            raise ValueError(f"unknown Trainer CRD flavour {flavour!r}: "
                             f"use {' or '.join(crds.TRAINER_CRD_FLAVOURS)}")
        with self._locked():
            state = self.load()
            record = self._record(state, name)
            previous, record.trainer_crds = record.trainer_crds, flavour
            self._save(state)
            trainer = [d for d in crds.cluster_crds(record.role, flavour)
                       if d["spec"]["group"] == TRAINER_GROUP]
            with api_client(self.kubeconfig(name)) as api:
                deadline = time.monotonic() + timeout
                crds.install_crds(api, trainer, timeout)
                for document in trainer:
                    crds.wait_schema_served(api, document, max(0.0, deadline - time.monotonic()))
        return previous

    def use_kueue_dispatcher(self, name: str, dispatcher: str, timeout: float = 60) -> str:
        """Restart cluster ``name``'s Kueue with MultiKueue ``dispatcherName``
        ``dispatcher`` (Kueue reads it only at start); returns the one it had."""
        return self._restart_kueue(name, dispatcher, timeout)

    def restart_kueue(self, name: str, timeout: float = 60) -> None:
        """Restart cluster ``name``'s Kueue with its settings unchanged: it starts from what
        is stored, with none of the work it had queued in memory (its rate-limited calls
        to the workers included)."""
        self._restart_kueue(name, None, timeout)

    def _restart_kueue(self, name: str, dispatcher: str | None, timeout: float) -> str:
        with self._locked():
            state = self.load()
            record = self._record(state, name)
            if record.kueue_dispatcher is None:
                raise ControlPlaneError(f"{name} runs no Kueue; start it with "
                                        f"`python -m clusters up --kueue {name}`")
            previous = record.kueue_dispatcher
            record.kueue_dispatcher = dispatcher or previous
            pid = record.pids.pop(kueue.COMPONENT, None)
            if pid:
                processes.terminate(pid, self.state_dir)
            plane = self.control_plane(record)
            with api_client(self.kubeconfig(name)) as api:
                kueue.publish_configuration(api, plane.kueue_configuration())
            try:
                self._spawn(record, plane, kueue.COMPONENT)
            finally:
                self._save(state)
            wait_until(f"{name} {kueue.COMPONENT}", plane.kueue_ready, timeout,
                       alive=functools.partial(self._running, record, kueue.COMPONENT),
                       log_file=plane.log_file(kueue.COMPONENT))
        return previous

    def stop(self, name: str) -> ClusterInfo:
        """Stop one cluster's processes; its etcd data and PKI stay, so objects survive."""
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.LOCAL, "stop", name)
            state = self.load()
            record = self._record(state, name)
            self._terminate(record)
            record.stopped = True
            self._save(state)
            return next(i for i in self._info(state) if i.name == name)

    def down(self) -> bool:
        """Stop every process of this harness and remove what it made; whether the state
        directory is gone (it stays while it holds what another provider made)."""
        with self._locked():
            state_owner.refuse_others(self.state_dir, state_owner.LOCAL, "down")
            state = self.load()
            for record in state.clusters:
                self._terminate(record)
            # Belt and braces: anything else still carrying our state dir on its command line.
            processes.terminate_all(processes.harness_processes(self.state_dir), self.state_dir)
            state_owner.remove_own_files(self.state_dir, state_owner.LOCAL)
        return state_owner.remove_if_emptied(self.state_dir)

    def status(self) -> list[ClusterInfo]:
        return self._info(self.load())

    # --- internals ----------------------------------------------------------------

    def _new_record(self, name: str) -> ClusterRecord:
        role = "manager" if name == MANAGER else "worker"
        return ClusterRecord(
            name=name,
            role=role,
            ports={p: free_port(BIND_ADDRESS) for p in WORKER_PORTS} if role == "worker" else {},
            apiserver_port=free_port(BIND_ADDRESS),
            etcd_client_port=free_port(BIND_ADDRESS),
            etcd_peer_port=free_port(BIND_ADDRESS),
            controller_manager_port=free_port(BIND_ADDRESS),
        )

    @staticmethod
    def _record(state: HarnessState, name: str) -> ClusterRecord:
        for record in state.clusters:
            if record.name == name:
                return record
        known = ", ".join(c.name for c in state.clusters) or "none (run `up` first)"
        raise ControlPlaneError(f"no cluster named {name!r}; clusters: {known}")

    def _terminate(self, record: ClusterRecord) -> None:
        # The controllers and the apiserver go before their etcd. An apiserver with open
        # watches does not exit on SIGTERM until its shutdown timeout; its state is all in
        # etcd, so it is killed after a short grace instead (etcd gets the full one).
        pids = [record.pids.pop(c, None) for c in record.components]
        etcd, rest = pids[0], [pid for pid in pids[1:] if pid]
        processes.terminate_all(rest, self.state_dir, grace=SERVER_STOP_GRACE)
        if etcd:
            processes.terminate(etcd, self.state_dir)

    def _spawn(self, record: ClusterRecord, plane: ControlPlane, component: str) -> None:
        if self._running(record, component):
            return
        port = plane.listen_port(component)
        if not port_is_free(port, BIND_ADDRESS):
            raise ControlPlaneError(
                f"{record.name}: {component} port {BIND_ADDRESS}:{port} is taken by another "
                "process; run `python -m clusters down` and `up` again"
            )
        record.pids[component] = processes.spawn(
            plane.argv(component, self.binaries()),
            plane.log_file(component),
            tied_to_parent=self.tied_to_caller,
        )

    def _bring_up(self, state: HarnessState, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        records = [self._record(state, n) for n in names]
        records = [r for r in records if not r.stopped]
        planes = {r.name: self.control_plane(r) for r in records}
        self.binaries()  # provision (maybe build) before any clock that matters starts
        for plane in planes.values():
            plane.prepare()
        # Phases across clusters: every etcd, every apiserver, the CRDs and webhooks, then
        # every controller at once. Each phase spawns all its processes before it waits, so
        # the start-ups overlap.
        phases = [["etcd"], ["kube-apiserver"], None,
                  ["kube-controller-manager", *worker_stack.WORKER_COMPONENTS, kueue.COMPONENT]]
        try:
            for phase in phases:
                if phase is None:
                    # CRDs before the controller-manager, so the garbage collector's first
                    # discovery already sees TrainJobs and JobSets (it re-discovers only
                    # every 30 s).
                    with ThreadPoolExecutor(max_workers=len(records) or 1) as pool:
                        for future in [pool.submit(self._install_crds, r, planes[r.name],
                                                   deadline - time.monotonic())
                                       for r in records]:
                            future.result()
                    continue
                started = [(r, c) for r in records for c in phase if c in r.components]
                for record, component in started:
                    self._spawn(record, planes[record.name], component)
                self._save(state)
                for record, component in started:
                    plane = planes[record.name]
                    wait_until(
                        f"{record.name} {component}",
                        functools.partial(plane.healthy, component),
                        deadline - time.monotonic(),
                        alive=functools.partial(self._running, record, component),
                        log_file=plane.log_file(component),
                    )
        finally:
            self._save(state)

    def _create_nodes(self, state: HarnessState, layout: nodes.NodeLayout,
                      timeout: float) -> None:
        """Each worker's kwok Nodes, ready for the scheduler before `up` returns."""
        for record in state.clusters:
            if record.role != "worker" or record.stopped:
                continue
            with api_client(self.kubeconfig(record.name)) as api:
                names = nodes.create_nodes(api, record.name, layout.pools_for(record.name))
                nodes.wait_schedulable(api, names, timeout)

    def _install_crds(self, record: ClusterRecord, plane: ControlPlane, timeout: float) -> None:
        with_kueue = record.kueue_dispatcher is not None
        documents = crds.cluster_crds(record.role, record.trainer_crds, with_kueue=with_kueue)
        # Kueue's TrainJob integration owns JobSets, and its JobSet integration manages them:
        # a manager running Kueue serves them too.
        if record.role == "worker" or with_kueue:
            documents += worker_stack.jobset_crds()
        with api_client(self.kubeconfig(record.name)) as client:
            if with_kueue:
                documents += kueue.install(client, plane.kueue_url, kueue.KueueCertificates(
                    plane.kueue_dir / "pki").ensure(), plane.kueue_configuration())
            crds.install_crds(client, documents, timeout)
            if record.role == "worker":
                worker_stack.install_webhook_configurations(
                    client, worker_stack.jobset_webhook_configurations(
                        f"https://{BIND_ADDRESS}:{plane.port('jobset-webhook')}",
                        plane.pki.ca_cert.read_bytes()))

    def _info(self, state: HarnessState) -> list[ClusterInfo]:
        infos = []
        for record in state.clusters:
            plane = self.control_plane(record)
            alive = {c: self._running(record, c) for c in record.components}
            problems = [f"{c} not running (log: {plane.log_file(c)})"
                        for c, up in alive.items() if not up]
            problems += [f"{c} not healthy (log: {plane.log_file(c)})"
                         for c, up in alive.items() if up and not plane.healthy(c)]
            if record.stopped:
                status, problems = "stopped", []
            elif not problems:
                status = "running"
            elif any(alive.values()):
                status = "degraded"
            else:
                status, problems = "down", []
            infos.append(ClusterInfo(
                name=record.name, role=record.role, server=plane.server,
                kubeconfig=str(self.kubeconfig(record.name)), state=status, problems=problems,
            ))
        return infos
