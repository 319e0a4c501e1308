"""``python -m clusters``: local multi-cluster Kubernetes for development, tests and the demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from clusters import binaries, crds, nodes, state_owner
from clusters.controlplane import ControlPlaneError
from clusters.engine import EngineError
from clusters.images import IMAGE_NAMES
from clusters.local import ClusterInfo, LocalClusters, cluster_names
from controller_kit import command_line

DESCRIPTION = """\
Run one manager and N worker Kubernetes clusters on this machine.

The local provider (the default) starts, per cluster, etcd, kube-apiserver and
kube-controller-manager as processes on 127.0.0.1, installs the project's CRDs and writes an
admin kubeconfig per cluster, with the certificates embedded, to <state-dir>/<name>.kubeconfig.
Each worker also runs kube-scheduler, the upstream JobSet controller (its CRD and webhooks
included) and kwok, which keeps the worker's Nodes Ready and plays the kubelet: a scheduled
pod runs at once and succeeds 3 s later (pod annotations trainjob-dispatcher.io/kwok-run-for:
"30s" and trainjob-dispatcher.io/kwok-outcome: fail|never change that). The binaries are
built once from Go modules into a cache (see `provision`). The kind provider does the same
with Docker.
"""

EPILOG = """\
environment:
  CLUSTERS_STATE_DIR        default for --state-dir (else ./.clusters)
  CLUSTERS_CACHE_DIR        where built binaries are cached (else ~/.cache/trainjob-dispatcher)
  KUBEBUILDER_ASSETS        a setup-envtest directory holding etcd and kube-apiserver
  TEST_ASSET_ETCD, TEST_ASSET_KUBE_APISERVER, TEST_ASSET_KUBE_CONTROLLER_MANAGER,
  TEST_ASSET_KUBE_SCHEDULER, TEST_ASSET_KUBECTL, TEST_ASSET_JOBSET, TEST_ASSET_KWOK,
  TEST_ASSET_TRAINER, TEST_ASSET_KUEUE
                            explicit paths to existing binaries

examples:
  python -m clusters up --workers 2
  python -m clusters up --nodes 4 --node-cpu 16 --node-gpus 8
  python -m clusters up --nodes-file nodes.yaml   (format: see clusters/nodes.py)
  python -m clusters up --upstream-crds worker-2  (upstream Trainer's CRDs on worker-2)
  kubectl --kubeconfig .clusters/worker-1.kubeconfig get --raw /version
  python -m clusters stop worker-1 && python -m clusters start worker-1
  python -m clusters conformance -v            (this operator against upstream Trainer)
  python -m clusters down
"""


# The local provider's kwok Nodes when --node-cpu / --node-memory are not given.
NODE_CPU = "8"
NODE_MEMORY = "32Gi"


def _default_state_dir() -> str:
    return os.environ.get("CLUSTERS_STATE_DIR", ".clusters")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clusters", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=_default_state_dir(),
                        help="where state, logs and kubeconfigs live (default: %(default)s)")
    common.add_argument("--provider", choices=("local", "kind"), default="local",
                        help="local processes (default) or kind clusters in Docker")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", parents=[common], help="start the clusters (no-op when up)",
                        description="Start manager and workers; return when every apiserver "
                        "answers /readyz and the CRDs are Established. Safe to repeat.")
    up.add_argument("--workers", type=int, default=2, help="number of worker clusters "
                    "(default: %(default)s)")
    up.add_argument("--timeout", type=float, default=180,
                    help="seconds to wait for readiness (default: %(default)s)")
    up.add_argument("--max-workers", type=int, metavar="N",
                    help="allow up to N workers (default: what this machine holds: 4 per "
                    "core, about 950 MiB of available memory each)")
    up.add_argument("--upstream-crds", action="append", default=[], metavar="NAME",
                    help="this cluster serves upstream Kubeflow Trainer's TrainJob and runtime "
                    "CRDs (read from the Trainer module) instead of the project's; repeatable")
    up.add_argument("--kueue", action="append", default=[], metavar="NAME",
                    help="this cluster runs Kueue (its CRDs, webhooks and controller, read "
                    "from the Kueue module; only the TrainJob integration); a manager with "
                    "Kueue serves Kueue's MultiKueue CRDs instead of the project's; "
                    "repeatable. Local provider: Kueue as a process beside the cluster; kind: "
                    "Kueue's release manifests, its Deployment running the image built here")
    up.add_argument("--kueue-dispatcher", default=None, metavar="NAME",
                    help="Kueue's multiKueue.dispatcherName on those clusters (default: "
                    "kueue.x-k8s.io/multikueue-dispatcher-all-at-once; another name makes "
                    "Kueue wait for an external dispatcher such as `python -m dispatcher run "
                    "--mode kueue`)")
    up.add_argument("--kueue-integration", action="append", default=[], metavar="FRAMEWORK",
                    dest="kueue_integrations",
                    help="a Kueue integration to enable on those clusters (repeatable; "
                    "default: trainer.kubeflow.org/trainjob only; `--kueue-integration "
                    "batch/job --kueue-integration jobset.x-k8s.io/jobset "
                    "--kueue-integration trainer.kubeflow.org/trainjob` is what a MultiKueue "
                    "team typically enables)")
    nodes_group = up.add_argument_group(
        "worker Nodes (kwok Nodes with the local provider, kind nodes with kind; kind Nodes "
        "have this machine's capacity, so the resource flags are the local provider's only)")
    nodes_group.add_argument("--nodes", type=int, default=2, metavar="N",
                             help="Nodes per worker (default: %(default)s)")
    nodes_group.add_argument("--node-cpu", default=None, metavar="QUANTITY",
                             help=f"cpu of each Node (default: {NODE_CPU})")
    nodes_group.add_argument("--node-memory", default=None, metavar="QUANTITY",
                             help=f"memory of each Node (default: {NODE_MEMORY})")
    nodes_group.add_argument("--node-gpus", type=int, default=None, metavar="N",
                             help="nvidia.com/gpu of each Node (default: 0)")
    nodes_group.add_argument("--nodes-file", metavar="PATH",
                             help="YAML file with node pools per worker (instead of the flags "
                             "above): labels, taints and any resources")

    sub.add_parser("status", parents=[common], help="show each cluster's state",
                   description="Show each cluster's name, role, API URL, kubeconfig and state.")
    sub.add_parser("down", parents=[common], help="stop everything and remove the state",
                   description="Stop every process the harness started and delete the state "
                   "directory (data, logs, kubeconfigs). A directory the other provider made "
                   "is refused, named with the command that brings it down.")
    for verb, text in (("stop", "stop one cluster's processes; its data is kept"),
                       ("start", "start a stopped cluster again on the same ports and data")):
        cmd = sub.add_parser(verb, parents=[common], help=text, description=text + ".")
        cmd.add_argument("name", help="cluster name, e.g. worker-1")
        if verb == "start":
            cmd.add_argument("--timeout", type=float, default=None,
                             help="seconds to wait for readiness (default: 60 for local "
                             "clusters; 300 for kind, whose restarted nodes start their "
                             "kubelets, system Pods and JobSet's controller again)")

    deploy = sub.add_parser(
        "deploy", parents=[common],
        help="deploy the product into the kind clusters from the shipped manifests",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_doc_summary("clusters.kind.deploy") + "\n\nOnly the kind provider: "
        "the local provider's kwok Nodes run no containers (`make demo` runs the dispatcher "
        "and the operators there as processes).")
    deploy.add_argument("--timeout", type=float, default=300,
                        help="seconds to wait for everything to be rolled out (default: "
                        "%(default)s)")
    deploy.add_argument("--manager-overlay", default="manager",
                        choices=("manager", "manager-beside-kueue", "manager-kueue"),
                        help="the manager's overlay under manifests/: manager (no Kueue; "
                        "default), manager-beside-kueue (the dispatcher standalone beside "
                        "the Kueue `up --kueue manager` installed) or manager-kueue (Kueue "
                        "mode: the external MultiKueue dispatcher of a Kueue with "
                        "--kueue-dispatcher trainjob-dispatcher.io/capacity, every worker "
                        "running Kueue too)")
    deploy.add_argument("--remote-api", action="store_true",
                        help="with the remote view (docs/remote-view.md): the overlay with "
                        "the component manifests/remote-api/serving, then manifests/"
                        "remote-api; waits until its APIService is Available on both "
                        "dispatcher replicas")

    release = sub.add_parser(
        "release", help="write the installable manifests of a release, images set",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_doc_summary("clusters.release"))
    release.add_argument("--version", required=True, dest="release_version", metavar="VERSION",
                         help="the images' tag, e.g. 0.2.0 (the tag you pushed them with)")
    release.add_argument("--registry", required=True,
                         help="where the clusters pull the images from, e.g. "
                         "registry.example.com/ml: the images become "
                         "<registry>/trainjob-dispatcher:<version> and "
                         "<registry>/training-operator:<version>")
    release.add_argument("--worker-secret", action="append", default=[], metavar="NAME",
                         dest="worker_secrets",
                         help="a worker kubeconfig Secret the dispatcher may read (repeat for "
                         "each worker; default: the sample list of manifests/worker-secrets)")
    release.add_argument("--out", default="dist", type=Path,
                         help="directory the files are written to (default: %(default)s)")

    demo = sub.add_parser(
        "demo", parents=[common], help="run the whole product locally with sample jobs",
        description="Start a manager and two workers (kube-scheduler, the JobSet controller and "
        "kwok Nodes on each worker), the training operator on each worker and the dispatcher "
        "on the manager, submit the sample TrainJobs (manifests/samples) and show where each "
        "runs and its status until all are done. The jobs are of mixed sizes, so some wait "
        "on the manager for room. Ctrl-C stops everything; after a complete run the "
        "clusters stay up (`python -m clusters down` removes them).")
    demo.add_argument("--run-seconds", type=float, default=15.0,
                      help="how long kwok runs each pod before it succeeds (default: %(default)s)")
    demo.add_argument("--timeout", type=float, default=300,
                      help="give up after this many seconds (default: %(default)s)")

    conformance = sub.add_parser(
        "conformance", parents=[common], help="compare this operator with upstream Trainer's",
        description="Run upstream Kubeflow Trainer's controller (with its CRDs) on one worker "
        "and this operator on another, apply the same runtimes and TrainJobs to both (upstream's "
        "shipped runtimes and examples, and the project's own cases) and print, per object, "
        "whether what the two made is equal after the intended differences "
        "docs/conformance.md lists are removed, and the paths that differ. Uses the clusters "
        "in --state-dir when two workers run there, else starts and removes its own. Exit "
        "status 1 when anything differs.")
    conformance.add_argument("--case", action="append", default=[], metavar="NAME",
                             help="run only this case (repeatable)")
    conformance.add_argument("--operator-crds", choices=crds.TRAINER_CRD_FLAVOURS,
                             default=crds.PROJECT,
                             help="the Trainer CRDs this operator's worker serves during the "
                             "run: the project's (default) or upstream's, as a cluster that "
                             "runs Trainer today has them")

    pinned = "\n".join(f"  {c.name:<28} {c.source}" for c in binaries.COMPONENTS.values())
    prov = sub.add_parser(
        "provision", help="find or build every binary the harness and its tests run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find each binary (in TEST_ASSET_<NAME>, KUBEBUILDER_ASSETS or the cache) "
        "or build it from its Go module into the cache, one at a time, printing progress with "
        "the elapsed time. A cold build of everything takes 20-40 minutes on 2 cores; later "
        f"runs cost nothing. Pinned versions:\n{pinned}",
    )
    prov.add_argument("--only", action="append", metavar="NAME", choices=list(binaries.COMPONENTS),
                      help="provision only this binary (repeatable; default: all)")
    prov.add_argument("--json", action="store_true", help="print JSON")
    prov.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")

    engine = sub.add_parser(
        "engine", help="find, start or stop the Docker engine the images, compose and kind use",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_doc_summary("clusters.engine"))
    engine.add_argument("action", choices=("start", "status", "stop", "env"),
                        help="start: use the engine that answers, else install (Debian's "
                        "docker.io) and start the project's own; status: say which answers; "
                        "stop: stop the project's own engine if it runs (never another); env: "
                        "print the DOCKER_HOST line to export")
    engine.add_argument("--json", action="store_true", help="print JSON")

    images = sub.add_parser(
        "images", help="build every container image the project runs, here, from sources",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_doc_summary("clusters.images"))
    images.add_argument("--only", action="append", metavar="NAME", default=[],
                        choices=list(IMAGE_NAMES),
                        help="build only this image (repeatable; default: all). Names: "
                        + ", ".join(IMAGE_NAMES))
    images.add_argument("--pull", action="store_true",
                        help="first try to pull each upstream image (bases, control plane, "
                        "JobSet, kwok) from its registry; build what cannot be pulled")
    images.add_argument("--rebuild", action="store_true",
                        help="rebuild the bases and binary images even when present")
    images.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _doc_summary(module: str) -> str:
    import importlib

    return importlib.import_module(module).__doc__


def _print_clusters(infos: list[ClusterInfo], as_json: bool, extra: dict | None = None) -> None:
    if as_json:
        print(json.dumps({**(extra or {}), "clusters": [i.model_dump() for i in infos]}, indent=2))
        return
    if not infos:
        print("no clusters")
        return
    rows = [("NAME", "ROLE", "STATE", "SERVER", "KUBECONFIG")]
    rows += [(i.name, i.role, i.state, i.server, i.kubeconfig) for i in infos]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for info in infos:
        for problem in info.problems:
            print(f"{info.name}: {problem}")


def _provider(args):
    if args.provider == "kind":
        from clusters.kind import KindClusters

        return KindClusters(args.state_dir)
    return LocalClusters(args.state_dir)


def _down_report(state_dir: Path, provider: str, gone: bool) -> str:
    if gone:
        return f"stopped and removed {state_dir}"
    others = sorted(state_owner.makers(state_dir) - {provider})
    if others:
        downs = "; ".join(f"`{state_owner.command(p, 'down', state_dir)}`" for p in others)
        return (f"stopped the {provider} provider's clusters and removed its files; "
                f"{state_dir} stays with the {' and '.join(others)} provider's ({downs})")
    return f"no {provider} clusters in {state_dir}: it stays, with files no provider made"


def _deploy(args) -> int:
    if args.provider != "kind":
        raise ValueError("deploy: only with --provider kind; the local provider's Nodes are "
                         "kwok Nodes that run no containers, so the product's Deployments "
                         "would never start there (`make demo` runs it as processes)")
    from clusters.kind import KindClusters
    from clusters.kind.deploy import deploy

    state_owner.refuse_others(Path(args.state_dir).resolve(), "kind", "deploy")
    report = deploy(KindClusters(args.state_dir), timeout=args.timeout,
                    manager_overlay=args.manager_overlay, with_remote_api=args.remote_api)
    if args.json:
        print(json.dumps({"steps": report.steps, "seconds": round(report.seconds, 1)}))
    else:
        for cluster, steps in report.steps.items():
            print(f"{cluster}: {'; '.join(steps)}")
        print(f"deployed in {report.seconds:.0f} s; `python -m dispatcher status "
              f"--kubeconfig {Path(args.state_dir) / 'manager.kubeconfig'}` shows the workers")
    return 0


def _release(args) -> int:
    from clusters.release import Release, write_release

    release = Release(args.release_version, args.registry, tuple(args.worker_secrets))
    for path in write_release(release, args.out):
        print(path)
    return 0


def _provision(args) -> int:
    names = args.only or list(binaries.PROVISIONED)
    if not args.json:
        print(f"provisioning {len(names)} binaries (missing ones are built into "
              f"{binaries.cache_root()})", file=sys.stderr, flush=True)
    started = time.monotonic()
    found = binaries.find_binaries(build=True, names=names, progress=binaries.stderr_progress)
    result = {name: {"path": str(path), "version": binaries.binary_version(path, name)}
              for name, path in found.paths.items()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, item in result.items():
            print(f"{name:<28} {item['version']:<40} {item['path']}")
        print(f"({time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 0


def _engine(args) -> int:
    from clusters import engine

    if args.action == "stop":
        stopped = engine.stop_engine()
        print("stopped the project's dockerd" if stopped else "the project's dockerd is not "
              "running (an engine started elsewhere is never stopped here)")
        return 0
    found = engine.ensure_engine() if args.action == "start" else engine.find_engine()
    if found is None:
        print("no Docker engine answers (`python -m clusters engine start` starts one)",
              file=sys.stderr)
        return 1
    if args.action == "env":
        print(f"export DOCKER_HOST={found.host}")
        return 0
    description = engine.describe(found)
    if args.json:
        print(json.dumps(description, indent=2))
    else:
        for key, value in description.items():
            print(f"{key:<16} {value}")
    return 0


def _images(args) -> int:
    from clusters import engine, images

    found = engine.ensure_engine()
    started = time.monotonic()
    done = images.build_images(found, tuple(args.only), pull=args.pull, rebuild=args.rebuild)
    sizes = {name: images.image_size(found, name) for name in done}
    if args.json:
        print(json.dumps({name: {"result": result, "bytes": sizes[name]}
                          for name, result in done.items()}, indent=2))
    else:
        for name, result in done.items():
            print(f"{name:<48} {sizes[name] / 1e6:>6.0f} MB  {result}")
        print(f"({time.monotonic() - started:.0f} s; engine {found.host})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_line.exit_quietly_on_broken_pipe(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        if args.command == "provision":
            return _provision(args)
        if args.command == "engine":
            return _engine(args)
        if args.command == "images":
            return _images(args)
        if args.command == "release":
            return _release(args)
        if args.command in ("demo", "conformance") and args.provider != "local":
            # Both run the dispatcher and operators as processes beside local clusters.
            raise ValueError(
                f"{args.command}: only with the local provider (its clusters run the "
                "dispatcher and the operators as processes). On kind, the product runs as "
                "Deployments: `python -m clusters up --provider kind` then `python -m "
                "clusters deploy --provider kind` (docs/kind.md)")
        if args.command == "conformance":
            from clusters.conformance import command

            return command.main(args.state_dir, args.case, args.json, args.verbose,
                                args.operator_crds)
        if args.command == "demo":
            from clusters.demo import run_demo

            return run_demo(Path(args.state_dir).resolve(), args.run_seconds, args.timeout)
        if args.command == "status":
            # Said here, not answered with "no clusters" (status changes nothing, so the
            # providers do not check it themselves).
            state_owner.refuse_others(Path(args.state_dir).resolve(), args.provider, "status")
        if args.command == "deploy":
            return _deploy(args)
        provider = _provider(args)
        if args.command == "up":
            started = time.monotonic()
            # Given at all (even at the local provider's defaults): None means not given.
            resource_flags = [flag for flag, value in (
                ("--node-cpu", args.node_cpu), ("--node-memory", args.node_memory),
                ("--node-gpus", args.node_gpus)) if value is not None]
            if args.nodes_file:
                layout = nodes.layout_from_file(args.nodes_file,
                                                workers=cluster_names(args.workers)[1:])
            else:
                layout = nodes.layout_from_flags(args.nodes, args.node_cpu or NODE_CPU,
                                                 args.node_memory or NODE_MEMORY,
                                                 args.node_gpus or 0)
            if args.provider == "kind" and resource_flags:
                # kind Nodes are real kubelets with this machine's capacity.
                raise ValueError(f"{', '.join(resource_flags)}: the kind provider cannot set "
                                 "Node resources; kind Nodes report this machine's own cpu and "
                                 "memory (no GPUs). Use the local provider for them")
            kueue_args = {}
            if args.kueue:
                kueue_args = {"kueue_clusters": tuple(args.kueue)}
                if args.kueue_dispatcher:
                    kueue_args["kueue_dispatcher"] = args.kueue_dispatcher
                if args.kueue_integrations:
                    kueue_args["kueue_integrations"] = tuple(args.kueue_integrations)
            elif args.kueue_integrations or args.kueue_dispatcher:
                raise ValueError("--kueue-integration and --kueue-dispatcher need --kueue")
            infos = provider.up(workers=args.workers, timeout=args.timeout, node_layout=layout,
                                max_workers=args.max_workers,
                                upstream_crds=tuple(args.upstream_crds), **kueue_args)
            _print_clusters(infos, args.json,
                            {"provider": args.provider,
                             "seconds": round(time.monotonic() - started, 2)})
        elif args.command == "status":
            _print_clusters(provider.status(), args.json, {"provider": args.provider})
        elif args.command == "down":
            gone = provider.down()
            if not args.json:
                print(_down_report(Path(args.state_dir).resolve(), args.provider, gone))
        elif args.command == "stop":
            _print_clusters([provider.stop(args.name)], args.json)
        elif args.command == "start":
            timeout = {} if args.timeout is None else {"timeout": args.timeout}
            _print_clusters([provider.start(args.name, **timeout)], args.json)
        return 0
    except (ControlPlaneError, binaries.ProvisioningError, EngineError, TimeoutError,
            ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
