"""The dispatcher's dashboard in a real browser: headless Chromium (driven by chromedriver)
loads the page from the dispatcher's metrics port while jobs sit in several states on the
harness's clusters, and the test reads what the page renders. A job's life on its worker
(its Pods, Events and log, /api/job and /api/job/log) is read from a job whose Pods run
on a kwok Node of the module's own, whose address and kubelet port are kwok's, so their
logs are served for real (from the file kwok follows, ``ControlPlane.kwok_logs_file``)."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import shutil
import urllib.error
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.utils.quantity import parse_quantity
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from clusters import fixtures, worker_stack
from clusters.testing import eventually
from dispatcher.dashboard import display_amount
from trainjob import constants as c

from dispatch_helpers import (
    QUICK_RUNTIME,
    RUNTIME,
    complete_jobset,
    create,
    get,
    trainjob,
    wait_placed,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
INSTALL_HINT = ("install them with `make browser` (Debian/Ubuntu: "
                "apt-get install -y chromium chromium-driver)")
JOBSETS = (c.JOBSET_GROUP, c.JOBSET_VERSION)
# The module's own Node on worker-1, whose pods' logs kwok serves, and a runtime whose
# pods go there and run until deleted.
LOG_WORKER = "worker-1"
LOG_NODE = "dashboard-logs"
LOG_NODE_LABEL = "example.com/dashboard-logs"
LOG_RUNTIME = "dashboard-torch"

# The page's rows, read in one script call so a redraw between two reads cannot mix them.
READ_JOBS = """
return Array.from(document.querySelectorAll('#jobs > tbody > tr[data-key]')).map(tr => ({
  key: tr.dataset.key,
  state: tr.querySelector('.state').innerText,
  worker: tr.querySelector('.worker').innerText,
  conditions: tr.querySelector('.conditions-cell').innerText,
  jobsStatus: tr.querySelector('.jobs-status-cell').innerText,
  age: tr.querySelector('.age').innerText,
}));
"""
READ_CLUSTERS = """
return Array.from(document.querySelectorAll('#clusters tbody tr')).map(tr => ({
  name: tr.dataset.cluster,
  active: tr.querySelector('.active').innerText,
  reason: tr.querySelector('.reason').innerText,
  jobs: tr.querySelector('.jobs').innerText,
  cpu: (tr.querySelector('.resource[data-resource="cpu"]') || {innerText: ''}).innerText,
  memory: (tr.querySelector('.resource[data-resource="memory"]') || {innerText: ''}).innerText,
}));
"""


def _find(program: str, *fallbacks: str) -> str | None:
    return shutil.which(program) or next((p for p in fallbacks if os.access(p, os.X_OK)), None)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium from the system's packages; nothing is downloaded."""
    chromium = _find("chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
    driver = _find("chromedriver", "/usr/bin/chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver))
               if path is None]
    if missing:
        pytest.fail(f"the dashboard test needs {' and '.join(missing)}, not found on PATH: "
                    f"{INSTALL_HINT}")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--window-size=1400,1000"):
        options.add_argument(arg)
    log = tmp_path_factory.mktemp("browser") / "chromedriver.log"
    driver_process = webdriver.Chrome(service=Service(executable_path=driver,
                                                      log_output=str(log)), options=options)
    yield driver_process
    driver_process.quit()


@pytest.fixture(scope="module")
def namespaces(dispatch_env):
    """Two fresh namespaces in every cluster, so the namespace filter has a choice."""
    stamp = secrets.token_hex(3)
    names = (f"dash-a-{stamp}", f"dash-b-{stamp}")
    for cluster in dispatch_env.multicluster:
        for name in names:
            cluster.core.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name)))
    yield names
    for cluster in dispatch_env.multicluster:
        for name in names:
            try:
                cluster.core.delete_namespace(name)
            except Exception:  # noqa: BLE001 - cleanup must not mask the test result
                pass


def _wait_jobset(worker, namespace: str, name: str) -> None:
    eventually(lambda: get(worker, namespace, name, c.JOBSETS, JOBSETS),
               lambda jobset: jobset is not None,
               expected=f"the operator on {worker.name} to create JobSet {namespace}/{name}")


def _counts_text(jobs_status: list[dict]) -> str:
    """A TrainJob's status.jobsStatus as the page writes it: one line per job, its non-zero
    counts joined by a middle dot."""
    keys = ("active", "ready", "succeeded", "failed", "suspended")
    return "\n".join(
        f"{entry['name']}: " + (" · ".join(f"{k} {entry[k]}" for k in keys if entry.get(k))
                                or "–") for entry in jobs_status)


def _manager_state(env, namespace: str, name: str, wanted: str) -> None:
    def check(obj):
        conditions = {x["type"]: x for x in (obj or {}).get("status", {}).get("conditions") or []}
        if wanted == "Running":
            return any(j.get("active")
                       for j in (obj or {}).get("status", {}).get("jobsStatus") or [])
        if wanted == "Pending":
            return conditions.get("Placed", {}).get("reason") == "NoWorkerFits"
        return conditions.get(wanted, {}).get("status") == "True"

    eventually(lambda: get(env.manager, namespace, name), check,
               expected=f"manager TrainJob {namespace}/{name} {wanted}", timeout=60)


@pytest.fixture(scope="module")
def jobs(dispatch_env, namespaces):
    """Jobs in four states across two namespaces and both workers. The 20-cpu ones fit only
    worker-2 (64 cpu); 1000 cpu fits nowhere. Returns {(namespace, name): worker}."""
    env = dispatch_env
    team_a, team_b = namespaces
    create(env.manager, team_a, trainjob("pending", requests={"cpu": "1000"}))
    # Running and Complete are real: pods on the workers' kwok Nodes that run on, or that
    # succeed after a second. Failed, with one particular reason, is written by the test.
    plan = [(team_a, "running", "100m", "Running"), (team_b, "complete", "20", "Complete"),
            (team_b, "failed", "100m", "Failed"), (team_b, "live", "20", "Running")]
    for namespace, name, cpu, state in plan:
        runtime = QUICK_RUNTIME if state == "Complete" else RUNTIME
        create(env.manager, namespace, trainjob(name, requests={"cpu": cpu}, runtime=runtime))
    placed = {(team_a, "pending"): ""}
    for namespace, name, _, state in plan:
        worker_name, _ = wait_placed(env, namespace, name)
        placed[(namespace, name)] = worker_name
        worker = env.multicluster[worker_name]
        _wait_jobset(worker, namespace, name)
        if state == "Failed":
            complete_jobset(worker, namespace, name, type_="Failed",
                            reason="BackoffLimitExceeded")
    for namespace, name, _, state in [(team_a, "pending", "", "Pending"), *plan]:
        _manager_state(env, namespace, name, state)
    assert placed[(team_b, "complete")] == placed[(team_b, "live")] == "worker-2"
    return placed


def _page(browser, env, query: str = "") -> None:
    browser.get(f"http://127.0.0.1:{env.dispatcher.metrics_port}/{query}")


def _rendered_jobs(browser, namespaces) -> dict[str, dict]:
    return {row["key"]: row for row in browser.execute_script(READ_JOBS)
            if row["key"].split("/")[0] in namespaces}


def _rendered_clusters(browser) -> dict[str, dict]:
    return {row["name"]: row for row in browser.execute_script(READ_CLUSTERS)}


def _allocatable_cpu(cluster) -> str:
    """What the worker's Ready, schedulable Nodes allocate, as the page formats it."""
    total = Decimal(0)
    for node in cluster.core.list_node().items:
        ready = any(x.type == "Ready" and x.status == "True" for x in node.status.conditions or [])
        if ready and not node.spec.unschedulable:
            total += parse_quantity((node.status.allocatable or {}).get("cpu", "0"))
    return display_amount("cpu", total)


def _choose(browser, select_id: str, value: str) -> None:
    """Pick a filter value the way a person does, once the page offers it (a redraw of the
    options in between is retried)."""
    def pick() -> str:
        Select(browser.find_element(By.ID, select_id)).select_by_value(value)
        return browser.find_element(By.ID, select_id).get_attribute("value")

    eventually(pick, lambda chosen: chosen == value,
               expected=f"filter {select_id} to offer and take {value!r}", timeout=15)


def _screenshot(browser, tmp_path: Path, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    kept = tmp_path / name
    assert browser.save_screenshot(str(kept)), f"Chromium could not write {kept}"
    shutil.copyfile(kept, ARTIFACTS / name)
    assert (ARTIFACTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"dashboard screenshot: {ARTIFACTS / name} (also {kept})")
    return ARTIFACTS / name


def test_clusters_and_jobs_in_several_states_are_rendered(dispatch_env, browser, jobs,
                                                          namespaces, tmp_path):
    env = dispatch_env
    team_a, team_b = namespaces
    _page(browser, env)

    expected = {f"{team_a}/pending": "Pending", f"{team_a}/running": "Running",
                f"{team_b}/complete": "Complete", f"{team_b}/failed": "Failed",
                f"{team_b}/live": "Running"}

    def shows_every_job(rows):
        # The pending job's reason names worker-1's room once that worker's Namespace cache
        # has the test's namespace (before: "namespace ... not found"); the page follows.
        return set(rows) == set(expected) and all(
            rows[key]["state"].startswith(state) for key, state in expected.items()) and \
            "worker-1: needs" in rows[f"{team_a}/pending"]["state"]

    rows = eventually(lambda: _rendered_jobs(browser, namespaces), shows_every_job,
                      expected="every test job rendered in its state", timeout=30)
    for (namespace, name), worker in jobs.items():
        assert rows[f"{namespace}/{name}"]["worker"] == (worker or "–"), rows[f"{namespace}/{name}"]
    pending = rows[f"{team_a}/pending"]
    assert "NoWorkerFits" in pending["state"] and "worker-1: needs" in pending["state"], pending
    assert "Placed=False" in pending["conditions"], pending
    assert "node: active 1" in rows[f"{team_a}/running"]["jobsStatus"], rows[f"{team_a}/running"]
    assert "Complete" in rows[f"{team_b}/complete"]["conditions"]
    assert "BackoffLimitExceeded" in rows[f"{team_b}/failed"]["conditions"]
    assert all(row["age"] for row in rows.values())

    # Both workers, active, with capacity from their Nodes, and the running 20-cpu job's
    # footprint taken on worker-2 (used by its running pods, or reserved until they run).
    live = get(env.multicluster["worker-2"], team_b, "live")
    footprint = parse_quantity(
        json.loads(live["metadata"]["annotations"][c.REQUESTS_ANNOTATION])["requests"]["cpu"])
    allocatable = {name: _allocatable_cpu(env.multicluster[name])
                   for name in ("worker-1", "worker-2")}

    def taken(cpu_cell: str):
        # "cpu\n<used> [+ <reserved>] / <allocatable>\n<free> free"
        used_part = cpu_cell.splitlines()[1].split("/")[0]
        return sum(parse_quantity(x.strip()) for x in used_part.split("+"))

    def clusters_right(found):
        return set(found) >= {"worker-1", "worker-2"} and all(
            found[name]["active"] == "True" and found[name]["reason"].startswith("Active")
            and f"/ {allocatable[name]}" in found[name]["cpu"] and "free" in found[name]["cpu"]
            for name in allocatable) and taken(found["worker-2"]["cpu"]) >= footprint

    clusters = eventually(lambda: _rendered_clusters(browser), clusters_right,
                          expected=f"worker-1 and worker-2 active with cpu of {allocatable} "
                          f"and at least {footprint} cpu taken on worker-2", timeout=30)
    assert clusters["worker-2"]["memory"].split()[0] == "memory", clusters["worker-2"]
    assert int(clusters["worker-2"]["jobs"]) >= 2, clusters["worker-2"]
    _screenshot(browser, tmp_path, "dashboard.png")


def test_filters_narrow_the_rows(dispatch_env, browser, jobs, namespaces):
    env = dispatch_env
    team_a, team_b = namespaces
    mine = {f"{ns}/{name}" for ns, name in jobs}

    def all_rows():
        return {row["key"]: row for row in browser.execute_script(READ_JOBS)}

    def narrowed(wanted: set[str], every_row) -> None:
        eventually(all_rows, lambda rows: set(rows) & mine == wanted and all(
            every_row(key, row) for key, row in rows.items()),
            expected=f"exactly {sorted(wanted)} of the test's jobs shown", timeout=15)

    _page(browser, env)
    _choose(browser, "filter-state", "Running")
    narrowed({f"{team_a}/running", f"{team_b}/live"},
             lambda _, row: row["state"].startswith("Running"))
    assert "state=Running" in browser.current_url

    _choose(browser, "filter-state", "")
    _choose(browser, "filter-cluster", "worker-2")
    on_worker_2 = {f"{ns}/{name}" for (ns, name), worker in jobs.items() if worker == "worker-2"}
    narrowed(on_worker_2, lambda _, row: row["worker"] == "worker-2")

    _choose(browser, "filter-cluster", "")
    _choose(browser, "filter-namespace", team_a)
    narrowed({f"{team_a}/pending", f"{team_a}/running"},
             lambda key, _: key.startswith(f"{team_a}/"))

    # Filters combine, and a link with them opens the same view.
    _page(browser, env, f"?namespace={team_b}&state=Failed")
    narrowed({f"{team_b}/failed"}, lambda key, row: key.startswith(f"{team_b}/")
             and row["state"].startswith("Failed"))


def test_a_remote_status_change_shows_without_reload(dispatch_env, browser, jobs, namespaces,
                                                     tmp_path):
    env = dispatch_env
    _, team_b = namespaces
    key = f"{team_b}/live"
    _page(browser, env, f"?namespace={team_b}")
    eventually(lambda: _rendered_jobs(browser, namespaces).get(key, {}).get("state", ""),
               lambda state: state.startswith("Running"), expected=f"{key} rendered Running")
    browser.execute_script("window.sameDocument = 'no reload'")

    complete_jobset(env.multicluster["worker-2"], team_b, "live")

    # The worker's real JobSet controller may write the JobSet's job counts again after
    # the test's write, so the counts wanted are those the manager's TrainJob has now.
    def shown() -> tuple[dict, str]:
        job = get(env.manager, team_b, "live")
        return (_rendered_jobs(browser, namespaces).get(key, {}),
                _counts_text((job or {}).get("status", {}).get("jobsStatus") or []))

    row, counts = eventually(
        shown, lambda seen: seen[0].get("state", "").startswith("Complete")
        and seen[0].get("jobsStatus") == seen[1],
        expected=f"{key} rendered Complete, with its manager TrainJob's job counts, after "
                 "its worker's JobSet completed", timeout=30)
    assert "node: " in counts, counts
    assert browser.execute_script("return window.sameDocument") == "no reload"
    # Its reservation is gone with it: worker-2's cpu shows nothing reserved.
    eventually(lambda: _rendered_clusters(browser)["worker-2"]["cpu"],
               lambda cpu: "+" not in cpu,
               expected="worker-2's reservation for the finished job released on the page")
    _screenshot(browser, tmp_path, "dashboard-live.png")


# --- a job's life on its worker -------------------------------------------------------

@pytest.fixture(scope="module")
def logged_job(dispatch_env, namespaces):
    """A job placed on worker-1 whose Pods run on the module's log Node; its trainer Pod's
    name. The Node goes at the end (the namespaces, with the Pods, go with theirs)."""
    env = dispatch_env
    worker = env.multicluster[LOG_WORKER]
    kwok_port = worker.control_plane.port("kwok")
    worker.core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": LOG_NODE, "labels": {LOG_NODE_LABEL: "logs", "type": "kwok"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "20"},
                   "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "20"},
                   # The worker's apiserver asks this address and port for a Pod's log.
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                 {"type": "Hostname", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port}}}})
    try:
        fixtures.install_runtime(worker.api, fixtures.torch_runtime(
            LOG_RUNTIME, cpu="100m", memory="64Mi", node_selector={LOG_NODE_LABEL: "logs"},
            pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER}))
        namespace = namespaces[0]
        create(env.manager, namespace, trainjob("logged", runtime=LOG_RUNTIME))
        placed, _ = wait_placed(env, namespace, "logged")
        assert placed == LOG_WORKER, f"{namespace}/logged placed on {placed}"
        life = eventually(
            lambda: _api(env, "/api/job", namespace=namespace, name="logged"),
            lambda answer: answer[0] == 200 and len(answer[1]["pods"]) == 3 and all(
                pod["status"]["phase"] == "Running" for pod in answer[1]["pods"]),
            timeout=90, expected=f"/api/job: the three Pods of {namespace}/logged Running "
                                 f"on {LOG_NODE}")[1]
        [trainer] = [pod["metadata"]["name"] for pod in life["pods"]
                     if pod["metadata"]["name"].startswith("logged-node-0-0-")]
        yield namespace, trainer
    finally:
        worker.core.delete_node(LOG_NODE)


def _api(env, path: str, **params: str) -> tuple[int, dict]:
    """GET a dashboard route; (status, the JSON it answered)."""
    url = f"http://127.0.0.1:{env.dispatcher.metrics_port}{path}?" + \
        urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _write_log(env, *lines: str) -> None:
    """Lines every container on the log Node logs (kwok serves the one file), in the CRI
    log format."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with open(env.multicluster[LOG_WORKER].control_plane.kwok_logs_file, "a") as out:
        out.writelines(f"{now} stdout F {line}\n" for line in lines)


def test_an_opened_job_shows_its_pods_events_and_log(dispatch_env, logged_job):
    env = dispatch_env
    namespace, trainer = logged_job
    code, life = _api(env, "/api/job", namespace=namespace, name="logged")
    assert code == 200 and life["worker"] == LOG_WORKER, life
    pod = next(p for p in life["pods"] if p["metadata"]["name"] == trainer)
    status = pod["status"]
    assert (status["worker"], status["node"], status["phase"], status["ready"],
            status["restarts"], status["lastTermination"]) == (
        LOG_WORKER, LOG_NODE, "Running", "1/1", 0, None), status
    assert status["startTime"] and status["containers"] == ["node"], status
    # The worker's Events about the copy and its children: its Pods' scheduling at least.
    events = eventually(lambda: _api(env, "/api/job", namespace=namespace, name="logged"),
                        lambda answer: any(e["reason"] == "Scheduled" and
                                           e["object"] == f"Pod/{trainer}"
                                           for e in answer[1].get("events", [])),
                        timeout=30, expected=f"the Scheduled Event of Pod {trainer}")[1]
    assert all(e["worker"] == LOG_WORKER and e["trainJob"] == "logged"
               for e in events["events"]), events

    _write_log(env, "an older line", "the dashboard's line")
    code, log = _api(env, "/api/job/log", namespace=namespace, name="logged", pod=trainer,
                     tailLines="1")
    assert (code, log["text"], log["truncated"], log["worker"]) == (
        200, "the dashboard's line\n", False, LOG_WORKER), log
    code, log = _api(env, "/api/job/log", namespace=namespace, name="logged", pod=trainer,
                     container="node", tailLines="2")
    assert (code, log["text"]) == (200, "an older line\nthe dashboard's line\n"), log


def test_bad_parameters_and_unknown_jobs_are_refused(dispatch_env, jobs, logged_job):
    env = dispatch_env
    namespace, trainer = logged_job
    job = {"namespace": namespace, "name": "logged"}
    refusals = [
        ("/api/job", {"namespace": namespace}, 400, "name: required"),
        ("/api/job", {**job, "extra": "1"}, 400, "extra: not a parameter of /api/job"),
        ("/api/job", {"namespace": "Not_A_Namespace", "name": "x"}, 400,
         "namespace='Not_A_Namespace': not a valid name"),
        ("/api/job/log", job, 400, "pod: required"),
        ("/api/job/log", {**job, "pod": trainer, "tailLines": "many"}, 400,
         "tailLines='many': must be an integer"),
        ("/api/job/log", {**job, "pod": trainer, "tailLines": "5000"}, 400,
         "tailLines=5000: must be from 1 to 1000"),
        ("/api/job", {"namespace": namespace, "name": "nothing"}, 404,
         f"TrainJob {namespace}/nothing: not found on the manager"),
        ("/api/job", {"namespace": namespace, "name": "pending"}, 404,
         f"TrainJob {namespace}/pending: has no copy on any worker (not placed)"),
        ("/api/job/log", {**job, "pod": "logged-somebody-else"}, 404,
         f"Pod {namespace}/logged-somebody-else: not one of the Pods of TrainJob "
         f"{namespace}/logged on worker {LOG_WORKER}"),
        # The worker's own refusal, passed on: the option reached it.
        ("/api/job/log", {**job, "pod": trainer, "container": "nope"}, 400,
         "container nope is not valid for pod"),
    ]
    for path, params, code, says in refusals:
        got, body = _api(env, path, **params)
        assert got == code and body["kind"] == "Status" and says in body["message"], (
            path, params, got, body)


def test_clicking_a_row_shows_the_jobs_pods_and_log(dispatch_env, browser, logged_job,
                                                     tmp_path):
    env = dispatch_env
    namespace, trainer = logged_job
    _write_log(env, "shown on the page")
    _page(browser, env, f"?namespace={namespace}")
    row = eventually(lambda: browser.find_elements(
                         By.CSS_SELECTOR, f'#jobs tr.job[data-key="{namespace}/logged"]'),
                     lambda rows: len(rows) == 1, expected=f"the row of {namespace}/logged")
    row[0].click()
    assert f"job={urllib.parse.quote(namespace)}%2Flogged" in browser.current_url

    read = f"""
      const detail = document.querySelector('#job-detail');
      if (!detail) return null;
      const pod = detail.querySelector('.pods tr[data-pod="{trainer}"]');
      const log = detail.querySelector('.pod-log[open] .log-text');
      return {{pod: pod ? pod.innerText : '', log: log ? log.textContent : '',
               under: detail.previousElementSibling.dataset.key}};
    """
    shown = eventually(lambda: browser.execute_script(read),
                       lambda seen: seen and LOG_NODE in seen["pod"] and "Running" in seen["pod"]
                       and "shown on the page" in seen["log"], timeout=30,
                       expected=f"the job's panel with Pod {trainer} Running on {LOG_NODE} "
                                "and its log's last line")
    assert shown["under"] == f"{namespace}/logged", shown
    # Followed: a line written now shows without a click.
    _write_log(env, "followed onto the page")
    eventually(lambda: browser.execute_script(read),
               lambda seen: seen and "followed onto the page" in seen["log"], timeout=30,
               expected="a line written after the panel opened shown there")
    _screenshot(browser, tmp_path, "dashboard-job.png")
