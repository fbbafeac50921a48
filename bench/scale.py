"""Cost as the topology grows (issue 16, section 5): CPU per tuple at 1, 2, 4 and 8 workers.

One 3-stage tuple topology — source (pass-through, shuffle) -> mid (pass-through, fields)
-> sink (no-op), ``--parallelism`` executors per component whatever the worker count
(default 8: at 8 workers, one executor of each stage per worker) — run with each worker
count in turn, rounds interleaved.  A plain client in this process sends ``--messages``
~100-byte msgpack tuples in batches of 1000 (as bench/worker.py does) and the run ends
when the sink executed them all.

CPU is utime + stime from ``/proc/<pid>/stat``, summed over every process: this one (the
feeding client) and every worker.  The bench's own progress polls (``/health`` every
0.2 s) are measured while idle and subtracted.  On a 2-core machine the larger runs are
oversubscribed, so the figure of merit is CPU seconds per million tuples, not throughput.

Also printed, per worker count: idle CPU per second (heartbeats, timers, keepalives,
checkpoint threads: the cluster running with no traffic), threads per worker (from
``/proc``), worker-to-worker connections opened and those that carried tuples, and
Storm's count for the same plan (one connection per ordered pair of workers whose tasks
exchange tuples: Storm's worker connects to the workers of its outbound tasks).

    python -m bench.scale [--workers 1,2,4,8] [--messages 400000] [--rounds 3] [--parallelism 8]
                          [--idle 3] [--set KEY=VALUE] [--profile DIR]

``--profile DIR`` records every worker with py-spy (if it is on PATH or beside this
Python) during each run of the last round, as collapsed stacks in DIR, and prints the
functions with the most samples per worker count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import yaml

from bench.worker import NOOP, PASS
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Plan, Slot
from spark_storm.transport import make_context

_TICK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.2


def topology(parallelism: int) -> dict[str, Any]:
    return {
        "name": "bench-scale",
        "components": [
            {"id": "in", "source": True, "bolt": PASS, "fields": ["v"], "parallelism": parallelism},
            {"id": "mid", "bolt": PASS, "fields": ["v"], "parallelism": parallelism, "inputs": [{"from": "in"}]},
            {
                "id": "sink",
                "bolt": NOOP,
                "parallelism": parallelism,
                "inputs": [{"from": "mid", "grouping": "fields", "fields": ["v"]}],
            },
        ],
    }


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of every thread of a process, by thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


_ROLES = (
    ("spark-storm-executor-", "executors"),
    ("spark-storm-tcp-client-", "tcp client I/O (one per peer)"),
    ("spark-storm-tcp-server-", "tcp server I/O"),
    ("spark-storm-transfer-", "transfer"),
    ("spark-storm-timer-", "timer (heartbeats, loads, ticks)"),
    ("spark-storm-metrics-http", "metrics http"),
    ("MainThread", "main"),
)


def thread_roles(spy: str, pid: int) -> dict[int, str]:
    """Thread id -> role, from the Python thread names ``py-spy dump`` shows (the OS names are all "python")."""
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    roles: dict[int, str] = {}
    for line in dump.splitlines():
        if line.startswith("Thread ") and '"' in line:
            tid = int(line.split()[1], 0)
            name = line.split('"')[1]
            roles[tid] = next((role for prefix, role in _ROLES if name.startswith(prefix)), "other")
    return roles


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of a process."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            continue  # the thread ended
    return total


def queue_counts(health: dict[str, Any]) -> tuple[int, int]:
    """Publishes into executor queues and consumer wake-ups, over the worker's executors."""
    publishes = wakeups = 0
    for ex in health["executors"].values():
        publishes += int(ex["queue"]["publishes"])
        wakeups += int(ex["queue"]["wakeups"])
    return publishes, wakeups


def storm_connections(plan: Plan) -> int:
    """Ordered pairs of distinct workers whose tasks exchange tuples (Storm's connection count)."""
    topo = plan.topology
    pairs: set[tuple[Slot, Slot]] = set()
    for comp in topo.components.values():
        for stream in comp.outputs:
            for consumer, _inp in topo.consumers(comp.id, stream):
                for a in {plan.task_slot[t] for t in plan.component_tasks[comp.id]}:
                    for b in {plan.task_slot[t] for t in plan.component_tasks[consumer.id]}:
                        if a != b:
                            pairs.add((a, b))
    return len(pairs)


def remote_share(plan: Plan) -> float:
    """Share of the topology's tuple hops that cross workers (pairs of producer and consumer tasks, per edge)."""
    topo = plan.topology
    shares = []
    for comp in topo.components.values():
        for stream in comp.outputs:
            for consumer, _inp in topo.consumers(comp.id, stream):
                pairs = [
                    plan.task_slot[a] != plan.task_slot[b]
                    for a in plan.component_tasks[comp.id]
                    for b in plan.component_tasks[consumer.id]
                ]
                shares.append(sum(pairs) / len(pairs))
    return sum(shares) / len(shares) if shares else 0.0


def sink_executed(cluster: LocalCluster) -> int:
    total = 0
    for slot in cluster.slots:
        for ex in cluster.health(slot)["executors"].values():
            if ex["component"] == "sink":
                total += sum(t["executed"] for t in ex["tasks"].values())
    return total


def run(workers: int, args: argparse.Namespace, overrides: dict[str, Any], profile: Path | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topology(args.parallelism)))
    cluster = LocalCluster(str(path), workers, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    spies: list[subprocess.Popen[bytes]] = []
    try:
        pids = [p.pid for p in cluster.procs.values()]
        me = os.getpid()
        sources = list(cluster.plan.component_tasks["in"])
        conns = {s: ctx.connect(cluster.topology.name, s.host, s.port) for s in cluster.slots}
        for c in conns.values():
            c.wait_ready(30)
        batch = 1000
        payloads = [msgpack.packb([f"{i:06d}" + "x" * 91]) for i in range(batch)]
        msgs: dict[Slot, list[TaskMessage]] = {}
        for i, p in enumerate(payloads):
            task = sources[i % len(sources)]
            msgs.setdefault(cluster.plan.task_slot[task], []).append(TaskMessage(task, p))

        def user_sys() -> tuple[float, float]:
            times = [cpu_seconds(p) for p in [me, *pids]]
            return sum(u for u, _ in times), sum(s for _, s in times)

        def total_cpu() -> float:
            return sum(user_sys())

        time.sleep(1.0)  # connections made, executors active
        c0, t0 = total_cpu(), time.perf_counter()
        time.sleep(args.idle)
        idle_per_s = (total_cpu() - c0) / (time.perf_counter() - t0)
        c0, t0 = total_cpu(), time.perf_counter()
        polls = 10
        for _ in range(polls):
            sink_executed(cluster)
        per_poll = max(0.0, (total_cpu() - c0) - idle_per_s * (time.perf_counter() - t0)) / polls
        th = [threads(p) for p in pids]
        health0 = {s: cluster.health(s) for s in cluster.slots}
        switches0 = sum(context_switches(p) for p in [me, *pids])
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if profile is not None and spy:
            profile.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(pids):
                out = profile / f"scale-{workers}w-worker{i}.txt"
                cmd = [spy, "record", "--pid", str(p), "--format", "raw", "--output", str(out), "--rate", "100"]
                cmd += ["--gil", "--nonblocking"]  # the thread holding the GIL: where Python spends CPU
                spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        n = args.messages - args.messages % batch
        threads0 = {p: thread_cpu(p) for p in pids}
        u0, s0 = user_sys()
        c0, t0 = u0 + s0, time.perf_counter()
        for _ in range(n // batch):
            for slot, chunk in msgs.items():
                conns[slot].send(chunk)
        polled = 0
        deadline = time.monotonic() + 600
        while sink_executed(cluster) < n:
            polled += 1
            if time.monotonic() > deadline:
                msg = f"{workers} workers: the sink did not execute {n:,} tuples within 600s"
                raise RuntimeError(msg)
            time.sleep(POLL_S)
        polled += 1
        secs = time.perf_counter() - t0
        u1, s1 = user_sys()
        cpu = u1 + s1 - c0 - polled * per_poll
        switches = sum(context_switches(p) for p in [me, *pids]) - switches0
        _stop_spies(spies)
        by_role: dict[str, float] = {}
        if spy:
            for p in pids:
                roles = thread_roles(spy, p)
                for tid, secs_now in thread_cpu(p).items():
                    role = roles.get(tid, "native / not Python")
                    by_role[role] = by_role.get(role, 0.0) + secs_now - threads0[p].get(tid, 0.0)
        health = {s: cluster.health(s) for s in cluster.slots}
        opened = sum(len(h["connections"]) for h in health.values())
        used = sum(1 for h in health.values() for c in h["connections"].values() if c.get("sent", 0) > 0)
        remote = sum(int(c.get("sent", 0)) for h in health.values() for c in h["connections"].values()) - sum(
            int(c.get("sent", 0)) for h in health0.values() for c in h["connections"].values()
        )
        q1 = [queue_counts(dict(h)) for h in health.values()]
        q0 = [queue_counts(dict(h)) for h in health0.values()]
        publishes = sum(p for p, _ in q1) - sum(p for p, _ in q0)
        wakeups = sum(w for _, w in q1) - sum(w for _, w in q0)
        return {
            "workers": workers,
            "tuples": n,
            "secs": secs,
            "cpu": cpu,
            "polls_cpu": polled * per_poll,
            "idle_per_s": idle_per_s,
            "threads": th,
            "switches": switches,
            "roles": by_role,
            "user": u1 - u0,  # polls included (they are not split)
            "sys": s1 - s0,
            "remote": remote,
            "publishes": publishes,
            "wakeups": wakeups,
            "opened": opened,
            "used": used,
            "storm": storm_connections(cluster.plan),
            "remote_share": remote_share(cluster.plan),
            "load": os.getloadavg()[0],
        }
    finally:
        _stop_spies(spies)
        ctx.term()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_spies(spies: list[subprocess.Popen[bytes]]) -> None:
    for proc in spies:  # py-spy writes its profile on SIGINT
        proc.send_signal(signal.SIGINT)
    for proc in spies:
        proc.wait(60)
    spies.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=8, help="executors per component")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of the idle measurement")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    parser.add_argument("--profile", type=Path, help="py-spy every worker in the last round; stacks go here")
    args = parser.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    best: dict[int, dict[str, Any]] = {}
    started = os.getloadavg()[0]
    for r in range(args.rounds):
        for w in counts:
            last = r == args.rounds - 1
            res = run(w, args, overrides, args.profile if last else None)
            per_m = res["cpu"] / res["tuples"] * 1e6
            print(
                f"round {r + 1}: {w} workers {res['tuples'] / res['secs']:10,.0f} tuples/s  "
                f"{per_m:6.2f} CPU s per M tuples  idle {res['idle_per_s']:.3f} CPU/s  (load {res['load']:.1f})",
                file=sys.stderr,
                flush=True,
            )
            if w not in best or res["cpu"] < best[w]["cpu"]:
                best[w] = res
    base = best[counts[0]]["cpu"] / best[counts[0]]["tuples"]
    print(f"\nbench.scale, load average {started:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if overrides:
        print("worker settings: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    print(
        f"3 stages x {args.parallelism} executors, {best[counts[0]]['tuples']:,} tuples of ~100 bytes, "
        f"{os.cpu_count()} cores; best (least CPU) of {args.rounds} rounds"
    )
    print(
        f"{'workers':>7s} {'tuples/s':>10s} {'CPU s/M':>8s} {'vs ' + str(counts[0]) + 'w':>6s} {'idle CPU/s':>10s} "
        f"{'threads/w':>9s} {'conns':>5s} {'used':>5s} {'Storm':>5s} {'polls':>6s} {'load':>5s}"
    )
    for w in counts:
        b = best[w]
        per_t = b["cpu"] / b["tuples"]
        th = b["threads"]
        print(
            f"{w:7d} {b['tuples'] / b['secs']:10,.0f} {per_t * 1e6:8.2f} {per_t / base:6.2f} {b['idle_per_s']:10.3f} "
            f"{min(th):4d}-{max(th):<4d} {b['opened']:5d} {b['used']:5d} {b['storm']:5d} {b['polls_cpu']:5.2f}s "
            f"{b['load']:5.1f}"
        )
    top = max(counts)
    ratio = (best[top]["cpu"] / best[top]["tuples"]) / base
    verdict = "met" if ratio <= 1.5 else "NOT met"
    print(f"\nat {top} workers: {ratio:.2f}x the CPU per tuple at {counts[0]} (target <= 1.5x: {verdict})")
    print("\nper 1000 tuples (each executed by 3 bolts):")
    print(
        f"{'workers':>7s} {'remote hops':>11s} {'remote msgs':>11s} {'queue publishes':>15s} {'wake-ups':>9s} "
        f"{'ctx switches':>12s} {'user s/M':>8s} {'sys s/M':>8s} {'threads':>7s}"
    )
    for w in counts:
        b = best[w]
        k = b["tuples"] / 1000
        print(
            f"{w:7d} {b['remote_share']:11.1%} {b['remote'] / k:11.1f} {b['publishes'] / k:15.1f} "
            f"{b['wakeups'] / k:9.1f} {b['switches'] / k:12.1f} {b['user'] / k * 1000:8.2f} {b['sys'] / k * 1000:8.2f} "
            f"{sum(b['threads']):7d}"
        )
    roles = sorted({r for w in counts for r in best[w]["roles"]}, key=lambda r: -best[counts[-1]]["roles"].get(r, 0))
    if roles:
        print("\nworker CPU s per M tuples by thread (Python thread names from py-spy dump):")
        print(f"{'':32s}" + "".join(f"{str(w) + 'w':>8s}" for w in counts))
        for role in roles:
            cells = "".join(f"{best[w]['roles'].get(role, 0.0) / best[w]['tuples'] * 1e6:8.2f}" for w in counts)
            print(f"{role:32s}{cells}")
    if args.profile is not None:
        for w in counts:
            print(f"\npy-spy --gil, {w} workers (last round; 100 samples/s of each worker's GIL holder):")
            print(profile_summary(sorted(args.profile.glob(f"scale-{w}w-worker*.txt"))))
    return 0


def profile_summary(files: list[Path], top: int = 14) -> str:
    """The functions with the most samples on top of the stack (self), and a few inclusive totals."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for f in files:
        for line in f.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + n
    if not total:
        return "  (no samples: is py-spy allowed to attach here?)"
    lines = [f"  {total:,} samples; self:"]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {n / total:6.1%}  {frame}")
    lines.append("  inclusive:")
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {n / total:6.1%}  {frame}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
