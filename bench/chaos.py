"""A randomized fault and schedule harness, in the spirit of Jepsen and FoundationDB's simulation (issue 24).

    python -m bench.chaos --seed S --scenarios N [--only I[,J...]] [--json PATH] [--deadline 180]
                          [--workdir DIR] [--keep] [--dry-run] [--verbose]

Each scenario is drawn from (seed, index) alone, with ``random.Random``, so ``--seed S --only I``
runs the same scenario again (same topology, data and fault schedule; the interleavings the
machine produces vary, so a rare one may need a few replays):

* a **topology**: ``in`` (source) -> ``mid`` (pass-through, shuffle) -> a stateful component on
  fields: the keyed ledger (``LedgerBolt``, tuple bolts), the columnar ledger
  (``LedgerBatchBolt`` behind ``PassThroughBatchBolt``, Arrow payloads), an event-time windowed
  count (``WindowCount``, ``WindowCountTuples`` or ``WindowCountBatch``; sliding, tumbling or
  session windows) into ``WindowResults``, or the typed ledger (bench/chaos_bolts.py: a
  timestamp with a zone, a date, a decimal, a struct holding a date and an array per row, all
  forwarded through ``mid``, the key and the amount derived from them);
* a **feed**: a plain client that behaves like Spark (delivery groups keyed (query, batch,
  partition, sequence), resent until PROCESSED, and a priority-1 coordinator committing each
  batch as the driver's ``commit(batchId)`` does), or real local Spark (one SparkSession for
  the harness process, ``local[2,4]``: 2 cores, a failed task retried as on a cluster) through
  ``writeStream.format("storm")`` or ``foreachBatch(storm_sink(...))``, one JSON file per
  micro-batch, ``trigger(availableNow=True)``, ``delivery=processed``;
* **parallelism**: 2 or 3 worker processes (LocalCluster), 1-3 tasks of each component and
  2-6 stateful tasks; now and then the workers' own interval checkpoints besides the driver's;
* a **schedule of faults** at random times after the feed starts (each is undone when its time is
  up, or when the feed ends):

  - ``kill``: SIGKILL a worker, restart it after 0-2 s (LocalCluster's restart);
  - ``pause``: SIGSTOP a worker, SIGCONT after 1-8 s (a long GC-like pause);
  - ``netcut`` (the network family: each worker in a network namespace of its own on a
    bridge, the harness in a ``ctl`` namespace; root and ``ip netns`` only, else the
    scenario is skipped with the reason): blackhole routes between two workers (``pair``:
    both reach everyone else) or one worker's bridge port down (``isolate``), healed after
    1-6 s;
  - ``fsync`` (the state provider ``bench.chaos_backend:ChaosBackend``, the embedded backend
    with a disturbed disk): for 2-6 s, changelog writes and input-log fsyncs sleep 0.2-2.5 s
    (``slow``) or raise EIO (``fail``), or COMMITTED markers fail (``fail-commit``), each
    hit with a drawn chance;
  - ``corrupt`` (the transport ``bench.chaos_transport:Context``: tcp whose worker-to-worker
    clients disturb what they send): for 2-5 s, payloads cut short (``truncate``) or
    replaced by unreadable bytes (``garbage``), or a malformed frame that makes the server
    drop the connection (``frame``); only corruption a decoder can detect: bit flips that
    leave valid msgpack with other values are out of scope, the wire relies on TCP's (or
    TLS's) integrity for those;
  - ``query_restart`` (Spark feeds): the query stopped, restarted from its checkpoint after
    0-3 s;
  - ``rebalance`` (the plain client, outside namespaces): at the next batch boundary, every
    worker stopped (SIGTERM or SIGKILL) and the topology started on the other worker count
    (2 <-> 3), so stateful and source tasks move to other processes and restore from the
    embedded backend's files (shared on this host).  Not a cluster-mode rebalance: that
    needs ZooKeeper, nimbus and supervisors per scenario, too heavy for 2 cores;
  - ``switch``: the workers' GIL switch interval at 1 µs for the whole scenario
    (``bench.chaos_worker``; the worker's own ``topology.worker.switch.interval.ms`` accepts
    0.01 ms at the least).

The checker stops the workers, reads the committed state from the backend's files and
compares every key (and every fired window) with the answer computed from the rows the feed
committed.  Per scenario it prints the seed, index, topology, feed, the faults injected per
kind, the rollbacks and replays (the workers' ``/health`` ``checkpoint``, sampled twice a
second per process), the duration and PASS or FAIL; a FAIL also prints the wrong keys, the
lost rows, the command that replays it alone, and keeps the scenario's directory (worker
logs, state, control files).  A scenario that does not end within ``--deadline`` seconds is
a FAIL (a hang), its processes killed by PID.  The exit status is 1 if any scenario failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.chaos_run import Fault, Record, Scenario, run_scenario, stop_spark
from tests.support.netns import Network, namespaces_unavailable

__all__ = ["KINDS", "draw", "main"]

TOPOLOGIES: Final = ("ledger", "columnar", "windows", "typed")
KINDS: Final = ("kill", "pause", "netcut", "fsync", "corrupt", "query_restart", "rebalance", "switch")
WINDOW_SPECS: Final[tuple[dict[str, str], ...]] = (
    {"length": "6s", "sliding": "2s", "timestamp_field": "ts", "lag": "3s"},
    {"length": "4s", "timestamp_field": "ts", "lag": "3s"},
    {"session_gap": "700ms", "timestamp_field": "ts", "lag": "3s"},
)


def draw(seed: int, index: int) -> Scenario:
    """Scenario ``index`` of ``seed``: a function of the two numbers only (not of the machine)."""
    rng = random.Random(f"bench.chaos:{seed}:{index}")
    netns = rng.random() < 0.15
    topology = rng.choice(TOPOLOGIES)
    feed = "client" if netns else rng.choices(("client", "format", "foreach"), (2, 1, 1))[0]
    workers = rng.choice((2, 3))
    stateful_tasks = rng.randint(2, 6)
    window: dict[str, str] | None = None
    window_bolt = ""
    if topology == "windows":
        window = dict(rng.choice(WINDOW_SPECS))
        bolts = ["WindowCount", "WindowCountTuples"] + ([] if "session_gap" in window else ["WindowCountBatch"])
        window_bolt = rng.choice(bolts)
    spark = feed != "client"
    batches = rng.randint(6, 11) if spark else rng.randint(12, 28)
    pace = 0.0 if spark else rng.uniform(0.15, 0.5)
    span = batches * (1.3 if spark else pace + 0.15)  # the feed's length without faults, roughly (s)
    kinds = ["kill", "pause", "fsync", "corrupt"]
    kinds += ["netcut", "netcut"] if netns else []
    kinds += ["query_restart"] if spark else []
    kinds += ["rebalance"] if feed == "client" and not netns else []
    faults: list[Fault] = []
    for _ in range(rng.randint(1, 4)):
        faults.append(_fault(rng, rng.choice(kinds), span, workers))
    if netns and not any(f.kind == "netcut" for f in faults):
        faults.append(_fault(rng, "netcut", span, workers))
    return Scenario(
        seed=seed,
        index=index,
        topology=topology,
        feed=feed,
        workers=workers,
        sources=rng.randint(1, 3),
        mid_parallelism=rng.randint(1, 3),
        stateful_parallelism=rng.randint(1, min(3, stateful_tasks)),
        stateful_tasks=stateful_tasks,
        batches=batches,
        rows=rng.randint(150, 500) if spark else rng.randint(100, 600),
        keys=rng.randint(16, 60),
        pace_s=round(pace, 3),
        window=window,
        window_bolt=window_bolt,
        spark_millis=rng.random() < 0.3,
        interval_ms=rng.choice((0, 0, 0, 300)),
        switch=rng.random() < 0.4,
        netns=netns,
        faults=tuple(sorted(faults, key=lambda f: f.at)),
    )


def _fault(rng: random.Random, kind: str, span: float, workers: int) -> Fault:
    at = round(rng.uniform(0.5, max(1.0, 0.85 * span)), 1)
    worker = rng.randrange(workers)
    other = (worker + rng.randrange(1, workers)) % workers
    if kind == "kill":
        return Fault(kind, at, worker, duration=round(rng.uniform(0.0, 2.0), 1))
    if kind == "pause":
        return Fault(kind, at, worker, duration=round(rng.uniform(1.0, 8.0), 1))
    if kind == "netcut":
        return Fault(kind, at, worker, other, round(rng.uniform(1.0, 6.0), 1), rng.choice(("pair", "pair", "isolate")))
    if kind == "fsync":
        mode = rng.choices(("slow", "fail", "fail-commit"), (3, 3, 1))[0]
        return Fault(kind, at, duration=round(rng.uniform(2.0, 6.0), 1), mode=mode, p=round(rng.uniform(0.3, 1.0), 2))
    if kind == "corrupt":
        mode = rng.choice(("truncate", "garbage", "frame"))
        return Fault(kind, at, duration=round(rng.uniform(2.0, 5.0), 1), mode=mode, p=round(rng.uniform(0.05, 0.3), 2))
    if kind == "query_restart":
        return Fault(kind, at, duration=round(rng.uniform(0.0, 3.0), 1))
    return Fault("rebalance", at, mode=rng.choice(("term", "kill")))


# --------------------------------------------------------------------------------- reporting
def _faults_text(record: Record) -> str:
    parts = []
    for kind in KINDS:
        n = record.faults.get(kind, 0)
        if not n:
            continue
        hits = sum(v for k, v in record.injections.items() if k.startswith(f"{kind}:"))
        parts.append(f"{kind}x{n}" + (f"({hits} hits)" if kind in ("fsync", "corrupt") else ""))
    return " ".join(parts) or "none"


def line(record: Record) -> str:
    """One scenario's report line (and, for a FAIL, what went wrong and how to replay it)."""
    head = (
        f"[seed {record.seed} #{record.index:<3d}] {record.topology:8s} {record.feed:7s} {record.workers}w"
        f"{' 1us' if record.switch else '    '}{' netns' if record.netns else ''}  faults: {_faults_text(record)}"
        f"  rollbacks {record.rollbacks} replays {record.replays}  {record.duration_s:5.1f}s  {record.verdict}"
    )
    if record.verdict == "SKIP":
        return f"{head}: {'; '.join(record.reasons)}"
    if record.verdict != "FAIL":
        return head
    out = [head]
    out += [f"    {reason}" for reason in record.reasons]
    out += [f"    wrong: {w}" for w in record.wrong_sample]
    out += [f"    planned: {p}" for p in record.planned]
    out.append(f"    replay: {record.command}")
    out.append(f"    kept: {record.kept} (worker logs in workers/, state in state/, injections in control/)")
    out += [f"    log: {text}" for text in record.log_lines[:10]]
    return "\n".join(out)


def summary(records: list[Record], took: float) -> str:
    faults: dict[str, int] = {}
    hits: dict[str, int] = {}
    for r in records:
        for kind, n in r.faults.items():
            faults[kind] = faults.get(kind, 0) + n
        for key, n in r.injections.items():
            hits[key] = hits.get(key, 0) + n
    failed = [r for r in records if r.verdict == "FAIL"]
    skipped = [r for r in records if r.verdict == "SKIP"]
    per_kind = ", ".join(f"{k} {faults[k]}" for k in KINDS if k in faults) or "none"
    per_hit = ", ".join(f"{k} {n}" for k, n in sorted(hits.items())) or "none"
    rows = [
        f"scenarios {len(records)}: {len(records) - len(failed) - len(skipped)} passed, {len(failed)} failed, "
        f"{len(skipped)} skipped",
        f"faults injected: {per_kind}",
        f"injections (operations hit): {per_hit}",
        f"rollbacks {sum(r.rollbacks for r in records)}, replayed input-log records "
        f"{sum(r.replays for r in records)}, replayed groups {sum(r.replayed_groups for r in records)}, "
        f"losses the workers detected {sum(r.detected_losses for r in records)}, failed commits "
        f"{sum(r.commit_failures for r in records)}, failed queries {sum(r.query_failures for r in records)}",
        f"wrong keys {sum(r.wrong_keys for r in records)}, lost rows {sum(r.lost_rows for r in records)}, "
        f"extra rows {sum(r.extra_rows for r in records)}",
        f"total duration {took:.0f}s ({took / max(1, len(records)):.1f}s per scenario)",
    ]
    rows += [f"FAILED: {r.command}  ({'; '.join(r.reasons)[:200]})" for r in failed]
    rows += [f"skipped: {r.command}  ({'; '.join(r.reasons)[:200]})" for r in skipped]
    return "\n".join(rows)


# --------------------------------------------------------------------------------- the network family
def _skip(sc: Scenario, why: str) -> Record:
    return Record(
        seed=sc.seed,
        index=sc.index,
        topology=sc.topology,
        feed=sc.feed,
        workers=sc.workers,
        switch=sc.switch,
        netns=sc.netns,
        planned=[f.describe() for f in sc.faults],
        verdict="SKIP",
        reasons=[why],
        command=sc.command(),
    )


def run_in_namespaces(sc: Scenario, workdir: Path, deadline: float, keep: bool) -> Record:
    """The network family: namespaces made here, the scenario run by a child inside ``ctl``, all deleted after."""
    why = namespaces_unavailable()
    if why:
        return _skip(sc, f"the network family needs network namespaces: {why}")
    net = Network(hosts=("w0", "w1", "w2"))
    out = workdir / f"seed{sc.seed}-{sc.index}.child.json"
    log = workdir / f"seed{sc.seed}-{sc.index}.child.log"
    net.create()
    try:
        state = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(net).items() if k != "created"}
        cmd = [
            *("ip", "netns", "exec", net.ns["ctl"], sys.executable, "-m", "bench.chaos"),
            *("--seed", str(sc.seed), "--only", str(sc.index), "--deadline", str(deadline)),
            *("--workdir", str(workdir), "--json", str(out), "--inside", json.dumps(state)),
            *(["--keep"] if keep else []),
        ]
        with log.open("w") as sink:
            child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
            try:
                child.wait(deadline + 150)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)
                record = _skip(sc, f"hang: the child running the scenario did not end within {deadline + 150:.0f}s")
                record.verdict = "FAIL"
                record.kept = str(log)
                return record
        try:
            data = json.loads(out.read_text())[0]
        except (OSError, ValueError, IndexError) as exc:
            record = _skip(sc, f"the child running the scenario left no record ({exc}); see {log}")
            record.verdict = "FAIL"
            return record
        return Record(**data)
    finally:
        net.delete()
        if out.exists():
            out.unlink()
        if log.exists() and not keep:
            log.unlink()


def _inside(state: dict[str, Any]) -> Network:
    """The parent's Network as seen by the child in ``ctl`` (it creates and deletes nothing)."""
    net = Network.__new__(Network)
    vars(net).update({k: tuple(v) if k == "names" else v for k, v in state.items()})
    net.created = []
    return net


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--scenarios", type=int, default=1, help="scenarios 0..N-1 of the seed")
    parser.add_argument("--only", default=None, help="run these indices only (comma-separated): a replay")
    parser.add_argument("--json", type=Path, default=None, help="write the per-scenario records here")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds a scenario may take (a hang fails)")
    parser.add_argument("--workdir", type=Path, default=None, help="scenario directories (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the directories of passing scenarios too")
    parser.add_argument("--dry-run", action="store_true", help="print the drawn scenarios; run nothing")
    parser.add_argument("--verbose", action="store_true", help="the harness's own log (INFO) on stderr")
    parser.add_argument("--inside", default=None, help=argparse.SUPPRESS)  # the network family's child
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the finally blocks stop the workers (their parent-death signal
    # does too) and delete the namespaces, killing what still runs inside them.
    signal.signal(signal.SIGTERM, _terminate)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # the in-process client's and coordinator's warnings: the workers' logs have them
        logging.getLogger("spark_storm").setLevel(logging.ERROR)
    indices = [int(i) for i in args.only.split(",")] if args.only else list(range(args.scenarios))
    scenarios = [draw(args.seed, i) for i in indices]
    if args.dry_run:
        for sc in scenarios:
            shape = f"{sc.topology}/{sc.feed} {sc.workers}w in{sc.sources} mid{sc.mid_parallelism}"
            shape += f" stateful{sc.stateful_parallelism}x{sc.stateful_tasks}t {sc.batches}b x{sc.rows}"
            extra = f"{' 1us' if sc.switch else ''}{' netns' if sc.netns else ''}"
            extra += f" interval{sc.interval_ms}" if sc.interval_ms else ""
            extra += f" {sc.window_bolt} {dict(sc.window or {})}" if sc.window else ""
            print(f"#{sc.index}: {shape}{extra}")
            for f in sc.faults:
                print(f"    {f.describe()}")
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"bench-chaos-{args.seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    import spark_storm

    if args.inside is None:
        print(f"bench.chaos: seed {args.seed}, {len(scenarios)} scenario(s), spark_storm from {spark_storm.__file__}")
        print(f"bench.chaos: scenario directories under {workdir}", flush=True)
        race = os.environ.get("SPARK_STORM_SWITCH_INTERVAL_US")
        if race:  # the race tier's override (spark_storm.worker.settings): the workers inherit it
            print(f"bench.chaos: SPARK_STORM_SWITCH_INTERVAL_US={race} is set: every worker runs at that interval")
    records: list[Record] = []
    started = time.monotonic()
    try:
        for sc in scenarios:
            if args.inside is not None:
                record = run_scenario(sc, workdir, args.deadline, keep=args.keep, net=_inside(json.loads(args.inside)))
            elif sc.netns:
                record = run_in_namespaces(sc, workdir, args.deadline, args.keep)
            else:
                if sc.spark:
                    _warm_spark(workdir, args.verbose)
                record = run_scenario(sc, workdir, args.deadline, keep=args.keep)
            records.append(record)
            if args.inside is None:
                print(line(record), flush=True)
            if args.json is not None:
                args.json.write_text(json.dumps([r.as_json() for r in records], indent=1))
    finally:
        stop_spark()
    took = time.monotonic() - started
    if args.inside is None:
        print(summary(records, took), flush=True)
        if _STDERR_MOVED and _STDERR_MOVED[0].stat().st_size == 0:
            _STDERR_MOVED[0].unlink()
        if not os.listdir(workdir) and args.workdir is None:
            os.rmdir(workdir)
    return 1 if any(r.verdict == "FAIL" for r in records) else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


_STDERR_MOVED: list[Path] = []


def _warm_spark(workdir: Path, verbose: bool) -> None:
    """Start the one SparkSession before a scenario's clock runs (the JVM takes seconds).

    Unless ``verbose``, this process's stderr goes to ``<workdir>/stderr.log`` first: a query
    stopped mid-batch makes the JVM and py4j print long traces there (Spark's own, expected
    on an interrupted micro-batch), and the report is on stdout.
    """
    from bench.chaos_run import spark_session

    if not verbose and not _STDERR_MOVED:
        path = workdir / "stderr.log"
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        _STDERR_MOVED.append(path)
        print(f"bench.chaos: stderr (Spark's and py4j's traces) goes to {path} from now on", flush=True)
    spark_session()


if __name__ == "__main__":
    raise SystemExit(main())
