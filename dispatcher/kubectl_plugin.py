"""``kubectl trainjob``: a TrainJob's life on its worker, seen from the manager with the
user's own credentials only (their kubeconfig, as kubectl finds it), through the remote
view's aggregated API (docs/remote-view.md). Installed as the ``kubectl-trainjob``
executable, which kubectl runs as a plugin."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from controller_kit import command_line
from controller_kit.kubeclient import (
    KubeconfigError,
    api_client,
    find_kubeconfig,
    merge_kubeconfigs,
)
from controller_kit.writes import request_json
from dispatcher.remote_view import APISERVICE, EVENTS, GROUP_VERSION, PODS, TRAINJOB_LABEL
from dispatcher.remote_view.streams import message_of, open_stream
from trainjob import constants as c

DESCRIPTION = f"""\
See where a TrainJob of the manager cluster runs and what happens to it there: its Pods
on the worker cluster, their logs, and the Events of the manager and of the worker.
Read with your own kubeconfig only (--kubeconfig, $KUBECONFIG or ~/.kube/config;
--context; -n) through the manager's aggregated API {GROUP_VERSION}, which
the dispatcher serves: you see what the manager's RBAC lets you see (the view, edit and
admin roles include it once manifests/remote-api is applied).

  kubectl trainjob pods NAME             the job's Pods on its worker
  kubectl trainjob logs NAME [-f]        a Pod's log (the trainer's unless --pod)
  kubectl trainjob describe NAME         where it runs, its conditions, Pods and Events
"""
EPILOG = f"""\
A refusal says why: 403, which permission your user lacks (check with kubectl auth
can-i list trainjobpods.{GROUP_VERSION.split('/')[0]} -n NAMESPACE); 503, that the
aggregated API is unavailable (check kubectl get apiservice {APISERVICE} and the
dispatcher's Pods). docs/remote-view.md has the rest.
"""

TAIL_EVENTS = 20


class PluginError(Exception):
    """Said to the user as ``error: <message>``; exit code 1."""


def _namespace(source, context: str | None) -> str:
    """The namespace the kubeconfig's (current) context names, as kubectl takes it."""
    if not getattr(source, "files", ()):
        return "default"  # in a Pod: its service account names no namespace to use
    merged = merge_kubeconfigs(source)
    wanted = context or merged.get("current-context")
    entry = next((e for e in merged["contexts"] if e.get("name") == wanted), {})
    return (entry.get("context") or {}).get("namespace") or "default"


class RemoteView:
    """The remote view's API, and the manager's, as the user."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None):
        source = find_kubeconfig(kubeconfig)
        self.api = api_client(source, context, user_agent="kubectl-trainjob")
        self.namespace = namespace or _namespace(source, context)

    def _path(self, resource: str, name: str = "", sub: str = "") -> str:
        path = f"/apis/{GROUP_VERSION}/namespaces/{quote(self.namespace)}/{resource}"
        return path + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")

    def get(self, path: str, query: list[tuple[str, str]] | None = None,
            what: str = "") -> dict:
        try:
            return request_json(self.api, "GET", path, None, query=query)
        except ApiException as err:
            raise PluginError(explain(err, what or path, self.namespace,
                                      remote=path.startswith(f"/apis/{GROUP_VERSION}/"))
                              ) from None

    def pods(self, job: str) -> list[dict]:
        return self.get(self._path(PODS), [("labelSelector", f"{TRAINJOB_LABEL}={job}")],
                        f"list trainjobpods of TrainJob {self.namespace}/{job}")["items"]

    def events(self, job: str) -> list[dict]:
        return self.get(self._path(EVENTS), [("labelSelector", f"{TRAINJOB_LABEL}={job}")],
                        f"list trainjobevents of TrainJob {self.namespace}/{job}")["items"]

    def trainjob(self, job: str) -> dict:
        path = (f"/apis/{c.TRAINER_API_VERSION}/namespaces/{quote(self.namespace)}/"
                f"{c.TRAINJOBS}/{quote(job)}")
        return self.get(path, what=f"get TrainJob {self.namespace}/{job}")

    def manager_events(self, job: str) -> list[dict]:
        return self.get(f"/api/v1/namespaces/{quote(self.namespace)}/events",
                        [("fieldSelector", f"involvedObject.kind={c.TRAINJOB_KIND},"
                                           f"involvedObject.name={job}")],
                        f"list events of TrainJob {self.namespace}/{job}")["items"]

    def stream_log(self, pod: str, options: dict[str, object], out) -> None:
        what = f"get the log of Pod {self.namespace}/{pod}"
        try:
            # No read timeout: a followed log may be quiet for long; Ctrl-C ends it.
            response = open_stream(self.api, self._path(PODS, pod, "log"), options,
                                   (10, None))
        except ApiException as err:
            raise PluginError(explain(err, what, self.namespace)) from None
        try:
            while True:
                data = response.read1(65536)
                if not data:
                    return
                out.write(data)
                out.flush()
        finally:
            response.release_conn()


def explain(err: ApiException, what: str, namespace: str, remote: bool = True) -> str:
    """What went wrong, and what to do about it (``remote``: a request of the remote
    view's API, else of the manager's own)."""
    message = message_of(err)
    if err.status == 403 and not remote:
        return (f"cannot {what}: {message}\nYour user lacks the RBAC for it on the manager: "
                f"ask for read access to it in namespace {namespace}.")
    if err.status == 403:
        return (f"cannot {what}: {message}\nYour user lacks the RBAC for it: the remote view "
                f"is part of the view, edit and admin roles once manifests/remote-api is "
                f"applied; ask for one of them in namespace {namespace} (check with: kubectl "
                f"auth can-i {what.split()[0]} trainjobpods.remote.trainjob-dispatcher.io "
                f"-n {namespace}).")
    if err.status == 503:
        return (f"cannot {what}: the remote view's aggregated API is unavailable ({message}). "
                f"Check: kubectl get apiservice {APISERVICE} (its Available condition says "
                "why) and the dispatcher's Pods: kubectl -n trainjob-system get pods -l "
                "app.kubernetes.io/name=trainjob-dispatcher.")
    if err.status == 404 and "could not find the requested resource" in message:
        return (f"cannot {what}: this cluster does not serve {GROUP_VERSION} (the remote "
                "view is not installed: manifests/remote-api, docs/remote-view.md).")
    if err.status == 401:
        return f"cannot {what}: the cluster did not accept your credentials ({message})."
    if err.status == 0:
        return f"cannot {what}: no answer from the cluster ({err.reason})."
    return f"cannot {what}: {message}"


# --- output --------------------------------------------------------------------------


def _table(rows: list[list[str]], out) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("   ".join(cells).rstrip() + "\n")


def _ended(pod: dict) -> str:
    last = pod["status"].get("lastTermination")
    if not last:
        return "<none>"
    return f"{last.get('reason') or 'Terminated'} (exit {last.get('exitCode')})"


def print_pods(pods: list[dict], out) -> None:
    rows = [["NAME", "WORKER", "NODE", "READY", "STATUS", "RESTARTS", "LAST TERMINATION",
             "STARTED"]]
    for pod in pods:
        status = pod["status"]
        rows.append([pod["metadata"]["name"], status["worker"], status["node"] or "<none>",
                     status["ready"], status["phase"], str(status["restarts"]), _ended(pod),
                     status.get("startTime") or "<none>"])
    _table(rows, out)


def choose_pod(pods: list[dict], job: str, wanted: str | None) -> str:
    """The Pod to read a log of: ``wanted``, else the trainer's first (replicated job
    node), else the only one."""
    names = sorted(p["metadata"]["name"] for p in pods)
    if wanted:
        if wanted not in names:
            raise PluginError(f"TrainJob {job} has no Pod {wanted} (its Pods: "
                              f"{', '.join(names) or 'none'})")
        return wanted
    if not names:
        raise PluginError(f"TrainJob {job} has no Pods on its worker yet")
    trainers = [n for n in names if n.startswith(f"{job}-{c.NODE}-")]
    return (trainers or names)[0]


def describe(view: RemoteView, job: str, out) -> None:
    obj = view.trainjob(job)
    meta, status = obj["metadata"], obj.get("status") or {}
    out.write(f"Name:       {meta['name']}\nNamespace:  {meta['namespace']}\n")
    worker = (meta.get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
    out.write(f"Worker:     {worker or '<not placed>'}\n")
    out.write(f"ManagedBy:  {(obj.get('spec') or {}).get('managedBy') or '<none>'}\n")
    out.write("Conditions:\n")
    conditions = status.get("conditions") or []
    if conditions:
        _table([["  TYPE", "STATUS", "REASON", "MESSAGE"]] + [
            [f"  {x.get('type')}", x.get("status", ""), x.get("reason", ""),
             (x.get("message") or "")[:120]] for x in conditions], out)
    else:
        out.write("  <none>\n")
    out.write("Pods (on the worker):\n")
    try:
        pods = view.pods(job)
        worker_events = view.events(job)
    except PluginError as err:
        pods, worker_events = None, None
        out.write(f"  <not read: {err}>\n")
    if pods is not None:
        if pods:
            print_pods(pods, _Indented(out))
        else:
            out.write("  <none>\n")
    events = [("manager", e.get("lastTimestamp") or e.get("eventTime") or "",
               e.get("type", ""), e.get("reason", ""),
               f"TrainJob/{job}", e.get("message", "")) for e in view.manager_events(job)]
    events += [(e["worker"], e.get("lastTimestamp") or "", e["type"], e["reason"],
                e["object"], e["message"]) for e in worker_events or []]
    out.write("Events:\n")
    if not events:
        out.write("  <none>\n")
        return
    recent = sorted(events, key=lambda e: e[1])[-TAIL_EVENTS:]
    _table([["  FROM", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]] + [
        [f"  {e[0]}", e[1], e[2], e[3], e[4], e[5][:120]] for e in recent], out)


class _Indented:
    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> None:
        self.out.write("".join(f"  {line}" if line.strip() else line
                               for line in text.splitlines(keepends=True)))


# --- command line --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubectl trainjob", description=DESCRIPTION,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    command_line.add_version(parser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else "
                        "~/.kube/config), as kubectl")
    common.add_argument("--context", help="kubeconfig context (default: its current one)")
    common.add_argument("-n", "--namespace", help="the TrainJob's namespace (default: the "
                        "context's, else default)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pods = sub.add_parser("pods", parents=[common], help="the job's Pods on its worker")
    pods.add_argument("name", metavar="NAME", help="the TrainJob")
    logs = sub.add_parser("logs", parents=[common], help="a Pod's log",
                          description="The log of one of the job's Pods on its worker: the "
                          "trainer's first Pod unless --pod names another.")
    logs.add_argument("name", metavar="NAME", help="the TrainJob")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep streaming as the log grows (Ctrl-C ends it)")
    logs.add_argument("--pod", help="which Pod (kubectl trainjob pods NAME lists them)")
    logs.add_argument("-c", "--container", help="which container (default: the Pod's only)")
    logs.add_argument("-p", "--previous", action="store_true",
                      help="the log of the container's previous run")
    logs.add_argument("--tail", type=int, default=None, metavar="N",
                      help="only the last N lines")
    describe_parser = sub.add_parser("describe", parents=[common],
                                     help="where it runs, its conditions, Pods and Events")
    describe_parser.add_argument("name", metavar="NAME", help="the TrainJob")
    return parser


def main(argv: list[str] | None = None) -> int:
    return command_line.exit_quietly_on_broken_pipe(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        view = RemoteView(args.kubeconfig, args.context, args.namespace)
        if args.command == "pods":
            pods = view.pods(args.name)
            if not pods:
                print(f"TrainJob {view.namespace}/{args.name} has no Pods on its worker yet")
            else:
                print_pods(pods, sys.stdout)
        elif args.command == "logs":
            if args.tail is not None and args.tail < 0:
                print("error: --tail: must be 0 or more", file=sys.stderr)
                return 2
            pod = choose_pod(view.pods(args.name), args.name, args.pod)
            options: dict[str, object] = {}
            for key, value in (("container", args.container), ("follow", args.follow),
                               ("previous", args.previous), ("tailLines", args.tail)):
                if value not in (None, False):
                    options[key] = value
            view.stream_log(pod, options, sys.stdout.buffer)
        else:
            describe(view, args.name, sys.stdout)
    except (PluginError, KubeconfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
