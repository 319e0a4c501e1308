// The dispatcher's dashboard: polls /api/state (built from the dispatcher's caches) and
// redraws the tables. Filters live in the URL query (?state=&cluster=&namespace=), so a
// filtered view can be shared and survives a reload. Text goes in through textContent only.
// A job's row, clicked, opens its life on its worker (?job=namespace/name): its Pods and
// Events from /api/job and the end of its Pods' logs from /api/job/log, read from the
// worker for that one job only, again every few seconds while the job runs.
"use strict";

const POLL_MS = 1000;
const DETAIL_POLL_MS = 3000;
const TAIL_LINES = 100;
const FINAL_STATES = ["Complete", "Failed"];
const NOT_PLACED = "-";  // the cluster filter's value for jobs without a worker
const FILTERS = ["state", "cluster", "namespace"];

let latest = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "title") node.title = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function filterValues() {
  const params = new URLSearchParams(window.location.search);
  return Object.fromEntries(FILTERS.map((name) => [name, params.get(name) || ""]));
}

function setFilter(name, value) {
  const params = new URLSearchParams(window.location.search);
  if (value) params.set(name, value); else params.delete(name);
  const query = params.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
  if (latest) render(latest);
}

function matches(job, filters) {
  if (filters.state && job.state !== filters.state) return false;
  if (filters.namespace && job.namespace !== filters.namespace) return false;
  if (filters.cluster === NOT_PLACED) return !job.worker;
  if (filters.cluster && job.worker !== filters.cluster) return false;
  return true;
}

function fillSelect(select, values, selected, labels) {
  // Keep the selected value offered even when no job has it right now.
  const all = [...new Set([...values, ...(selected ? [selected] : [])])].sort();
  const wanted = ["", ...all].join("\n");
  if (select.dataset.options !== wanted) {
    select.replaceChildren(el("option", { value: "" }, "all"),
      ...all.map((value) => el("option", { value }, (labels && labels[value]) || value)));
    select.dataset.options = wanted;
  }
  select.value = selected;
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 10 ? `${value.toFixed(2)} s` : `${value.toFixed(0)} s`;
}

function renderClusters(clusters) {
  const rows = clusters.map((cluster) => {
    const capacity = el("div", { class: "capacity" }, ...cluster.capacity.map((row) => {
      const d = row.display;
      const fill = el("span", { class: "fill" });
      // Through the CSSOM: the page's Content-Security-Policy refuses inline style attributes.
      fill.style.width = `${(row.takenFraction * 100).toFixed(1)}%`;
      const bar = el("span", { class: "bar" }, fill);
      const reserved = row.reserved !== "0" ? ` + ${d.reserved}` : "";
      return el("div", { class: "resource", "data-resource": row.resource },
        el("span", { class: "resource-name" }, row.resource), bar,
        el("span", { class: "amounts" }, `${d.used}${reserved} / ${d.allocatable}`),
        el("span", { class: "free" }, `${d.free} free`));
    }));
    // Kueue mode: the worker's ClusterQueue quota, which a nomination must fit too.
    const quota = !cluster.quota ? null : cluster.quota.read
      ? el("div", { class: "quota" }, ...cluster.quota.clusterQueues.map((queue) =>
        el("div", { class: "cluster-queue", "data-cluster-queue": queue.name },
          `ClusterQueue ${queue.name}: ` + queue.resources.map((r) =>
            `${r.resource} (${r.flavor}) ${r.free} free of ${r.nominal}` +
            (r.held !== "0" ? `, ${r.held} held` : "")).join("; "))))
      : el("div", { class: "quota" }, `quota not read: ${cluster.quota.why}`);
    return el("tr", { "data-cluster": cluster.name, "data-active": String(cluster.active) },
      el("td", { class: "name" }, cluster.name),
      el("td", { class: "active" },
        el("span", { class: `badge ${cluster.active ? "ok" : "bad"}` }, cluster.active ? "True" : "False")),
      el("td", { class: "reason", title: cluster.message }, cluster.reason,
        cluster.active ? null : el("div", { class: "message" }, cluster.message)),
      el("td", { class: "jobs" }, cluster.jobs),
      el("td", { class: "nodes" }, `${cluster.usableNodes}/${cluster.nodes}`),
      el("td", { class: "capacity-cell" }, capacity, quota));
  });
  document.querySelector("#clusters tbody").replaceChildren(...rows);
  document.getElementById("no-clusters").hidden = clusters.length > 0;
}

// Conditions whose True (or False) is bad news; every other one is shown plainly.
const BAD_WHEN = { Failed: "True", Placed: "False", WorkerReachable: "False", Created: "False" };

function conditionChips(conditions) {
  return el("div", { class: "conditions" }, ...conditions.map((cond) =>
    el("span", {
      class: `chip ${BAD_WHEN[cond.type] === cond.status ? "bad" : cond.status === "True" ? "true" : "other"}`,
      "data-type": cond.type,
      title: [cond.reason, cond.message, cond.lastTransitionTime].filter(Boolean).join(" — "),
    }, `${cond.type}${cond.status === "True" ? "" : "=" + cond.status}`,
    cond.reason ? el("small", {}, ` ${cond.reason}`) : null)));
}

function jobsStatus(entries) {
  return el("div", { class: "jobs-status" }, ...entries.map((entry) => {
    const counts = ["active", "ready", "succeeded", "failed", "suspended"]
      .filter((key) => entry[key]).map((key) => `${key} ${entry[key]}`);
    return el("div", {}, `${entry.name}: ${counts.length ? counts.join(" · ") : "–"}`);
  }));
}

function renderJobs(state) {
  const filters = filterValues();
  const jobs = state.trainJobs;
  const workers = state.clusters.map((c) => c.name);
  fillSelect(document.getElementById("filter-state"), jobs.map((j) => j.state), filters.state);
  fillSelect(document.getElementById("filter-cluster"),
    [...workers, ...jobs.map((j) => j.worker || NOT_PLACED)], filters.cluster,
    { [NOT_PLACED]: "(not placed)" });
  fillSelect(document.getElementById("filter-namespace"), jobs.map((j) => j.namespace),
    filters.namespace);

  const shown = jobs.filter((job) => matches(job, filters));
  const selected = selectedJob();
  const rows = shown.map((job) => {
    let lag = seconds(job.syncLagSeconds);
    if (job.syncWaitingSeconds !== null) lag = `waiting ${seconds(job.syncWaitingSeconds)}`;
    const key = `${job.namespace}/${job.name}`;
    return el("tr", {
      "data-key": key, "data-state": job.state,
      "data-worker": job.worker, class: key === selected ? "job selected" : "job",
      title: "click: the job's Pods, Events and logs on its worker",
    },
      el("td", { class: "namespace" }, job.namespace),
      el("td", { class: "name" }, job.name),
      el("td", { class: "state" },
        el("span", { class: `badge state-${job.state.toLowerCase()}` }, job.state),
        job.reason ? el("span", { class: "reason" }, ` ${job.reason}`) : null,
        job.waitingPosition ? el("span", {
          class: "waiting-position",
          title: "place in the waiting line: highest priority first, then oldest",
        }, ` #${job.waitingPosition} in line, priority ${job.priority}`) : null,
        job.message ? el("div", { class: "message" }, job.message) : null),
      el("td", { class: "worker" }, job.worker || "–"),
      el("td", { class: "conditions-cell" }, conditionChips(job.conditions)),
      el("td", { class: "jobs-status-cell" }, jobsStatus(job.jobsStatus)),
      el("td", { class: "age", title: job.created }, job.age),
      el("td", { class: `lag${job.syncWaitingSeconds !== null ? " waiting" : ""}` }, lag));
  });
  // The open job's panel is one element kept across redraws (its open logs stay open).
  const at = rows.findIndex((row) => row.dataset.key === selected);
  if (at >= 0) rows.splice(at + 1, 0, detail.row);
  document.querySelector("#jobs tbody").replaceChildren(...rows);
  document.getElementById("no-jobs").hidden = shown.length > 0;
  document.getElementById("job-count").textContent =
    shown.length === jobs.length ? `(${jobs.length})` : `(${shown.length} of ${jobs.length})`;
  document.getElementById("state-counts").replaceChildren(
    ...Object.entries(state.counts).map(([name, count]) =>
      el("span", { class: `badge state-${name.toLowerCase()}`, "data-state": name },
        `${name} ${count}`)));
}

function render(state) {
  document.getElementById("role").textContent = state.role;
  document.getElementById("origin").textContent = `origin ${state.origin}`;
  document.getElementById("updated").textContent = `updated ${state.generatedAt}`;
  renderClusters(state.clusters);
  renderJobs(state);
}

function setConnection(live, text) {
  const badge = document.getElementById("connection");
  badge.dataset.live = String(live);
  badge.className = `badge ${live ? "ok" : "bad"}`;
  badge.textContent = text;
}

async function poll() {
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`/api/state answered ${response.status}`);
    latest = await response.json();
    render(latest);
    setConnection(true, "live");
  } catch (err) {
    // Keep the last picture on screen, but say it is stale.
    setConnection(false, `disconnected: ${err.message}`);
  } finally {
    window.setTimeout(poll, POLL_MS);
  }
}

// --- one job's life on its worker ------------------------------------------------------

const detail = {
  row: null,        // the <tr> holding the panel, placed under the open job's row
  key: "",          // the open job, namespace/name
  generation: 0,    // bumped on every open and close: late answers for another are dropped
  timer: null,
  read: false,      // whether the open job was read once (a hidden tab then waits)
  logs: new Map(),  // pod name -> its log panel (a <details>)
};

function selectedJob() {
  return new URLSearchParams(window.location.search).get("job") || "";
}

function jobState(key) {
  const job = latest && latest.trainJobs.find((j) => `${j.namespace}/${j.name}` === key);
  return job ? job.state : "";
}

function buildDetail() {
  const cell = el("td", { colspan: "8" },
    el("div", { class: "detail-head" },
      el("strong", { class: "detail-title" }), " ",
      el("span", { class: "detail-status muted" }), " ",
      el("button", { type: "button", class: "detail-close" }, "close")),
    el("div", { class: "detail-problem", hidden: "" }),
    el("h3", {}, "Pods"),
    el("table", { class: "pods" },
      el("thead", {}, el("tr", {}, ...["Pod", "Worker", "Node", "Phase", "Ready", "Restarts",
        "Last termination", "Started"].map((name) => el("th", {}, name)))),
      el("tbody")),
    el("p", { class: "no-pods muted", hidden: "" }, "No Pod of this job on its worker."),
    el("h3", {}, "Events on the worker"),
    el("table", { class: "events" },
      el("thead", {}, el("tr", {}, ...["Last seen", "Type", "Reason", "Object", "Message"]
        .map((name) => el("th", {}, name)))),
      el("tbody")),
    el("p", { class: "no-events muted", hidden: "" }, "No Event about this job on its worker."),
    el("h3", {}, `Logs (last ${TAIL_LINES} lines)`),
    el("div", { class: "logs" }));
  detail.row = el("tr", { id: "job-detail", class: "job-detail" }, cell);
  cell.querySelector(".detail-close").addEventListener("click", () => select(""));
}

function select(key) {
  const params = new URLSearchParams(window.location.search);
  if (key) params.set("job", key); else params.delete("job");
  const query = params.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
  openDetail(key);
  if (latest) render(latest);
}

function openDetail(key) {
  detail.generation += 1;
  window.clearTimeout(detail.timer);
  detail.key = key;
  detail.read = false;
  detail.logs.clear();
  const row = detail.row;
  row.querySelector(".detail-title").textContent = key ? `TrainJob ${key}` : "";
  row.querySelector(".detail-status").textContent = key ? "reading its worker…" : "";
  for (const part of [".pods tbody", ".events tbody", ".logs"]) row.querySelector(part).replaceChildren();
  showProblem("");
  if (key) pollDetail(detail.generation);
}

function showProblem(text) {
  const problem = detail.row.querySelector(".detail-problem");
  problem.textContent = text;
  problem.hidden = !text;
}

// An answer's body as JSON; a refusal (a Status) becomes an error with its message.
async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch (err) { body = null; }
  if (!response.ok) {
    const why = body && body.message ? body.message : `${url.split("?")[0]} answered ${response.status}`;
    const error = new Error(why);
    error.code = response.status;
    throw error;
  }
  return body;
}

function jobQuery(key) {
  const [namespace, name] = key.split("/");
  return new URLSearchParams({ namespace, name });
}

async function pollDetail(generation) {
  const key = detail.key;
  const final = FINAL_STATES.includes(jobState(key));
  if (document.hidden && detail.read) {
    // A tab out of sight asks nothing of the worker; it reads again once looked at.
    detail.timer = window.setTimeout(() => pollDetail(generation), DETAIL_POLL_MS);
    return;
  }
  try {
    const life = await getJSON(`/api/job?${jobQuery(key)}`);
    if (generation !== detail.generation) return;
    showProblem("");
    renderLife(life);
    // One log at a time: a page never holds more than one of the dashboard's log reads.
    for (const panel of detail.logs.values()) {
      if (panel.open && !panel.justOpened) await readLog(panel, generation);
      panel.justOpened = false;
      if (generation !== detail.generation) return;
    }
    detail.row.querySelector(".detail-status").textContent = final
      ? `on worker ${life.worker}; read at ${new Date().toLocaleTimeString()} (the job has ended: not followed)`
      : `on worker ${life.worker}; following, read at ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (generation !== detail.generation) return;
    showProblem(err.message);
    detail.row.querySelector(".detail-status").textContent = "";
  }
  detail.read = true;
  // Followed while the job runs; an ended job is read once (open the row again to re-read).
  if (generation === detail.generation && !final) {
    detail.timer = window.setTimeout(() => pollDetail(generation), DETAIL_POLL_MS);
  }
}

function termination(last) {
  if (!last) return "–";
  return `${last.reason || "Terminated"} (exit ${last.exitCode})` +
    (last.container ? ` in ${last.container}` : "");
}

function renderLife(life) {
  const row = detail.row;
  row.querySelector(".pods tbody").replaceChildren(...life.pods.map((pod) => {
    const s = pod.status;
    return el("tr", { "data-pod": pod.metadata.name, "data-phase": s.phase },
      el("td", { class: "pod-name" }, pod.metadata.name),
      el("td", { class: "pod-worker" }, s.worker),
      el("td", { class: "pod-node" }, s.node || "–"),
      el("td", { class: "pod-phase" }, s.phase),
      el("td", { class: "pod-ready" }, s.ready),
      el("td", { class: "pod-restarts" }, s.restarts),
      el("td", { class: "pod-termination" }, termination(s.lastTermination)),
      el("td", { class: "pod-started" }, s.startTime || "–"));
  }));
  row.querySelector(".no-pods").hidden = life.pods.length > 0;
  row.querySelector(".events tbody").replaceChildren(...life.events.map((event) =>
    el("tr", { class: event.type === "Warning" ? "warning" : "" },
      el("td", {}, event.lastTimestamp || ""),
      el("td", {}, event.type),
      el("td", {}, event.reason),
      el("td", {}, event.object),
      el("td", { class: "message" }, event.message + (event.count > 1 ? ` (×${event.count})` : "")))));
  row.querySelector(".no-events").hidden = life.events.length > 0;
  if (life.eventsOmitted) {
    row.querySelector(".events tbody").prepend(el("tr", {}, el("td", { colspan: "5", class: "muted" },
      `${life.eventsOmitted} older Events not shown`)));
  }
  // One log panel per Pod; the first running one (else the first) is open to begin with.
  const names = life.pods.map((pod) => pod.metadata.name);
  for (const name of [...detail.logs.keys()]) {
    if (!names.includes(name)) { detail.logs.get(name).remove(); detail.logs.delete(name); }
  }
  const first = life.pods.find((pod) => pod.status.phase === "Running") || life.pods[0];
  const opening = detail.logs.size === 0;
  const panels = life.pods.map((pod) => {
    let panel = detail.logs.get(pod.metadata.name);
    if (!panel) {
      panel = logPanel(pod);
      detail.logs.set(pod.metadata.name, panel);
      if (opening && pod === first) {
        panel.justOpened = true;  // read by its toggle event, not twice
        panel.open = true;
      }
    }
    return panel;
  });
  row.querySelector(".logs").replaceChildren(...panels);
}

function logPanel(pod) {
  const containers = pod.status.containers || [];
  const choice = el("select", { class: "log-container" },
    ...containers.map((name) => el("option", { value: name }, name)));
  const panel = el("details", { class: "pod-log", "data-pod": pod.metadata.name },
    el("summary", {}, `${pod.metadata.name}`),
    containers.length > 1 ? el("label", {}, "container ", choice) : null,
    el("div", { class: "log-status muted" }),
    el("pre", { class: "log-text" }));
  panel.container = () => (containers.length > 1 ? choice.value : containers[0] || "");
  const now = () => readLog(panel, detail.generation);
  panel.addEventListener("toggle", () => { if (panel.open) now(); });
  choice.addEventListener("change", now);
  return panel;
}

async function readLog(panel, generation) {
  const query = jobQuery(detail.key);
  query.set("pod", panel.dataset.pod);
  if (panel.container()) query.set("container", panel.container());
  query.set("tailLines", String(TAIL_LINES));
  const status = panel.querySelector(".log-status");
  try {
    const log = await getJSON(`/api/job/log?${query}`);
    if (generation !== detail.generation) return;
    const text = panel.querySelector(".log-text");
    // Stay at the bottom while following, unless the reader has scrolled up.
    const atEnd = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
    text.textContent = log.text;
    if (atEnd) text.scrollTop = text.scrollHeight;
    status.textContent = log.text ? (log.truncated ? "its end only (more than 64 KiB)" : "")
      : "(nothing logged)";
    status.classList.remove("bad");
  } catch (err) {
    if (generation !== detail.generation) return;
    status.textContent = err.code === 429 ? `busy: ${err.message}` : err.message;
    status.classList.add("bad");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  buildDetail();
  document.querySelector("#jobs tbody").addEventListener("click", (event) => {
    const row = event.target.closest("tr.job");
    if (!row) return;
    select(row.dataset.key === detail.key ? "" : row.dataset.key);
  });
  if (selectedJob()) openDetail(selectedJob());
  for (const name of FILTERS) {
    document.getElementById(`filter-${name}`)
      .addEventListener("change", (event) => setFilter(name, event.target.value));
  }
  document.getElementById("filters").addEventListener("reset", (event) => {
    event.preventDefault();
    // Clearing the filters keeps the open job open.
    const job = selectedJob();
    window.history.replaceState(null, "", job ? `?${new URLSearchParams({ job })}` : window.location.pathname);
    if (latest) render(latest);
  });
  poll();
});
