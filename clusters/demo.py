"""``python -m clusters demo``: the whole product on this machine.

Starts a manager and two workers (each with kube-scheduler, the JobSet controller and kwok
Nodes: worker-2's with GPUs), installs the sample runtime, registers the workers on the
manager the MultiKueue way, runs the training operator on each worker and the dispatcher on
the manager (as real processes), submits the sample TrainJobs to the manager and shows live
where each was placed and its mirrored status until all are done. The jobs are of mixed
sizes and the workers small enough that some wait on the manager until room frees up; their
pods are really scheduled onto the kwok Nodes, run for ``--run-seconds`` and succeed.

Ctrl-C stops everything, clusters included. A demo that ran to the end stops its
processes and leaves the clusters up for a look around (``make demo-down`` removes them).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, nodes, worker_stack
from clusters.crds import manifests_dir
from clusters.local import LocalClusters
from clusters.testing import ServiceProcess
from controller_kit.kubeclient import api_client
from dispatcher.job_state import job_state
from trainjob import constants as c

NODE_LAYOUT = nodes.NodeLayout(default=[], workers={
    "worker-1": [nodes.NodePool(count=2, resources={"cpu": "12", "memory": "48Gi"})],
    "worker-2": [nodes.NodePool(count=2, resources={"cpu": "16", "memory": "64Gi",
                                                    nodes.GPU: "4"})],
})
WORKERS = ("worker-1", "worker-2")
CONFIG = "demo"


def _samples(run_seconds: float) -> tuple[dict, list[dict]]:
    folder = manifests_dir() / "samples"
    runtime = yaml.safe_load((folder / "runtime-torch-distributed.yaml").read_text())
    # How long kwok runs each pod before it succeeds.
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]
        pod.setdefault("metadata", {}).setdefault("annotations", {})[
            worker_stack.RUN_FOR_ANNOTATION] = f"{run_seconds:g}s"
    jobs = [yaml.safe_load((folder / name).read_text())
            for name in yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]]
    return runtime, jobs


def _state(job: dict) -> str:
    if (job.get("spec") or {}).get("managedBy") != c.MANAGED_BY_MULTIKUEUE:
        return "not dispatched (managedBy unset)"
    state = job_state(job)
    if state.startswith("Pending"):
        placed = next((x for x in job["status"]["conditions"] if x["type"] == "Placed"), {})
        return f"Pending: {placed.get('message', '')}"
    return state


def _table(jobs: list[dict]) -> str:
    rows = [("TRAINJOB", "WORKER", "STATE", "PODS ACTIVE/SUCCEEDED")]
    for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        status = (job.get("status") or {}).get("jobsStatus") or []
        pods = (f"{sum(j.get('active', 0) for j in status)}/"
                f"{sum(j.get('succeeded', 0) for j in status)}")
        worker = (job["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION, "-")
        rows.append((f"{job['metadata']['namespace']}/{job['metadata']['name']}", worker,
                     _state(job)[:90], pods))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_demo(state_dir: Path, run_seconds: float = 15.0, timeout: float = 300) -> int:
    # Ctrl-C and SIGTERM both stop the demo cleanly (explicit handlers also cover a demo
    # started in the background, where the shell leaves SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    harness = LocalClusters(state_dir)
    print("starting a manager and two worker clusters ...", flush=True)
    harness.up(workers=2, node_layout=NODE_LAYOUT)
    processes: list[ServiceProcess] = []
    finished = False
    try:
        manager = api_client(harness.kubeconfig("manager"))
        runtime, samples = _samples(run_seconds)
        for worker in WORKERS:
            fixtures.install_runtime(api_client(harness.kubeconfig(worker)), runtime)
            fixtures.register_worker(manager, worker, harness.kubeconfig(worker))
        fixtures.register_config(manager, CONFIG, list(WORKERS))
        logs = state_dir / "demo-logs"
        logs.mkdir(parents=True, exist_ok=True)
        print("starting the training operator on each worker and the dispatcher ...",
              flush=True)
        for worker in WORKERS:
            processes.append(ServiceProcess("training_operator", harness.kubeconfig(worker),
                                            logs / f"operator-{worker}.log", ()).start())
        dispatcher = ServiceProcess("dispatcher", harness.kubeconfig("manager"),
                                    logs / "dispatcher.log", ("--multikueue-config", CONFIG))
        processes.append(dispatcher.start())
        custom = client.CustomObjectsApi(manager)
        names = []
        for job in samples:
            name = job["metadata"]["name"]
            names.append(name)
            _replace(custom, job)
        print(f"submitted {len(names)} sample TrainJobs to the manager; dispatcher metrics "
              f"at http://127.0.0.1:{dispatcher.metrics_port}/metrics", flush=True)
        print(f"dashboard (while the demo runs): http://127.0.0.1:{dispatcher.metrics_port}/\n",
              flush=True)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            jobs = [j for j in custom.list_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, "default", c.TRAINJOBS)["items"]
                if j["metadata"]["name"] in names]
            table = _table(jobs)
            if table != last:
                print(time.strftime("%H:%M:%S"), "\n" + table + "\n", flush=True)
                last = table
            ours = [j for j in jobs if (j.get("spec") or {}).get("managedBy") ==
                    c.MANAGED_BY_MULTIKUEUE]
            if ours and all(_state(j) in c.FINISHED_CONDITIONS
                            for j in ours):
                finished = True
                break
            time.sleep(0.5)  # refresh rate of the live table
        if not finished:
            print(f"not all jobs finished within {timeout:.0f}s; logs in {logs}", file=sys.stderr)
            return 1
        print("all multicluster jobs are done. The clusters stay up: try\n"
              f"  kubectl --kubeconfig {harness.kubeconfig('manager')} get trainjobs,"
              "multikueueclusters\n"
              f"  kubectl --kubeconfig {harness.kubeconfig('worker-2')} get trainjobs,jobsets -A\n"
              "and remove them with `make demo-down`.")
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr)
        return 130
    finally:
        for process in reversed(processes):
            process.stop()
        if not finished:
            harness.down()


def _replace(custom: client.CustomObjectsApi, job: dict) -> None:
    """Submit ``job`` afresh (a rerun of the demo replaces the earlier run's job)."""
    name = job["metadata"]["name"]
    try:
        custom.delete_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, "default",
                                               c.TRAINJOBS, name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            custom.get_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, "default",
                                                c.TRAINJOBS, name)
            time.sleep(0.2)  # waiting for the earlier run's job (and its finalizer) to go
    except ApiException as err:
        if err.status != 404:
            raise
    custom.create_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, "default",
                                           c.TRAINJOBS, job)
