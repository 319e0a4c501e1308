// The dispatcher's dashboard: polls /api/state (built from the dispatcher's caches) and
// redraws the tables. Filters live in the URL query (?state=&cluster=&namespace=), so a
// filtered view can be shared and survives a reload. Text goes in through textContent only.
"use strict";

const POLL_MS = 1000;
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
  const rows = shown.map((job) => {
    let lag = seconds(job.syncLagSeconds);
    if (job.syncWaitingSeconds !== null) lag = `waiting ${seconds(job.syncWaitingSeconds)}`;
    return el("tr", {
      "data-key": `${job.namespace}/${job.name}`, "data-state": job.state,
      "data-worker": job.worker,
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

document.addEventListener("DOMContentLoaded", () => {
  for (const name of FILTERS) {
    document.getElementById(`filter-${name}`)
      .addEventListener("change", (event) => setFilter(name, event.target.value));
  }
  document.getElementById("filters").addEventListener("reset", (event) => {
    event.preventDefault();
    window.history.replaceState(null, "", window.location.pathname);
    if (latest) render(latest);
  });
  poll();
});
