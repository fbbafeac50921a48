"""The REST API's JSON, in the shapes of Storm's UI REST API where the concept matches.

Field names follow Storm's ``/api/v1`` (``topologies[].uptimeSeconds``, ``bolts[].boltId``,
``executorStats``, ``componentErrors``...); Storm's string-typed decimals (``capacity``,
``executeLatency``) stay strings with three decimals.  What Storm has no field for is
added under our own names (``rate``, ``latencyP50Ms``, ``latencyP99Ms``, ``queue``,
``backpressure``, ``writers``).  A number the workers do not report is ``null`` — never a
made-up zero — and the pages show it as "—".

Rate and capacity are the workers' own: each worker's timer measures every task's rate
(executed per second) and its executor's capacity (time spent in ``execute`` per second,
Storm's definition, for the executor's thread) once a second, so every reader — this UI,
another one, a Prometheus scrape — sees the same figures.  For a worker that does not
report them, the UI measures them itself from two readings of the counters
``ui.rate.window.secs`` apart (executed delta / seconds; ``busy_s`` — else executed x mean
latency — delta / seconds).

A component's p50 and p99 come from its tasks' latency histograms (``latency_buckets``, the
tuples per log-scale bucket over the workers' last one to two windows), added bucket by
bucket: percentiles themselves cannot be combined, and the slowest task's p99 is not the
component's.

Stateful components (docs/design/state.md) also get ``state``: the last committed epoch (the lowest
its workers report: every task of the component is committed through it), the epoch its
tasks last wrote, keys (summed), bytes written by each executor's last checkpoint (summed),
checkpoint duration p50/p99 from the executors' duration histograms added bucket by bucket,
task checkpoints and restores from a checkpoint (summed over executors), and rollbacks (the
most any of its executors went through: a rollback rolls every executor back at once, so a
sum would count one rollback once per executor).  The topology adds ``checkpoints``, each
worker's view of the protocol (epoch, committed, generation, dirty and why, rollbacks,
replayed records).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from spark_storm import __version__
from spark_storm.latency import merge_buckets, percentile_of
from spark_storm.ui.sampler import ExecutorCounts, Sample, Snapshot, TopologyReading, WorkerReading, busy_ms
from spark_storm.ui.source import NimbusInfo

__all__ = [
    "chart_history",
    "cluster_summary",
    "component_detail",
    "nimbus_summary",
    "pretty_seconds",
    "supervisor_summary",
    "topology_detail",
    "topology_summary",
    "topology_workers",
]

_EXECUTOR = re.compile(r"^(?P<component>.*)\[(?P<first>-?\d+)-(?P<last>-?\d+)\]$")
_ERRORS_SHOWN = 50


def pretty_seconds(seconds: float | None) -> str | None:
    """Storm's uptime format: ``"3m 53s"``, ``"2h 0m 5s"``, ``"1d 0h 0m 0s"``."""
    if seconds is None:
        return None
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h {minutes}m {s}s"
    if hours:
        return f"{hours}h {minutes}m {s}s"
    if minutes:
        return f"{minutes}m {s}s"
    return f"{s}s"


def _f3(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def _tasks_of(executor: str) -> int:
    m = _EXECUTOR.match(executor)
    return int(m["last"]) - int(m["first"]) + 1 if m else 0


def _grow(before: float, after: float) -> float:
    """Growth of a counter; a smaller value means the worker restarted and counts from zero."""
    return after - before if after >= before else after


def _window(hist: Sequence[Sample], window_s: float) -> tuple[Sample, Sample] | None:
    """Return the newest sample and the oldest one at most ``window_s`` before it (at least the previous)."""
    if len(hist) < 2:
        return None
    last = hist[-1]
    first = hist[-2]
    for s in reversed(hist[:-1]):
        if last[0] - s[0] > window_s:
            break
        first = s
    return first, last


def _executor_rates(hist: Sequence[Sample], window_s: float) -> dict[tuple[str, str], tuple[float, float]]:
    """(worker, executor) -> (executed per second, capacity) over the window."""
    pair = _window(hist, window_s)
    if pair is None:
        return {}
    (t0, before), (t1, after) = pair
    dt = t1 - t0
    out = {}
    for key, now in after.items():
        then = before.get(key)
        if then is None or dt <= 0:
            continue
        out[key] = (_grow(then.executed, now.executed) / dt, _grow(then.busy_ms, now.busy_ms) / (dt * 1000))
    return out


def _status(reading: TopologyReading) -> str:
    if reading.ref.status:
        return reading.ref.status
    flags = []
    for w in reading.workers:
        if w.health is not None:
            flags.append(bool(w.health.get("active")))
        elif w.ref.alive:
            flags.append(w.ref.status == "running")
    if flags and all(flags):
        return "ACTIVE"
    if not any(flags):
        return "INACTIVE"
    return "PARTIALLY ACTIVE"


def _alive(reading: TopologyReading) -> list[WorkerReading]:
    return [w for w in reading.workers if w.ref.alive]


def _uptime(reading: TopologyReading) -> float | None:
    if reading.ref.uptime_s is not None:
        return reading.ref.uptime_s
    ups = [_worker_uptime(w) for w in _alive(reading)]
    known = [u for u in ups if u is not None]
    return max(known) if known else None


def _worker_uptime(w: WorkerReading) -> float | None:
    if w.health is not None and isinstance(w.health.get("uptime_s"), int | float):
        return float(w.health["uptime_s"])
    return w.ref.uptime_s


def _executor_names(reading: TopologyReading) -> list[str]:
    names: list[str] = []
    for w in _alive(reading):
        reported = w.health.get("executors") if w.health is not None else None
        names.extend(reported if isinstance(reported, Mapping) else w.ref.executors)
    return names


def _topology_row(reading: TopologyReading) -> dict[str, Any]:
    names = _executor_names(reading)
    up = _uptime(reading)
    return {
        "id": reading.ref.id,
        "encodedId": quote(reading.ref.id, safe=""),
        "name": reading.ref.name,
        "status": _status(reading),
        "uptime": pretty_seconds(up),
        "uptimeSeconds": None if up is None else int(up),
        "tasksTotal": sum(_tasks_of(n) for n in names),
        "workersTotal": len(_alive(reading)),
        "executorsTotal": len(names),
        "workersRequested": reading.ref.workers_requested,
        "assignmentVersion": reading.ref.assignment_version,
    }


# ---------------------------------------------------------------------- cluster pages
def cluster_summary(snap: Snapshot) -> dict[str, Any]:
    """``/api/v1/cluster/summary``."""
    state = snap.state
    total = sum(s.slots_total for s in state.supervisors)
    used = sum(s.slots_used for s in state.supervisors)
    rows = [_topology_row(r) for r in snap.topologies.values()]
    leader = next((n for n in state.nimbus if n.status == "Leader"), None)
    return {
        "stormVersion": f"spark-storm {__version__}",
        "clusterKind": state.kind,
        "source": state.description,
        "nimbusLeader": _nimbus_name(leader) if leader else None,
        "supervisors": len(state.supervisors),
        "topologies": len(rows),
        "slotsTotal": total,
        "slotsUsed": used,
        "slotsFree": total - used,
        "executorsTotal": sum(r["executorsTotal"] for r in rows),
        "tasksTotal": sum(r["tasksTotal"] for r in rows),
        "sampledAt": snap.time,
    }


def _nimbus_name(n: NimbusInfo) -> str:
    return n.id or f"{n.host}:{n.port}"


def nimbus_summary(snap: Snapshot) -> dict[str, Any]:
    """``/api/v1/nimbus/summary`` (empty for a local cluster: it has no nimbus)."""
    return {
        "nimbuses": [
            {
                "host": n.host,
                "port": n.port,
                "id": _nimbus_name(n),
                "pid": n.pid,
                "status": n.status,
                "version": n.version,
                "nimbusUpTime": pretty_seconds(n.uptime_s),
                "nimbusUpTimeSeconds": None if n.uptime_s is None else int(n.uptime_s),
            }
            for n in snap.state.nimbus
        ]
    }


def supervisor_summary(snap: Snapshot) -> dict[str, Any]:
    """``/api/v1/supervisor/summary``: supervisors, and every worker (slot) in use."""
    workers: list[dict[str, Any]] = []
    for reading in snap.topologies.values():
        workers.extend(_worker_row(reading, w, snap.time) for w in reading.workers if w.ref.alive)
    return {
        "supervisors": [
            {
                "id": s.id,
                "host": s.host,
                "uptime": pretty_seconds(s.uptime_s),
                "uptimeSeconds": None if s.uptime_s is None else int(s.uptime_s),
                "slotsTotal": s.slots_total,
                "slotsUsed": s.slots_used,
                "slotsFree": s.slots_total - s.slots_used,
                "ports": list(s.ports),
            }
            for s in snap.state.supervisors
        ],
        "workers": workers,
    }


def topology_summary(snap: Snapshot) -> dict[str, Any]:
    """``/api/v1/topology/summary``."""
    return {"topologies": [_topology_row(r) for r in snap.topologies.values()], "sampledAt": snap.time}


def topology_workers(reading: TopologyReading) -> dict[str, Any]:
    """``/api/v1/topology-workers/<id>``."""
    return {"hostPortList": [{"host": w.ref.host, "port": w.ref.port} for w in _alive(reading)]}


# ---------------------------------------------------------------------- one topology
def _worker_row(reading: TopologyReading, w: WorkerReading, now: float) -> dict[str, Any]:
    h = w.health
    up = _worker_uptime(w)
    rss = h.get("rss_bytes", w.ref.rss_bytes) if h is not None else w.ref.rss_bytes
    names = list(h["executors"]) if h is not None and "executors" in h else list(w.ref.executors)
    per_component: dict[str, int] = {}
    for n in names:
        m = _EXECUTOR.match(n)
        if m:
            per_component[m["component"]] = per_component.get(m["component"], 0) + _tasks_of(n)
    counters = h.get("counters", {}) if h is not None else {}
    status = w.ref.status
    if w.ref.alive and w.health is None:
        status = "unreachable"
    elif w.health is not None:
        status = "active" if w.health.get("active") else "inactive"
    return {
        "topologyId": reading.ref.id,
        "topologyName": reading.ref.name,
        "supervisorId": w.ref.supervisor,
        "id": w.ref.id,
        "host": h.get("host", w.ref.host) if h is not None else w.ref.host,
        "port": h.get("port", w.ref.port) if h is not None else w.ref.port,
        "pid": w.ref.pid,
        "status": status,
        "uptime": pretty_seconds(up),
        "uptimeSeconds": None if up is None else int(up),
        "rssBytes": rss if isinstance(rss, int) else None,
        "executorsTotal": len(names),
        "componentNumTasks": per_component,
        "lastHeartbeatSecs": None if w.ref.heartbeat_time is None else round(now - w.ref.heartbeat_time, 1),
        # What the worker could not decode, and what entered the topology and was lost there
        # (each failed its trees and, with state, made the next round roll back).
        "badPayloads": _sum_or_none([_num(counters, "bad_payload"), _num(counters, "bad_acker_updates")]),
        "lostPayloads": _num(counters, "lost_payloads"),
        "lostTuples": _num(counters, "lost_tuples"),
        "error": w.error,
    }


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _num(d: Mapping[str, Any], key: str) -> float | None:
    return _number(d.get(key))


def _sum_or_none(values: Iterable[float | None]) -> int | None:
    vals = list(values)
    if not vals or any(v is None for v in vals):
        return None
    return int(sum(v for v in vals if v is not None))


def _max_or_none(values: Iterable[float | None]) -> float | None:
    vals = list(values)
    if not vals or any(v is None for v in vals):
        return None
    return max(v for v in vals if v is not None)


def _latency_buckets(task: Mapping[str, Any]) -> list[tuple[float, float]] | None:
    """Return a task's ``[[upper bound s, tuples], ...]``; None if it reports none (bad pairs are skipped)."""
    raw = task.get("latency_buckets")
    if not isinstance(raw, list):
        return None
    pairs = []
    for pair in raw:
        if isinstance(pair, list) and len(pair) == 2:
            bound, count = _number(pair[0]), _number(pair[1])
            if bound is not None and count is not None and count > 0:
                pairs.append((bound, count))
    return pairs


def _merged_percentiles_ms(tasks: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """p50 and p99 in ms of the tasks' histograms added together (None: no task reports one)."""
    reports = [b for b in map(_latency_buckets, tasks) if b is not None]
    if not reports:
        return None, None
    merged = merge_buckets(reports)
    p50, p99 = percentile_of(merged, 50), percentile_of(merged, 99)
    return (None if p50 is None else round(p50 * 1000, 4)), (None if p99 is None else round(p99 * 1000, 4))


def _min_or_none(values: Iterable[float | None]) -> int | None:
    vals = list(values)
    if not vals or any(v is None for v in vals):
        return None
    return int(min(v for v in vals if v is not None))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _checkpoint_of(w: WorkerReading) -> Mapping[str, Any] | None:
    """Return the worker's checkpoint view (``/health``'s ``checkpoint``), or None (stateless, not reported)."""
    cp = w.health.get("checkpoint") if w.health is not None else None
    return cp if isinstance(cp, Mapping) else None


def _executor_state(ex: Mapping[str, Any], checkpoint: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Return a stateful executor's state in the API's names (None: the executor keeps no state)."""
    st = ex.get("state")
    if not isinstance(st, Mapping) or st.get("stateful") is False:
        return None
    committed = _num(checkpoint, "committed") if checkpoint is not None else None
    return {
        "committedEpoch": None if committed is None else int(committed),
        "checkpointEpoch": st.get("epoch"),
        "keys": st.get("keys"),
        "lastCheckpointBytes": st.get("last_checkpoint_bytes"),
        "checkpointP50Ms": _num(st, "checkpoint_p50_ms"),
        "checkpointP99Ms": _num(st, "checkpoint_p99_ms"),
        "checkpoints": st.get("checkpoints"),
        "restores": st.get("restores"),
        "rollbacks": st.get("rollbacks"),
    }


def _component_state(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Return a component's state over its executors (None: no executor reports state)."""
    states = [(r["state"], r["_state"]) for r in rows if r["state"] is not None]
    if not states:
        return None
    hists = [_latency_buckets({"latency_buckets": raw.get("checkpoint_buckets")}) for _, raw in states]
    if all(h is not None for h in hists):
        merged = merge_buckets(h for h in hists if h is not None)
        p50, p99 = _ms(percentile_of(merged, 50)), _ms(percentile_of(merged, 99))
    elif len(states) == 1:  # an older worker without histograms: one executor's own figures are exact
        p50, p99 = states[0][0]["checkpointP50Ms"], states[0][0]["checkpointP99Ms"]
    else:  # percentiles cannot be combined without the histograms
        p50 = p99 = None

    def field(key: str) -> list[float | None]:
        return [_number(st[key]) for st, _ in states]

    return {
        "executors": len(states),
        "committedEpoch": _min_or_none(field("committedEpoch")),
        "checkpointEpoch": _min_or_none(field("checkpointEpoch")),
        "keys": _sum_or_none(field("keys")),
        "lastCheckpointBytes": _sum_or_none(field("lastCheckpointBytes")),
        "checkpointP50Ms": p50,
        "checkpointP99Ms": p99,
        "checkpoints": _sum_or_none(field("checkpoints")),
        "restores": _sum_or_none(field("restores")),
        "rollbacks": None if (m := _max_or_none(field("rollbacks"))) is None else int(m),
    }


def _checkpoints(reading: TopologyReading, now: float) -> list[dict[str, Any]] | None:
    """Each worker's checkpoint view; [] for a stateless topology, None when no worker reports the key."""
    reported = False
    out = []
    for w in reading.workers:
        if w.health is None or "checkpoint" not in w.health:
            continue
        reported = True
        cp = _checkpoint_of(w)
        if cp is None:
            continue
        last_commit = _num(cp, "last_commit_at")
        age = _num(cp, "last_group_age_s")
        reasons = cp.get("reasons")
        out.append(
            {
                "worker": w.ref.id,
                "host": w.ref.host,
                "port": w.ref.port,
                "provider": cp.get("provider"),
                "epoch": cp.get("epoch"),
                "committed": cp.get("committed"),
                "generation": cp.get("generation"),
                "dirty": cp.get("dirty"),
                "reasons": [str(r) for r in reasons] if isinstance(reasons, list) else None,
                "replaying": cp.get("replaying"),
                "rollbacks": cp.get("rollbacks"),
                "replayedRecords": cp.get("replayed_records"),
                "committedEpochs": cp.get("committed_epochs"),
                "loggedGroups": cp.get("logged_groups"),
                "lastGroupAgeSecs": None if age is None else round(age, 1),
                "lastCommitTime": last_commit,
                "lastCommitLapsedSecs": None if last_commit is None else round(max(0.0, now - last_commit), 1),
            }
        )
    return out if reported else None


def _executors(reading: TopologyReading, rates: Mapping[tuple[str, str], tuple[float, float]]) -> list[dict[str, Any]]:
    rows = []
    for w in reading.workers:
        if w.health is None:
            continue
        checkpoint = _checkpoint_of(w)
        for name, ex in (w.health.get("executors") or {}).items():
            tasks = ex.get("tasks") or {}
            q = ex.get("queue") or {}
            # The worker's own figures (its timer measures them every second); the UI's
            # measurement over its window only for a worker that does not report them.
            task_rates = [_num(t, "rate") for t in tasks.values()]
            rate = sum(r for r in task_rates if r is not None) if tasks and None not in task_rates else None
            capacity = _num(ex, "capacity")
            measured = rates.get((w.ref.id, name))
            if measured is not None:
                rate = measured[0] if rate is None else rate
                capacity = measured[1] if capacity is None else capacity
            rows.append(
                {
                    "id": name,
                    "component": str(ex.get("component", "?")),
                    "host": w.ref.host,
                    "port": w.ref.port,
                    "worker": w.ref.id,
                    "tasks": len(tasks),
                    "executed": sum(int(t.get("executed", 0)) for t in tasks.values()),
                    "emitted": sum(int(t.get("emitted", 0)) for t in tasks.values()),
                    "acked": sum(int(t.get("acked", 0)) for t in tasks.values()),
                    "failed": sum(int(t.get("failed", 0)) for t in tasks.values()),
                    "errors": sum(int(t.get("errors", 0)) for t in tasks.values()),
                    "rate": None if rate is None else round(rate, 1),
                    "capacity": _f3(capacity),
                    "queue": {
                        "population": q.get("population"),
                        "capacity": q.get("capacity"),
                        "overflow": q.get("overflow"),
                        "arrivalRate": q.get("arrival_rate"),
                    },
                    "backpressure": q.get("backpressure"),
                    "uptimeSeconds": _worker_uptime(w),
                    "state": _executor_state(ex, checkpoint),
                    "_tasks": tasks,
                    "_state": ex.get("state") or {},
                }
            )
    return rows


def _errors(reading: TopologyReading, now: float) -> list[dict[str, Any]] | None:
    """Errors the workers report (newest first), or None when no worker reports an ``errors`` list."""
    reported = False
    out = []
    for w in reading.workers:
        if w.health is None or not isinstance(w.health.get("errors"), list):
            continue
        reported = True
        for e in w.health["errors"]:
            t = _num(e, "time")
            out.append(
                {
                    "errorTime": t,
                    "errorLapsedSecs": None if t is None else int(now - t),
                    "errorHost": w.ref.host,
                    "errorPort": w.ref.port,
                    "worker": w.ref.id,
                    "component": e.get("component"),
                    "task": e.get("task"),
                    "error": str(e.get("error", "")),
                }
            )
    if not reported:
        return None
    out.sort(key=lambda e: e["errorTime"] or 0, reverse=True)
    return out[:_ERRORS_SHOWN]


def _writers(reading: TopologyReading) -> list[dict[str, Any]] | None:
    """Spark writers each worker has seen, or None when no worker reports ``writers``."""
    reported = False
    out = []
    for w in reading.workers:
        if w.health is None or not isinstance(w.health.get("writers"), list):
            continue
        reported = True
        for wr in w.health["writers"]:
            out.append(
                {
                    "worker": w.ref.id,
                    "queryId": wr.get("query_id"),
                    "lastBatchId": wr.get("last_batch_id"),
                    "rows": wr.get("rows"),
                    "groups": wr.get("groups"),
                    "replays": wr.get("replays"),
                    "failed": wr.get("failed"),
                    "ackLatencyP50Ms": wr.get("ack_latency_p50_ms"),
                    "ackLatencyP99Ms": wr.get("ack_latency_p99_ms"),
                }
            )
    return out if reported else None


def _component_type(reading: TopologyReading, component: str) -> str | None:
    for w in reading.workers:
        comps = w.health.get("components") if w.health is not None else None
        if isinstance(comps, Mapping) and isinstance(comps.get(component), Mapping):
            entry = comps[component]
            return "source" if entry.get("source") or entry.get("spout") else "bolt"
    return None


def _components(
    reading: TopologyReading, executors: list[dict[str, Any]], errors: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for row in executors:
        by.setdefault(row["component"], []).append(row)
    out = []
    for cid in sorted(by):
        rows = by[cid]
        tasks = [t for r in rows for t in r["_tasks"].values()]
        executed = sum(r["executed"] for r in rows)
        busy = sum(busy_ms(t) for t in tasks)
        rates = [r["rate"] for r in rows]
        capacities = [None if r["capacity"] is None else float(r["capacity"]) for r in rows]
        last = next((e for e in errors or () if e["component"] == cid), None)
        kind = _component_type(reading, cid)
        p50, p99 = _merged_percentiles_ms(tasks)
        out.append(
            {
                "componentId": cid,
                "encodedId": quote(cid, safe=""),
                "type": kind,
                "executors": len(rows),
                "tasks": len(tasks),
                "executed": executed,
                "emitted": sum(r["emitted"] for r in rows),
                "acked": sum(r["acked"] for r in rows),
                "failed": sum(r["failed"] for r in rows),
                "transferred": None,
                "errorCount": sum(r["errors"] for r in rows),
                "ticks": _sum_or_none(_num(t, "ticks") for t in tasks),
                "rate": None if None in rates else round(sum(r for r in rates if r is not None), 1),
                "executeLatency": _f3(busy / executed) if executed else None,
                "processLatency": None,
                "latencyP50Ms": p50,
                "latencyP99Ms": p99,
                "capacity": _f3(_max_or_none(capacities)),
                "queuePopulation": sum(int(r["queue"]["population"] or 0) for r in rows),
                "queueCapacity": sum(int(r["queue"]["capacity"] or 0) for r in rows),
                "backpressureExecutors": sum(1 for r in rows if r["backpressure"]),
                "lastError": last["error"] if last else ("" if errors is not None else None),
                "errorHost": last["errorHost"] if last else None,
                "errorPort": last["errorPort"] if last else None,
                "errorTime": last["errorTime"] if last else None,
                "errorLapsedSecs": last["errorLapsedSecs"] if last else None,
                "state": _component_state(rows),
            }
        )
    return out


def _public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def topology_detail(
    snap: Snapshot, reading: TopologyReading, hist: Sequence[Sample], window_s: float
) -> dict[str, Any]:
    """``/api/v1/topology/<id>``: status, totals, components, executors, workers, errors, writers."""
    executors = _executors(reading, _executor_rates(hist, window_s))
    errors = _errors(reading, snap.time)
    components = _components(reading, executors, errors)
    spouts = [dict(c, spoutId=c["componentId"]) for c in components if c["type"] == "source"]
    bolts = [dict(c, boltId=c["componentId"]) for c in components if c["type"] != "source"]
    checkpoints = _checkpoints(reading, snap.time)
    committed = [_number(c["committed"]) for c in checkpoints or ()]
    return {
        **_topology_row(reading),
        "sampledAt": snap.time,
        "window": ":all-time",
        "windowHint": "All time",
        "rateWindowSecs": window_s,
        "clusterKind": snap.state.kind,
        "actions": {
            "activate": True,
            "deactivate": True,
            "rebalance": snap.state.rebalance_supported,
            "kill": True,
            "savepoint": bool(checkpoints),  # some worker reports a stateful checkpoint view
        },
        "topologyStats": [
            {
                "window": ":all-time",
                "windowPretty": "All time",
                "emitted": sum(c["emitted"] for c in components),
                "transferred": None,
                "completeLatency": None,
                "acked": sum(c["acked"] for c in components),
                "failed": sum(c["failed"] for c in components),
            }
        ],
        "spouts": spouts,
        "bolts": bolts,
        "executorStats": _public(executors),
        "workers": [_worker_row(reading, w, snap.time) for w in reading.workers],
        "errors": errors,
        "writers": _writers(reading),
        "checkpoints": checkpoints,
        "committedEpoch": _min_or_none(committed),
    }


def component_detail(
    snap: Snapshot, reading: TopologyReading, hist: Sequence[Sample], window_s: float, component: str
) -> dict[str, Any] | None:
    """``/api/v1/topology/<id>/component/<component>``, or None for an unknown component."""
    executors = [r for r in _executors(reading, _executor_rates(hist, window_s)) if r["component"] == component]
    if not executors:
        return None
    errors = _errors(reading, snap.time)
    (comp,) = _components(reading, executors, errors)
    tasks = []
    for r in executors:
        for task, st in sorted(r["_tasks"].items(), key=lambda kv: int(kv[0])):
            tasks.append(
                {
                    "task": int(task),
                    "executor": r["id"],
                    "host": r["host"],
                    "port": r["port"],
                    "executed": st.get("executed"),
                    "emitted": st.get("emitted"),
                    "acked": st.get("acked"),
                    "failed": st.get("failed"),
                    "errors": st.get("errors"),
                    "rate": _num(st, "rate"),
                    "executeLatency": _f3(_num(st, "latency_ms")),
                    "latencyP50Ms": _num(st, "latency_p50_ms"),
                    "latencyP99Ms": _num(st, "latency_p99_ms"),
                }
            )
    return {
        **comp,
        "id": component,
        "name": reading.ref.name,
        "topologyId": reading.ref.id,
        "encodedTopologyId": quote(reading.ref.id, safe=""),
        "topologyStatus": _status(reading),
        "componentType": comp["type"],
        "window": ":all-time",
        "windowHint": "All time",
        "sampledAt": snap.time,
        "boltStats": [
            {
                "window": ":all-time",
                "windowPretty": "All time",
                "executed": comp["executed"],
                "emitted": comp["emitted"],
                "acked": comp["acked"],
                "failed": comp["failed"],
                "executeLatency": comp["executeLatency"],
                "transferred": None,
                "processLatency": None,
            }
        ],
        "executorStats": _public(executors),
        "taskStats": tasks,
        "componentErrors": None if errors is None else [e for e in errors if e["component"] == component],
    }


def chart_history(hist: Sequence[Sample]) -> dict[str, Any]:
    """Return executed per second per component between consecutive readings (our own endpoint)."""
    components = sorted({c.component for _, counts in hist for c in counts.values()})
    times: list[float] = []
    series: dict[str, list[float | None]] = {c: [] for c in components}
    for (t0, before), (t1, after) in itertools.pairwise(hist):
        dt = t1 - t0
        if dt <= 0:
            continue
        grown: dict[str, float] = {}
        seen: set[str] = set()
        for key, now in after.items():
            then: ExecutorCounts | None = before.get(key)
            seen.add(now.component)
            if then is not None:
                grown[now.component] = grown.get(now.component, 0.0) + _grow(then.executed, now.executed)
        times.append(round(t1, 3))
        for c in components:
            series[c].append(round(grown[c] / dt, 2) if c in grown else (0.0 if c in seen else None))
    return {"times": times, "executedPerSecond": series, "now": time.time()}
