// spark-storm UI: every page polls the REST API (/api/v1/) and redraws in place.
// Text from the cluster is always set with textContent, never as HTML.
"use strict";

const DASH = "\u2014";
const params = new URLSearchParams(location.search);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "href" || k === "title" || k === "id") node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

const fmt = {
  int: (v) => (v === null || v === undefined ? DASH : Number(v).toLocaleString("en-US")),
  num: (v, digits = 1) =>
    v === null || v === undefined ? DASH : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits }),
  str: (v) => (v === null || v === undefined || v === "" ? DASH : String(v)),
  ms: (v) => (v === null || v === undefined ? DASH : `${Number(v).toFixed(3)}`),
  bytes: (v) => (v === null || v === undefined ? DASH : `${(v / 1048576).toFixed(1)} MiB`),
  size: (v) => {
    if (v === null || v === undefined) return DASH;
    if (v < 1024) return `${v} B`;
    if (v < 1048576) return `${(v / 1024).toFixed(1)} KiB`;
    return `${(v / 1048576).toFixed(1)} MiB`;
  },
  time: (t) => (t === null || t === undefined ? DASH : new Date(t * 1000).toLocaleTimeString("en-GB")),
  secsAgo: (s) => (s === null || s === undefined ? DASH : `${s}s ago`),
};

function badge(text, extraClass) {
  const cls = String(text).split(" ")[0];
  return el("span", { class: `badge ${cls} ${extraClass || ""}`, "data-status": text }, text);
}

function capacityCell(cap) {
  const v = cap === null || cap === undefined ? null : Number(cap);
  const cls = v === null ? "num" : v >= 0.8 ? "num hot" : v >= 0.5 ? "num warm" : "num";
  return el("td", { class: cls, "data-field": "capacity" }, v === null ? DASH : v.toFixed(3));
}

// A table whose rows are keyed, so a refresh replaces rows without losing the table.
function fillTable(tbody, rows, emptyText, columns) {
  tbody.replaceChildren();
  if (!rows.length) {
    tbody.append(el("tr", {}, el("td", { class: "empty", colSpan: columns }, emptyText)));
    return;
  }
  for (const r of rows) tbody.append(r);
}

function cell(field, value, cls) {
  return el("td", { class: cls || "", "data-field": field }, value);
}

async function api(path, options) {
  const resp = await fetch(`/api/v1/${path}`, options);
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    body = null;
  }
  if (!resp.ok) {
    const msg = body && body.errorMessage ? body.errorMessage : `${resp.status} ${resp.statusText}`;
    const err = new Error(msg);
    err.status = resp.status;
    throw err;
  }
  return body;
}

function setUpdated(ok, sampledAt, text) {
  const node = document.getElementById("updated");
  if (!node) return;
  node.classList.toggle("stale", !ok);
  node.textContent = ok ? `updated ${fmt.time(sampledAt)}` : `not updated: ${text}`;
}

function poll(fn, intervalMs) {
  let wait = intervalMs;
  const tick = async () => {
    try {
      const next = await fn();
      if (next) wait = Math.max(500, next);
    } catch (e) {
      setUpdated(false, null, e.message);
    }
    setTimeout(tick, wait);
  };
  tick();
}

function showMessage(kind, text) {
  const box = document.getElementById("message");
  box.className = kind;
  box.textContent = text;
}

// ------------------------------------------------------------------ cluster page
async function refreshCluster() {
  const [summary, topologies, supervisors, nimbus] = await Promise.all([
    api("cluster/summary"),
    api("topology/summary"),
    api("supervisor/summary"),
    api("nimbus/summary"),
  ]);
  const stats = document.getElementById("cluster-stats");
  const leader = summary.nimbusLeader || (summary.clusterKind === "local-cluster" ? "none (local cluster)" : "none: start spark-storm nimbus");
  stats.replaceChildren(
    ...[
      ["Cluster", summary.clusterKind],
      ["Nimbus leader", leader],
      ["Supervisors", fmt.int(summary.supervisors)],
      ["Slots used / total", `${fmt.int(summary.slotsUsed)} / ${fmt.int(summary.slotsTotal)}`],
      ["Topologies", fmt.int(summary.topologies)],
      ["Executors", fmt.int(summary.executorsTotal)],
      ["Tasks", fmt.int(summary.tasksTotal)],
    ].map(([label, value]) => el("div", { class: "stat" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value))),
  );
  document.getElementById("cluster-source").textContent = `${summary.source} \u00b7 ${summary.stormVersion}`;
  fillTable(
    document.querySelector("#topologies tbody"),
    topologies.topologies.map((t) =>
      el(
        "tr",
        { "data-topology": t.id },
        el("td", {}, el("a", { href: `topology.html?id=${encodeURIComponent(t.id)}` }, t.name)),
        el("td", {}, badge(t.status)),
        cell("uptime", fmt.str(t.uptime)),
        cell("workers", fmt.int(t.workersTotal), "num"),
        cell("executors", fmt.int(t.executorsTotal), "num"),
        cell("tasks", fmt.int(t.tasksTotal), "num"),
      ),
    ),
    "no running topology found",
    6,
  );
  fillTable(
    document.querySelector("#supervisors tbody"),
    supervisors.supervisors.map((s) =>
      el("tr", { "data-supervisor": s.id }, cell("id", s.id), cell("host", s.host), cell("uptime", fmt.str(s.uptime)), cell("slots", `${s.slotsUsed} / ${s.slotsTotal}`, "num")),
    ),
    "no supervisor (no live worker)",
    4,
  );
  fillTable(
    document.querySelector("#slots tbody"),
    supervisors.workers.map((w) =>
      el(
        "tr",
        {},
        cell("slot", w.id),
        cell("supervisor", fmt.str(w.supervisorId)),
        el("td", {}, el("a", { href: `topology.html?id=${encodeURIComponent(w.topologyId)}` }, w.topologyName)),
        el("td", {}, badge(w.status)),
        cell("uptime", fmt.str(w.uptime)),
        cell("rss", fmt.bytes(w.rssBytes), "num"),
        cell("executors", fmt.int(w.executorsTotal), "num"),
      ),
    ),
    "no slot in use",
    7,
  );
  fillTable(
    document.querySelector("#nimbus tbody"),
    nimbus.nimbuses.map((n) => el("tr", { "data-nimbus": n.id }, cell("host", n.id || `${n.host}:${n.port}`), el("td", {}, badge(n.status)), cell("uptime", fmt.str(n.nimbusUpTime)), cell("version", fmt.str(n.version)))),
    summary.clusterKind === "local-cluster" ? "a local cluster has no nimbus (cluster mode has one)" : "no nimbus found",
    4,
  );
  setUpdated(true, summary.sampledAt);
  return summary.sampleIntervalMs;
}

// ------------------------------------------------------------------ topology page
let currentTopology = null; // the last reading: the rebalance dialog starts from its worker count
const compact = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });
const charts = new Map(); // component -> {plot, node, title}
window.sparkStormCharts = charts; // read by the browser test: what each chart holds

function drawCharts(history) {
  const box = document.getElementById("charts");
  const note = document.getElementById("charts-note");
  if (typeof window.uPlot === "undefined") {
    note.textContent = "Charts need uPlot: run scripts/fetch-ui-assets (scripts/setup does) and reload.";
    return;
  }
  const times = history.times;
  const names = Object.keys(history.executedPerSecond);
  note.textContent = times.length
    ? `tuples executed per second, last ${Math.round((times[times.length - 1] - times[0]) / 60 * 10) / 10} min`
    : "collecting samples\u2026";
  for (const name of names) {
    const values = history.executedPerSecond[name];
    let entry = charts.get(name);
    if (!entry) {
      const node = el("div", { class: "chart", "data-component": name });
      const title = el("div", { class: "title" }, el("b", {}, name), el("span", { class: "now" }, ""));
      node.append(title);
      box.append(node);
      const width = Math.max(260, node.clientWidth - 16);
      const plot = new window.uPlot(
        {
          width,
          height: 130,
          legend: { show: false },
          cursor: { show: true, points: { show: false } },
          scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
          axes: [
            {
              stroke: "#667085",
              grid: { stroke: "#eef0f3" },
              ticks: { stroke: "#e3e6eb" },
              font: "11px system-ui",
              space: 70,
              values: (u, splits) => splits.map((t) => new Date(t * 1000).toLocaleTimeString("en-GB")),
            },
            {
              stroke: "#667085",
              grid: { stroke: "#eef0f3" },
              ticks: { stroke: "#e3e6eb" },
              size: 50,
              font: "11px system-ui",
              values: (u, splits) => splits.map((v) => compact.format(v)),
            },
          ],
          series: [{}, { label: "executed/s", stroke: "#2f6fad", width: 1.5, fill: "rgba(47,111,173,0.12)", points: { show: false } }],
        },
        [[], []],
        node,
      );
      entry = { plot, node, title };
      charts.set(name, entry);
    }
    entry.plot.setData([times, values.map((v) => (v === null ? null : v))]);
    const known = values.filter((v) => v !== null);
    entry.title.querySelector(".now").textContent = known.length ? `peak ${fmt.num(Math.max(...known))} /s` : DASH;
    entry.node.setAttribute("data-points", String(values.filter((v) => v !== null).length));
  }
}

function actionButtons(topo) {
  const a = topo.actions || {};
  const status = topo.status;
  document.getElementById("btn-activate").disabled = !a.activate || status === "ACTIVE" || status === "KILLED";
  document.getElementById("btn-deactivate").disabled = !a.deactivate || status === "INACTIVE" || status === "KILLED";
  const reb = document.getElementById("btn-rebalance");
  reb.disabled = status === "KILLED";
  reb.title = a.rebalance ? "rebalance the topology" : "a local cluster cannot rebalance: this needs cluster mode (the API answers 501)";
  document.getElementById("btn-kill").disabled = !a.kill || status === "KILLED";
  const sp = document.getElementById("btn-savepoint");
  sp.disabled = !a.savepoint || status === "KILLED";
  sp.title = a.savepoint ? "write a savepoint of every stateful task" : "the topology keeps no state: nothing to save";
}

async function refreshTopology() {
  const id = params.get("id");
  let topo;
  try {
    topo = await api(`topology/${encodeURIComponent(id)}`);
  } catch (e) {
    if (e.status === 404) {
      document.getElementById("status").replaceChildren(badge("KILLED"));
      showMessage("error", e.message);
      setUpdated(true, Date.now() / 1000);
      return 2000;
    }
    throw e;
  }
  const history = await api(`topology/${encodeURIComponent(id)}/history`);
  document.title = `${topo.name} \u00b7 spark-storm UI`;
  document.getElementById("name").textContent = topo.name;
  document.getElementById("crumb").textContent = topo.name;
  document.getElementById("status").replaceChildren(badge(topo.status));
  const totals = topo.topologyStats[0];
  currentTopology = topo;
  const workers = topo.workersRequested === null || topo.workersRequested === undefined
    ? fmt.int(topo.workersTotal)
    : `${fmt.int(topo.workersTotal)} of ${fmt.int(topo.workersRequested)}`;
  const assignment = topo.assignmentVersion === null || topo.assignmentVersion === undefined ? [] : [["Assignment", `v${topo.assignmentVersion}`]];
  document.getElementById("topology-stats").replaceChildren(
    ...[
      ["Status", topo.status],
      ["Uptime", fmt.str(topo.uptime)],
      ["Workers", workers],
      ...assignment,
      ["Executors", fmt.int(topo.executorsTotal)],
      ["Tasks", fmt.int(topo.tasksTotal)],
      ...(topo.committedEpoch === null || topo.committedEpoch === undefined ? [] : [["Committed epoch", fmt.int(topo.committedEpoch)]]),
      ["Emitted", fmt.int(totals.emitted)],
      ["Acked", fmt.int(totals.acked)],
      ["Failed", fmt.int(totals.failed)],
    ].map(([label, value]) =>
      el("div", { class: "stat", "data-stat": label.toLowerCase() }, el("div", { class: "label" }, label), el("div", { class: "value" }, value)),
    ),
  );
  actionButtons(topo);
  const components = [...topo.spouts, ...topo.bolts].sort((x, y) => x.componentId.localeCompare(y.componentId));
  fillTable(
    document.querySelector("#components tbody"),
    components.map((c) =>
      el(
        "tr",
        { "data-component": c.componentId },
        el(
          "td",
          {},
          el("a", { href: `component.html?topology=${encodeURIComponent(topo.id)}&id=${c.encodedId}` }, c.componentId),
          c.type === "source" ? el("span", { class: "tag", title: "entry component: Spark or a client sends to it" }, "source") : null,
        ),
        cell("executors", fmt.int(c.executors), "num"),
        cell("tasks", fmt.int(c.tasks), "num"),
        cell("executed", fmt.int(c.executed), "num"),
        cell("emitted", fmt.int(c.emitted), "num"),
        cell("acked", fmt.int(c.acked), "num"),
        cell("failed", fmt.int(c.failed), c.failed ? "num hot" : "num"),
        cell("rate", fmt.num(c.rate), "num"),
        cell("executeLatency", fmt.str(c.executeLatency), "num"),
        cell("latencyP50Ms", fmt.ms(c.latencyP50Ms), "num"),
        cell("latencyP99Ms", fmt.ms(c.latencyP99Ms), "num"),
        capacityCell(c.capacity),
        cell("queue", `${fmt.int(c.queuePopulation)} / ${fmt.int(c.queueCapacity)}`, "num"),
        cell("backpressure", c.backpressureExecutors ? badge(`${c.backpressureExecutors} exec`, "bp") : "no"),
        cell("errors", fmt.int(c.errorCount), c.errorCount ? "num hot" : "num"),
      ),
    ),
    "no component reported by a reachable worker",
    15,
  );
  fillTable(
    document.querySelector("#executors tbody"),
    topo.executorStats.map((x) =>
      el(
        "tr",
        { "data-executor": x.id },
        cell("id", x.id),
        cell("worker", x.worker),
        cell("executed", fmt.int(x.executed), "num"),
        cell("rate", fmt.num(x.rate), "num"),
        capacityCell(x.capacity),
        cell("queue", `${fmt.int(x.queue.population)} / ${fmt.int(x.queue.capacity)}`, "num"),
        cell("arrival", fmt.num(x.queue.arrivalRate), "num"),
        cell("overflow", fmt.int(x.queue.overflow), "num"),
        cell("backpressure", x.backpressure ? badge("on", "bp") : x.backpressure === false ? "off" : DASH),
      ),
    ),
    "no executor reported",
    9,
  );
  fillTable(
    document.querySelector("#workers tbody"),
    topo.workers.map((w) =>
      el(
        "tr",
        { "data-worker": w.id },
        cell("host", fmt.str(w.host)),
        cell("port", fmt.str(w.port), "num"),
        cell("pid", fmt.str(w.pid), "num"),
        el("td", { title: w.error || "" }, badge(w.status)),
        cell("uptime", fmt.str(w.uptime)),
        cell("rss", fmt.bytes(w.rssBytes), "num"),
        cell("executors", fmt.int(w.executorsTotal), "num"),
        cell("heartbeat", fmt.secsAgo(w.lastHeartbeatSecs), "num"),
        cell("bad-payloads", fmt.int(w.badPayloads), "num"),
        cell("lost", `${fmt.int(w.lostPayloads)} / ${fmt.int(w.lostTuples)}`, "num"),
      ),
    ),
    "no worker",
    10,
  );
  const errNote = document.getElementById("errors-note");
  if (topo.errors === null) {
    errNote.textContent = "The workers do not report error details yet (only counts, in the Errors column above).";
    fillTable(document.querySelector("#errors tbody"), [], DASH, 5);
  } else {
    errNote.textContent = "";
    fillTable(
      document.querySelector("#errors tbody"),
      topo.errors.map((e) =>
        el("tr", {}, cell("time", `${fmt.time(e.errorTime)} (${fmt.secsAgo(e.errorLapsedSecs)})`), cell("worker", e.worker), cell("component", fmt.str(e.component)), cell("task", fmt.str(e.task), "num"), el("td", { class: "wrap" }, e.error)),
      ),
      "no error reported",
      5,
    );
  }
  const wrNote = document.getElementById("writers-note");
  if (topo.writers === null) {
    wrNote.textContent = "The workers do not report the Spark writers they see yet.";
    fillTable(document.querySelector("#writers tbody"), [], DASH, 9);
  } else {
    wrNote.textContent = "";
    fillTable(
      document.querySelector("#writers tbody"),
      topo.writers.map((w) =>
        el("tr", {}, cell("worker", w.worker), cell("query", fmt.str(w.queryId)), cell("batch", fmt.str(w.lastBatchId), "num"), cell("rows", fmt.int(w.rows), "num"), cell("groups", fmt.int(w.groups), "num"), cell("replays", fmt.int(w.replays), "num"), cell("failed", fmt.int(w.failed), w.failed ? "num hot" : "num"), cell("ackP50", fmt.str(w.ackLatencyP50Ms), "num"), cell("ackP99", fmt.str(w.ackLatencyP99Ms), "num")),
      ),
      "no Spark writer has sent to this topology yet",
      9,
    );
  }
  drawState(topo, components);
  drawCharts(history);
  document.getElementById("components").setAttribute("data-sampled-at", String(topo.sampledAt));
  setUpdated(true, topo.sampledAt);
  return topo.sampleIntervalMs;
}

// The cells of a component's (or an executor's) state, in the same order on both pages.
function stateCells(st) {
  return [
    cell("committedEpoch", fmt.int(st.committedEpoch), "num"),
    cell("checkpointEpoch", fmt.int(st.checkpointEpoch), "num"),
    cell("keys", fmt.int(st.keys), "num"),
    el("td", { class: "num", "data-field": "lastCheckpointBytes", title: st.lastCheckpointBytes === null ? "" : `${st.lastCheckpointBytes} bytes` }, fmt.size(st.lastCheckpointBytes)),
    cell("checkpointP50Ms", fmt.ms(st.checkpointP50Ms), "num"),
    cell("checkpointP99Ms", fmt.ms(st.checkpointP99Ms), "num"),
    cell("checkpoints", fmt.int(st.checkpoints), "num"),
    cell("restores", fmt.int(st.restores), "num"),
    cell("rollbacks", fmt.int(st.rollbacks), st.rollbacks ? "num warm" : "num"),
  ];
}

function drawState(topo, components) {
  const card = document.getElementById("state-card");
  const stateful = components.filter((c) => c.state);
  const workers = topo.checkpoints || [];
  card.hidden = !stateful.length && !workers.length;
  if (card.hidden) return;
  fillTable(
    document.querySelector("#state tbody"),
    stateful.map((c) =>
      el(
        "tr",
        { "data-component": c.componentId },
        el("td", {}, el("a", { href: `component.html?topology=${encodeURIComponent(topo.id)}&id=${c.encodedId}` }, c.componentId)),
        ...stateCells(c.state),
      ),
    ),
    "no stateful component reported by a reachable worker",
    10,
  );
  fillTable(
    document.querySelector("#checkpoints tbody"),
    workers.map((w) =>
      el(
        "tr",
        { "data-worker": w.worker },
        cell("worker", w.worker),
        cell("provider", fmt.str(w.provider), "wrap"),
        cell("epoch", fmt.int(w.epoch), "num"),
        cell("committed", fmt.int(w.committed), "num"),
        cell("generation", fmt.int(w.generation), "num"),
        el(
          "td",
          { "data-field": "dirty", title: (w.reasons || []).join("\n") },
          w.dirty ? badge("dirty") : w.dirty === false ? badge("clean") : DASH,
          w.dirty && w.reasons && w.reasons.length ? el("span", { class: "reasons" }, ` ${w.reasons.join("; ")}`) : null,
          w.replaying ? el("span", { class: "tag" }, "replaying") : null,
        ),
        cell("rollbacks", fmt.int(w.rollbacks), w.rollbacks ? "num warm" : "num"),
        cell("replayedRecords", fmt.int(w.replayedRecords), "num"),
        cell("committedEpochs", fmt.int(w.committedEpochs), "num"),
        cell("lastCommit", w.lastCommitLapsedSecs === null ? DASH : fmt.secsAgo(Math.round(w.lastCommitLapsedSecs)), "num"),
      ),
    ),
    topo.checkpoints === null ? DASH : "no worker reports checkpoints",
    10,
  );
  document.getElementById("state-note").textContent = topo.checkpoints === null ? "The workers do not report their checkpoint view." : "";
}

function setupActions() {
  const dialog = document.getElementById("confirm");
  const text = document.getElementById("confirm-text");
  const waitRow = document.getElementById("confirm-wait-row");
  const wait = document.getElementById("confirm-wait");
  const workersRow = document.getElementById("confirm-workers-row");
  const workers = document.getElementById("confirm-workers");
  const dirRow = document.getElementById("confirm-dir-row");
  const dir = document.getElementById("confirm-dir");
  let pending = null;
  const ask = (op, question, needsWait) => {
    pending = op;
    text.textContent = question;
    waitRow.style.display = needsWait ? "" : "none";
    workersRow.style.display = op === "rebalance" ? "" : "none";
    dirRow.style.display = op === "savepoint" ? "" : "none";
    if (op === "rebalance" && currentTopology) workers.value = String(currentTopology.workersRequested || currentTopology.workersTotal || 1);
    dialog.showModal();
  };
  const id = params.get("id");
  document.getElementById("btn-activate").onclick = () => ask("activate", `Activate topology ${id}? Its executors consume again.`, false);
  document.getElementById("btn-deactivate").onclick = () =>
    ask("deactivate", `Deactivate topology ${id}? Executors stop consuming; their queues fill and hold senders back.`, false);
  document.getElementById("btn-rebalance").onclick = () =>
    ask("rebalance", `Rebalance topology ${id}? Nimbus reassigns its executors over this many workers.`, true);
  document.getElementById("btn-savepoint").onclick = () =>
    ask("savepoint", `Write a savepoint of topology ${id}? Every stateful task's committed state at one epoch goes into a new folder of this directory (every worker must be able to write it).`, false);
  document.getElementById("btn-kill").onclick = () => {
    const cluster = currentTopology && currentTopology.clusterKind === "cluster";
    const when = cluster ? "now; nimbus removes the topology after the wait" : "after the wait";
    ask("kill", `Kill topology ${id}? Its workers drain and stop (ordered shutdown) ${when}.`, true);
  };
  document.getElementById("confirm-cancel").onclick = () => dialog.close();
  document.getElementById("confirm-ok").onclick = async () => {
    dialog.close();
    const op = pending;
    const path = op === "rebalance" || op === "kill" ? `${op}/${Math.max(0, parseInt(wait.value || "0", 10))}` : op;
    const options = { method: "POST" };
    if (op === "rebalance") {
      options.headers = { "Content-Type": "application/json" };
      options.body = JSON.stringify({ rebalanceOptions: { numWorkers: parseInt(workers.value || "1", 10) } });
    } else if (op === "savepoint") {
      options.headers = { "Content-Type": "application/json" };
      options.body = JSON.stringify({ dir: dir.value });
    }
    try {
      const r = await api(`topology/${encodeURIComponent(id)}/${path}`, options);
      const where = op === "savepoint" ? ` at epoch ${r.epoch}: ${r.path}` : "";
      showMessage("ok", `${r.topologyOperation} ${r.topologyId}: ${r.status}${where}`);
      await refreshTopology();
    } catch (e) {
      showMessage("error", `${op} failed: ${e.message}`);
    }
  };
}

// ------------------------------------------------------------------ component page
async function refreshComponent() {
  const tid = params.get("topology");
  const cid = params.get("id");
  const c = await api(`topology/${encodeURIComponent(tid)}/component/${encodeURIComponent(cid)}`);
  document.title = `${cid} \u00b7 ${c.name} \u00b7 spark-storm UI`;
  const link = document.getElementById("topology-link");
  link.textContent = c.name;
  link.href = `topology.html?id=${encodeURIComponent(tid)}`;
  document.getElementById("name").textContent = cid;
  document.getElementById("crumb").textContent = cid;
  document.getElementById("status").replaceChildren(badge(c.topologyStatus));
  document.getElementById("component-stats").replaceChildren(
    ...[
      ["Type", fmt.str(c.componentType)],
      ["Executors", fmt.int(c.executors)],
      ["Tasks", fmt.int(c.tasks)],
      ["Executed", fmt.int(c.executed)],
      ["Emitted", fmt.int(c.emitted)],
      ["Acked", fmt.int(c.acked)],
      ["Failed", fmt.int(c.failed)],
      ["Rate /s", fmt.num(c.rate)],
      ["Capacity", fmt.str(c.capacity)],
    ].map(([label, value]) => el("div", { class: "stat" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value))),
  );
  const st = c.state;
  const stateCard = document.getElementById("state-card");
  stateCard.hidden = !st;
  if (st) {
    document.getElementById("state-stats").replaceChildren(
      ...[
        ["Committed epoch", "committedEpoch", fmt.int(st.committedEpoch)],
        ["Written epoch", "checkpointEpoch", fmt.int(st.checkpointEpoch)],
        ["Keys", "keys", fmt.int(st.keys)],
        ["Last checkpoint", "lastCheckpointBytes", fmt.size(st.lastCheckpointBytes)],
        ["Checkpoint p50 ms", "checkpointP50Ms", fmt.ms(st.checkpointP50Ms)],
        ["Checkpoint p99 ms", "checkpointP99Ms", fmt.ms(st.checkpointP99Ms)],
        ["Checkpoints", "checkpoints", fmt.int(st.checkpoints)],
        ["Restores", "restores", fmt.int(st.restores)],
        ["Rollbacks", "rollbacks", fmt.int(st.rollbacks)],
      ].map(([label, field, value]) =>
        el("div", { class: "stat", "data-stat": field }, el("div", { class: "label" }, label), el("div", { class: "value" }, value)),
      ),
    );
    fillTable(
      document.querySelector("#state-executors tbody"),
      c.executorStats.filter((x) => x.state).map((x) => el("tr", { "data-executor": x.id }, cell("id", x.id), cell("worker", x.worker), ...stateCells(x.state))),
      "no executor reports state",
      11,
    );
  }
  fillTable(
    document.querySelector("#tasks tbody"),
    c.taskStats.map((t) =>
      el(
        "tr",
        { "data-task": t.task },
        cell("task", t.task, "num"),
        cell("executor", t.executor),
        cell("worker", `${t.host}:${t.port}`),
        cell("executed", fmt.int(t.executed), "num"),
        cell("emitted", fmt.int(t.emitted), "num"),
        cell("acked", fmt.int(t.acked), "num"),
        cell("failed", fmt.int(t.failed), "num"),
        cell("rate", fmt.num(t.rate), "num"),
        cell("executeLatency", fmt.str(t.executeLatency), "num"),
        cell("latencyP50Ms", fmt.ms(t.latencyP50Ms), "num"),
        cell("latencyP99Ms", fmt.ms(t.latencyP99Ms), "num"),
        cell("errors", fmt.int(t.errors), "num"),
      ),
    ),
    "no task",
    12,
  );
  fillTable(
    document.querySelector("#executors tbody"),
    c.executorStats.map((x) =>
      el("tr", {}, cell("id", x.id), cell("worker", x.worker), cell("executed", fmt.int(x.executed), "num"), cell("rate", fmt.num(x.rate), "num"), capacityCell(x.capacity), cell("queue", `${fmt.int(x.queue.population)} / ${fmt.int(x.queue.capacity)}`, "num"), cell("backpressure", x.backpressure ? badge("on", "bp") : "off")),
    ),
    "no executor",
    7,
  );
  const errs = c.componentErrors;
  document.getElementById("errors-note").textContent = errs === null ? "The workers do not report error details yet." : "";
  fillTable(
    document.querySelector("#errors tbody"),
    (errs || []).map((e) => el("tr", {}, cell("time", fmt.time(e.errorTime)), cell("worker", e.worker), cell("task", fmt.str(e.task), "num"), el("td", { class: "wrap" }, e.error))),
    errs === null ? DASH : "no error reported",
    4,
  );
  setUpdated(true, c.sampledAt);
  return c.sampleIntervalMs;
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "cluster") poll(refreshCluster, 1000);
  if (page === "topology") {
    setupActions();
    poll(refreshTopology, 1000);
  }
  if (page === "component") poll(refreshComponent, 1000);
});
