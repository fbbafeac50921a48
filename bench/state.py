"""What exact state costs (issue 17's targets), as ratios measured in one run.

Four parts (``--parts``; best of ``--rounds`` where a best makes sense):

(a) checkpoint overhead: the tuple wordcount (``StatefulCountBolt``) and the columnar one
    (``StatefulCountBatchBolt``), two workers each, fed by a plain client the way
    bench/worker.py feeds them (sentences as msgpack tuples, or Arrow sentence batches),
    so checkpoints come from the workers' own interval coordinator at
    ``topology.state.checkpoint.interval.ms`` (1000, the default).  Three sides per
    topology, interleaved per round: the same topology with ``memory`` state (the
    baseline of the target), with the ``embedded`` default (files, fsync) and, for
    reference, with the stateless count bolt.  Throughput is words counted per second
    (client's first send until the last stage executed them all: the tuple report bolt, the
    columnar count bolt); the epochs committed
    during the measurement are read from the workers' ``/health`` (``checkpoint``).
    CPU seconds per million words (utime + stime of the client and both workers, least of
    the rounds) are printed beside: on a loaded machine they move less than throughput.
    ``--vocabulary N`` feeds sentences of N distinct words instead of the bundled
    corpus (140 words), so that every checkpoint writes many keys.
(b) a state ``get`` + ``put`` in the bolt: ``n = state.get(k, 0) + 1; state.put(k, n)``
    on a warm ``KeyValueState`` of ``--keys`` keys, in this process (best of
    ``--rounds`` x 5 timings), beside the same loop on a plain dict; str keys with int
    values, list keys, and the columnar ``get_many`` + ``put_many`` per key.
(c) recovery: a stateful keyed count fed by Spark (``format("storm")``, ``delivery=
    processed``, the default ``ackTimeoutMs``, trigger and retries; a rate source) over
    two workers; ``--kills`` times a worker holding a source task is SIGKILLed and
    restarted at once (as LocalCluster or a supervisor would).  The stream flows again
    when a micro-batch planned after the kill is committed (Spark's ``commits/<id>``
    file): that batch's rows went through every stateful task and its epoch is durable.
    Also printed: when the worker ran again and when the first batch committed.
(d) one hop's latency: bench/latency.py's two-worker hop (emit on worker A -> execute on
    worker B) with a stateless sink and with a stateful one (a ``get`` + ``put`` per tuple,
    embedded state, checkpoints every second), rounds interleaved, at 10 % and 50 % of the
    stateless hop's maximum throughput; the noise is the spread of the stateless rounds.
(e) state TTL (issue 27), in this process: the cost of TTL's bookkeeping as a ratio of
    ``get`` + ``put`` with TTL on over TTL off (a warm state of ``--keys`` keys; the hot
    path alone, and with a barrier every ``--ttl-epoch`` operations: ``advance``, the
    changes taken and the entry encoded as the executor does; rounds interleaved, best
    of); then ``--ttl-keys`` distinct keys streamed through a state with a TTL of
    ``--ttl-epochs`` epochs, a barrier per ``--ttl-epoch`` new keys, the process's RSS
    and the full snapshots' size sampled: flat after the first TTL period.

Why (a) feeds through a window and gives the columnar topology bigger queues: a queue can
hold more than its capacity (one publish larger than the capacity enters an empty queue,
e.g. held tuples released at once), the worker then reports a load over 1
(``WorkerState.task_loads``), its peers drop the connection on that "malformed" frame,
and a backpressure "off" sent meanwhile is lost: the sender holds those tasks' tuples
for good and the topology stalls (seen in about one run in three of the stateless tuple
wordcount fed without a window, on this machine under load).

(f) savepoints (issue 27): ``bench/savepoint.py`` over ``--savepoint-keys`` keys, its
    figures printed as it goes: a savepoint written, restored, and restored rescaled.

    python -m bench.state [--parts overhead,getput,recovery,hop,ttl,savepoint] [--rounds 3] [--sentences 40000]
                          [--words 6000000] [--vocabulary 0] [--keys 100000] [--kills 3] [--set KEY=VALUE]
                          [--ttl-keys 10000000] [--ttl-epoch 100000] [--ttl-epochs 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Mapping
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import yaml

from bench.latency import _Recorder, hop
from bench.scale import cpu_seconds
from bench.worker import executed
from spark_storm.bolts import StatefulBolt
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.payloads import arrow_payload
from spark_storm.codec.tuples import Tuple
from spark_storm.errors import StormError
from spark_storm.messaging import TaskMessage
from spark_storm.state import KeyValueState
from spark_storm.state.format import TtlMeta, encode_entry_parts
from spark_storm.state.kv import TtlKeyValueState
from spark_storm.topology import Slot
from spark_storm.transport import make_context
from spark_storm.worker.bolt import OutputCollector, TopologyContext

WC = "spark_storm.examples.wordcount"
WCA = "spark_storm.examples.wordcount_arrow"
COUNT_BOLTS = {
    "tuple": {"stateless": f"{WC}:CountBolt", "stateful": f"{WC}:StatefulCountBolt"},
    "columnar": {"stateless": f"{WCA}:CountBatchBolt", "stateful": f"{WCA}:StatefulCountBatchBolt"},
}
_WORD = re.compile(r"[\w']+")


def uptime_load() -> str:
    """The 1-minute load average (this machine has other users): printed beside every figure."""
    return f"{os.getloadavg()[0]:.1f}"


# --- (a) checkpoint overhead ------------------------------------------------------------------------


def wordcount_topology(kind: str, side: str, tmp: Path) -> dict[str, Any]:
    """The bundled wordcount (tuple or columnar) with the count bolt and state provider of ``side``."""
    name = "wordcount.yaml" if kind == "tuple" else "wordcount-arrow.yaml"
    spec: dict[str, Any] = yaml.safe_load(resources.files("spark_storm.examples").joinpath(name).read_text())
    spec["name"] = f"bench-state-{kind}"
    conf = spec.setdefault("conf", {})
    if side == "embedded":
        conf["topology.state.provider"] = "embedded"
        conf["topology.state.provider.config"] = {"dir": str(tmp / "state")}
    elif side == "memory":
        conf["topology.state.provider"] = "memory"
    for comp in spec["components"]:
        if comp["id"] == "count":
            comp["bolt"] = COUNT_BOLTS[kind]["stateless" if side == "stateless" else "stateful"]
        if comp["id"] == "report":
            comp["conf"]["report.dir"] = str(tmp / "report")
    return spec


def sentences(vocabulary: int, count: int) -> list[str]:
    """``count`` sentences: the bundled corpus cycled, or random words out of ``vocabulary`` distinct ones."""
    if vocabulary <= 0:
        corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text().splitlines()
        return [corpus[i % len(corpus)] for i in range(count)]
    rng = random.Random(17)
    return [" ".join(f"w{rng.randrange(vocabulary)}" for _ in range(11)) for _ in range(count)]


def words_in(lines: list[str]) -> int:
    return sum(len(_WORD.findall(s.lower())) for s in lines)


def checkpoint_view(cluster: LocalCluster) -> dict[str, Any]:
    """Committed epochs (the coordinator's worker), rollbacks, and the count tasks' checkpoint times."""
    committed = rollbacks = 0
    p50: list[float] = []
    p99: list[float] = []
    keys = size = 0
    for slot in cluster.slots:
        health = cluster.health(slot)
        cp = health["checkpoint"]
        if cp is not None:
            committed = max(committed, cp["committed_epochs"])
            rollbacks = max(rollbacks, cp["rollbacks"])
        for ex in health["executors"].values():
            st = ex["state"]
            if ex["component"] == "count" and st is not None:
                if (v50 := st["checkpoint_p50_ms"]) is not None:
                    p50.append(v50)
                if (v99 := st["checkpoint_p99_ms"]) is not None:
                    p99.append(v99)
                keys += st["keys"]
                size += st["last_checkpoint_bytes"]
    return {
        "committed": committed,
        "rollbacks": rollbacks,
        "p50_ms": max(p50, default=None),
        "p99_ms": max(p99, default=None),
        "keys": keys,
        "bytes": size,
    }


class Work:
    """What one wordcount side is fed: sends (payloads for one source task) with their words, cycled."""

    def __init__(
        self, sends: list[tuple[list[bytes], int]], rounds: int, window: int, end: str, conf: dict[str, Any]
    ) -> None:
        self.sends = sends
        self.end = end
        self.rounds = rounds
        self.window = window
        self.conf = conf
        self.total = sum(n for _, n in sends) * rounds


def run_wordcount(kind: str, side: str, work: Work, overrides: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Feed ``work`` to the source tasks, at most ``work.window`` words in flight; seconds until all are counted.

    The window keeps the executor queues short, as a steady stream does (and as Spark's
    delivery groups do): a checkpoint's barrier then waits behind a fraction of a second of
    input, not behind everything sent, so rounds run at the configured interval.  It also
    keeps every queue under its capacity: a batch that overfills a queue makes the worker
    report a load over 1, which its peers reject as a malformed frame (see the module doc).
    """
    tmp = Path(tempfile.mkdtemp(prefix="bench-state-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(wordcount_topology(kind, side, tmp)))
    cluster = LocalCluster(str(path), 2, overrides={**work.conf, **overrides}).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    try:
        sources = list(cluster.plan.component_tasks["sentences"])
        conns = {s: ctx.connect(cluster.topology.name, s.host, s.port) for s in cluster.slots}
        for c in conns.values():
            c.wait_ready(30)
        plan = []
        for i, (payloads, n) in enumerate(work.sends):
            task = sources[i % len(sources)]
            plan.append((conns[cluster.plan.task_slot[task]], [TaskMessage(task, p) for p in payloads], n))
        before = checkpoint_view(cluster) if side != "stateless" else {}
        progress = _Progress(cluster, work.end)
        sent = 0
        pids = [os.getpid(), *(p.pid for p in cluster.procs.values())]
        cpu0 = sum(sum(cpu_seconds(p)) for p in pids)
        t0 = time.perf_counter()
        for _ in range(work.rounds):
            for conn, msgs, n in plan:
                while sent + n - progress.done > work.window:
                    progress.poll(sent)
                conn.send(msgs)
                sent += n
        while progress.done < work.total:
            progress.poll(sent)
        secs = time.perf_counter() - t0
        cpu = sum(sum(cpu_seconds(p)) for p in pids) - cpu0
        after = checkpoint_view(cluster) if side != "stateless" else {}
        if after:
            after["epochs"] = after["committed"] - before["committed"]
        after["cpu"] = cpu
        return secs, after
    finally:
        ctx.term()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class _Progress:
    """Words the ``end`` component executed, polled from /health (every 10 ms while the feeder waits)."""

    def __init__(self, cluster: LocalCluster, end: str) -> None:
        self.cluster = cluster
        self.end = end
        self.done = 0
        self.at = time.perf_counter()

    def poll(self, sent: int) -> None:
        time.sleep(0.01)
        done = executed(self.cluster, self.end)
        if done > self.done:
            self.done, self.at = done, time.perf_counter()
        elif time.perf_counter() - self.at > 60:
            tails = "\n".join(f"--- {s}:\n{self.cluster.log_tail(s, 15)}" for s in self.cluster.slots)
            msg = f"no progress for 60s: {self.done:,} of {sent:,} words counted; the workers' logs end:\n{tails}"
            raise RuntimeError(msg)


def overhead(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    rows = args.rows_per_message  # sentences per Arrow payload of the columnar wordcount
    lines = sentences(args.vocabulary, max(4 * rows, 4000 if args.vocabulary <= 0 else 20_000))
    per_send = 100  # sentences per client send to the tuple wordcount (one tuple each)
    tuple_sends = [
        ([msgpack.packb([s]) for s in lines[i : i + per_send]], words_in(lines[i : i + per_send]))
        for i in range(0, len(lines), per_send)
    ]
    arrow_sends = [
        ([arrow_payload(pa.record_batch({"sentence": lines[i : i + rows]}))], words_in(lines[i : i + rows]))
        for i in range(0, len(lines) - rows + 1, rows)
    ]
    tuple_round = sum(n for _, n in tuple_sends)
    arrow_round = sum(n for _, n in arrow_sends)
    work = {
        # the tuple report bolt gets a tuple per word (and is the slowest stage): the window ends there;
        # the columnar one gets a row per distinct word of a batch, so its words are counted at `count`
        "tuple": Work(tuple_sends, max(1, args.words_tuple // tuple_round), args.window_tuple, "report", {}),
        "columnar": Work(
            arrow_sends,
            max(1, args.words // arrow_round),
            args.window_columnar,
            "count",
            {"topology.executor.receive.buffer.size": args.columnar_queue},
        ),
    }
    sides = ("memory", "embedded", "stateless")
    best: dict[tuple[str, str], tuple[float, dict[str, Any], str]] = {}
    least_cpu: dict[tuple[str, str], float] = {}
    kinds = [k.strip() for k in args.topologies.split(",") if k.strip()]
    for r in range(args.rounds):
        for kind in kinds:
            for side in sides:
                load = uptime_load()
                secs, cp = run_wordcount(kind, side, work[kind], overrides)
                rate = work[kind].total / secs
                per_m = cp["cpu"] / work[kind].total * 1e6
                least_cpu[(kind, side)] = min(least_cpu.get((kind, side), per_m), per_m)
                extra = f", {per_m:.2f} CPU s/M words"
                extra += f", {cp['epochs']} epochs committed in {secs:.1f}s" if "epochs" in cp else f" in {secs:.1f}s"
                print(
                    f"round {r + 1}: {kind:8s} {side:9s} {rate:12,.0f} words/s{extra} (load {load})",
                    file=sys.stderr,
                    flush=True,
                )
                if (kind, side) not in best or secs < best[(kind, side)][0]:
                    best[(kind, side)] = (secs, cp, load)
    vocab = "the bundled corpus (140 words)" if args.vocabulary <= 0 else f"{args.vocabulary:,} distinct words"
    out = [
        f"(a) checkpoint overhead: 2 workers, plain client, interval checkpoints every "
        f"{overrides.get('topology.state.checkpoint.interval.ms', 1000)} ms, {vocab}, best of {args.rounds}; "
        f"in flight at most {args.window_tuple:,} words (tuple), {args.window_columnar:,} (columnar: "
        f"{rows} sentences per Arrow payload, executor queues of {args.columnar_queue:,} rows)",
        f"  {'topology':9s} {'side':10s} {'words/s':>12s} {'vs memory':>10s} {'CPU s/M':>8s} {'vs memory':>10s} "
        f"{'epochs':>7s} {'per s':>6s} {'ckpt p50/p99 ms':>16s} {'keys':>8s} {'load':>5s}",
    ]
    for kind in kinds:
        total = work[kind].total
        base = total / best[(kind, "memory")][0]
        base_cpu = least_cpu[(kind, "memory")]
        for side in sides:
            secs, cp, load = best[(kind, side)]
            rate = total / secs
            cpu_cells = f"{least_cpu[(kind, side)]:8.2f} {least_cpu[(kind, side)] / base_cpu:10.1%}"
            if "epochs" in cp:
                ck = f"{cp['p50_ms'] or 0:7.1f}/{cp['p99_ms'] or 0:<7.1f}"
                tail = f"{cp['epochs']:7d} {cp['epochs'] / secs:6.2f} {ck:>16s} {cp['keys']:8,d}"
            else:
                tail = f"{'-':>7s} {'-':>6s} {'-':>16s} {'-':>8s}"
            out.append(f"  {kind:9s} {side:10s} {rate:12,.0f} {rate / base:10.1%} {cpu_cells} {tail} {load:>5s}")
        emb = best[(kind, "memory")][0] / best[(kind, "embedded")][0]
        verdict = "met" if emb >= 0.95 else "NOT met"
        extra_cpu = least_cpu[(kind, "embedded")] / base_cpu - 1
        out.append(
            f"  {kind}: embedded costs {1 - emb:+.1%} of the memory side's throughput (target <= 5%: {verdict}); "
            f"{extra_cpu:+.1%} CPU per word"
        )
    return out


# --- (b) get + put ---------------------------------------------------------------------------------


def getput(args: argparse.Namespace) -> list[str]:
    rng = random.Random(3)
    n: int = args.keys
    load = uptime_load()
    str_keys = [f"word{i:07d}" for i in range(n)]
    order = [str_keys[rng.randrange(n)] for _ in range(n)]
    state = KeyValueState({k: i for i, k in enumerate(str_keys)})
    plain = {k: i for i, k in enumerate(str_keys)}
    list_keys = [["user", i % 1000, f"k{i}"] for i in range(n)]
    list_order = [list(list_keys[rng.randrange(n)]) for _ in range(n)]  # fresh lists, as tuples carry them
    lstate = KeyValueState({tuple(k): i for i, k in enumerate(list_keys)})
    lstate.put(list_keys[0], 0)  # frozen form, as the state keeps list keys

    def state_loop(st: KeyValueState, keys: list[Any]) -> Callable[[], None]:
        def run() -> None:
            get, put = st.get, st.put
            for k in keys:
                put(k, get(k, 0) + 1)

        return run

    def dict_loop() -> None:
        d = plain
        get = d.get
        for k in order:
            d[k] = get(k, 0) + 1

    def empty_loop() -> None:
        for _k in order:
            pass

    arrow_keys = pa.array(order)
    arrow_n = pa.array(np.ones(n, dtype=np.int64))

    def columnar() -> None:
        import pyarrow.compute as pc

        state.put_many(arrow_keys, pc.add(state.get_many(arrow_keys, 0), arrow_n))

    def best_ns(fn: Callable[[], None]) -> float:
        times = timeit.repeat(fn, number=1, repeat=max(5, 5 * args.rounds))
        return float(min(times)) / n * 1e9

    loop = best_ns(empty_loop)
    d = best_ns(dict_loop)
    s = best_ns(state_loop(state, order))
    lst = best_ns(state_loop(lstate, list_order))
    col = best_ns(columnar)
    state.take_changes()
    verdict = "met" if s <= 1000 else "NOT met"
    return [
        f"(b) state get + put in the bolt, {n:,} warm keys, int values, best of {max(5, 5 * args.rounds)} "
        f"(load {load}); ns per get + put, the loop included:",
        f"  plain dict get + set (reference)  {d:8.0f} ns   (an empty loop: {loop:.0f} ns)",
        f"  KeyValueState, str keys           {s:8.0f} ns   {s / d:.1f}x the dict   (target <= 1000 ns: {verdict})",
        f"  KeyValueState, list keys          {lst:8.0f} ns   {lst / d:.1f}x the dict"
        f"   ({'met' if lst <= 1000 else 'NOT met'} for list keys)",
        f"  get_many + put_many (Arrow), per key {col:5.0f} ns",
    ]


# --- (c) recovery after a SIGKILL ---------------------------------------------------------------------


def recovery_topology(tmp: Path) -> Path:
    topo = {
        "name": "bench-recovery",
        "conf": {"topology.state.provider.config": {"dir": str(tmp / "state")}},
        "components": [
            {"id": "words", "source": True, "fields": ["word"], "parallelism": 2},
            {
                "id": "count",
                "bolt": f"{WC}:StatefulCountBolt",
                "fields": ["word", "count"],
                "parallelism": 2,
                "tasks": 4,
                "inputs": [{"from": "words", "grouping": "fields", "fields": ["word"]}],
            },
        ],
    }
    path = tmp / "recovery.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


class _Watcher:
    """Records when each ``offsets/<id>`` and ``commits/<id>`` file of a query's checkpoint first shows up."""

    def __init__(self, ck: Path) -> None:
        self.ck = ck
        self.planned: dict[int, float] = {}
        self.committed: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self._thread.start()

    def _scan(self, sub: str, seen: dict[int, float]) -> None:
        try:
            names = os.listdir(self.ck / sub)
        except OSError:
            return
        now = time.monotonic()
        for name in names:
            if name.isdigit() and int(name) not in seen:
                seen[int(name)] = now

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._scan("offsets", self.planned)
            self._scan("commits", self.committed)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class _Sampler:
    """Each worker's Spark-writer counters from /health, 10 times a second: when groups arrive, fail, replay."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, Slot, int, int, int]] = []  # wall, worker, groups, replays, failed
        self.generations: list[tuple[float, Slot, int]] = []  # wall, worker, its generation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sample", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for slot in self.cluster.slots:
                try:
                    health = self.cluster.health(slot, timeout=1.0)
                except (OSError, StormError):  # a dead or starting worker: no sample
                    continue
                writers = health["writers"]
                if health["checkpoint"] is not None:
                    self.generations.append((time.time(), slot, health["checkpoint"]["generation"]))
                self.samples.append(
                    (
                        time.time(),
                        slot,
                        sum(w["groups"] for w in writers),
                        sum(w["replays"] for w in writers),
                        sum(w["failed"] for w in writers),
                    )
                )

    def steps(self, victim: Slot, since: float) -> list[tuple[float, str]]:
        """When, after ``since``, the restarted victim got its first group and a worker saw resent groups."""
        out: list[tuple[float, str]] = []
        before: dict[Slot, tuple[int, int, int]] = {}
        noted: set[str] = set()
        for wall, slot, groups, replays, failed in list(self.samples):
            if wall < since:
                before[slot] = (groups, replays, failed)
                continue
            who = "victim" if slot == victim else "survivor"
            g0, r0, f0 = before.get(slot, (0, 0, 0)) if slot != victim else (0, 0, 0)
            for what, now, was in (
                ("a Spark group arrives", groups, g0),
                ("a group is a replay (Spark's task retry resent it)", replays, r0),
                ("a group acked FAILED", failed, f0),
            ):
                step = f"{who} worker: {what}"
                if now > was and step not in noted:
                    noted.add(step)
                    out.append((wall, step))
        latest: dict[Slot, int] = {}
        for wall, slot, generation in list(self.generations):
            latest[slot] = generation
            if wall >= since and slot == victim and len(latest) == len(self.cluster.slots):
                others = max(g for s, g in latest.items() if s != victim)
                if generation < others:
                    out.append(
                        (
                            wall,
                            f"victim at generation {generation}, survivor at {others}: the survivor drops the "
                            "victim's tuples as stale until a rollback",
                        )
                    )
                break
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


#: Worker log lines that mark the steps of a recovery (first match after the kill, per worker).
_WORKER_STEPS = (
    ("listening", "listening"),
    ("executors active", "executors active"),
    ("lost the connection", "lost the connection"),
    ("rolling every worker back", "its interval coordinator starts a round with a rollback (no Spark lease)"),
    ("paused for a rollback", "paused for a rollback"),
    ("rolled back to epoch", "rolled back, replaying"),
)


def _worker_steps(log: Path, since_wall: float) -> list[tuple[float, str]]:
    """(wall time, step) of the first line of each recovery step in a worker log, after ``since_wall``."""
    out: list[tuple[float, str]] = []
    seen: set[str] = set()
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
        except ValueError:
            continue
        if stamp < since_wall:
            continue
        for needle, step in _WORKER_STEPS:
            if needle in line and step not in seen:
                seen.add(step)
                out.append((stamp, step))
    return out


def _commits_since(watch: _Watcher, since: float, n: int) -> bool:
    return sum(1 for t in list(watch.committed.values()) if t > since) >= n


def _wait(pred: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            msg = f"gave up after {timeout:.0f}s waiting for {what}"
            raise RuntimeError(msg)
        time.sleep(0.01)


def _kill_and_recover(
    cluster: LocalCluster, victim: Slot, watch: _Watcher, query: Any, sampler: _Sampler
) -> tuple[dict[str, float], list[str]]:
    """SIGKILL the worker of ``victim``, restart it at once, time the stream's return; and the timeline."""
    load = uptime_load()
    wall_kill = time.time()
    t_kill = time.monotonic()
    os.kill(cluster.procs[victim].pid, signal.SIGKILL)
    cluster.procs[victim].wait(10)
    cluster.start_worker(victim)
    pid = cluster.procs[victim].pid

    def running() -> bool:
        hb = cluster.heartbeat(victim)
        return hb is not None and hb["pid"] == pid and hb["status"] == "running"

    _wait(running, "the restarted worker running", 120)
    t_running = time.monotonic()

    def after_kill() -> list[float]:
        return [watch.committed[b] for b, t in list(watch.planned.items()) if t > t_kill and b in watch.committed]

    _wait(lambda: bool(after_kill()) or not query.isActive, "a batch planned after the kill committed", 180)
    if not query.isActive:
        msg = f"the query stopped after the kill: {query.exception()}"
        raise RuntimeError(msg)
    t_first = min(t for t in list(watch.committed.values()) if t > t_kill)
    t_flow = min(after_kill())
    cp = cluster.health(victim)["checkpoint"]
    result = {
        "running": t_running - t_kill,
        "first_commit": t_first - t_kill,
        "flows": t_flow - t_kill,
        "rollbacks": float(cp["rollbacks"] if cp else 0),
        "load": float(load),
    }
    end_wall = wall_kill + (t_flow - t_kill) + 0.5
    steps: list[tuple[float, str]] = [(wall_kill, "SIGKILL")]
    for slot in cluster.slots:
        who = "victim" if slot == victim else "survivor"
        steps += [(w, f"{who} worker: {step}") for w, step in _worker_steps(cluster.logs[slot], wall_kill)]
    steps += sampler.steps(victim, wall_kill)
    wall_of = wall_kill - t_kill  # monotonic -> wall
    for batch, t in sorted(watch.planned.items()):
        if t_kill - 3 < t and t + wall_of <= end_wall:
            steps.append((t + wall_of, f"spark: batch {batch} planned"))
    for batch, t in sorted(watch.committed.items()):
        if t_kill < t and t + wall_of <= end_wall:
            steps.append((t + wall_of, f"spark: batch {batch} committed"))
    timeline = [f"    {w - wall_kill:+7.2f}s  {what}" for w, what in sorted(steps) if w <= end_wall]
    for progress in query.recentProgress:
        if progress["batchId"] in watch.planned and t_kill - 3 < watch.planned[progress["batchId"]] <= t_flow:
            d = progress["durationMs"]
            timeline.append(
                f"    batch {progress['batchId']}: {progress['numInputRows']} rows, addBatch "
                f"{d.get('addBatch', 0) / 1000:.2f}s (writes, acks and the commit's checkpoint round), "
                f"trigger {d.get('triggerExecution', 0) / 1000:.2f}s"
            )
    return result, timeline


def recovery(args: argparse.Namespace) -> list[str]:
    from pyspark.sql import functions as F

    from spark_storm.spark import register
    from spark_storm.spark.session import local_session

    tmp = Path(tempfile.mkdtemp(prefix="bench-state-recovery-"))
    path = recovery_topology(tmp)
    spark = local_session("bench-state", quiet=True)
    register(spark)
    ck = tmp / "ck"
    results: list[dict[str, float]] = []
    timelines: list[list[str]] = []
    cadence: list[float] = []
    with LocalCluster(str(path), 2) as cluster:
        plan = cluster.plan
        victims = [s for s in cluster.slots if any(plan.task_slot[t] == s for t in plan.component_tasks["words"])]
        df = spark.readStream.format("rate").option("rowsPerSecond", args.rate).load()
        df = df.select(F.concat(F.lit("w"), (F.col("value") % 997).cast("string")).alias("word"))
        query = (
            df.writeStream.format("storm")
            .option("topology", str(path))
            .option("workers", cluster.workers_arg)
            .option("delivery", "processed")
            .option("checkpointLocation", str(ck))
            .start()
        )
        watch = _Watcher(ck)
        sampler = _Sampler(cluster)
        try:
            _wait(lambda: len(watch.committed) >= 3, "three micro-batches committed (warm-up)", 180)
            for k in range(args.kills):
                steady_from = time.monotonic()  # a steady stream between kills: three commits (the cadence)
                _wait(partial(_commits_since, watch, steady_from, 3), "three micro-batches committed", 180)
                recent = sorted(t for t in watch.committed.values() if t > steady_from)
                cadence += [b - a for a, b in itertools.pairwise(recent)]
                victim = victims[k % len(victims)]
                r, timeline = _kill_and_recover(cluster, victim, watch, query, sampler)
                results.append(r)
                timelines.append(timeline)
                print(
                    f"kill {k + 1}: worker {victim} running again after {r['running']:.2f}s, first commit "
                    f"{r['first_commit']:.2f}s, a batch planned after the kill committed {r['flows']:.2f}s, "
                    f"{r['rollbacks']:.0f} rollbacks (load {r['load']:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            sampler.stop()
            watch.stop()
            query.stop()
            spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    worst = max(r["flows"] for r in results)
    med = statistics.median(r["flows"] for r in results)
    normal = statistics.median(cadence) if cadence else float("nan")
    out = [
        f"(c) recovery after a SIGKILL: Spark rate source {args.rate:,} rows/s -> format('storm'), "
        "delivery=processed, default ackTimeoutMs and trigger, local[2,4]; 2 workers, stateful keyed count "
        "(embedded); the victim restarted at once",
        f"  commit cadence before the kills: median {normal:.2f} s between micro-batch commits",
        f"  {'kill':>4s} {'running again':>14s} {'first commit':>13s} {'flows again':>12s} {'load':>5s}",
    ]
    for k, r in enumerate(results):
        out.append(
            f"  {k + 1:4d} {r['running']:13.2f}s {r['first_commit']:12.2f}s {r['flows']:11.2f}s {r['load']:5.1f}"
        )
    verdict = "met" if worst <= 10 else "NOT met"
    out.append(f"  flows again: median {med:.2f} s, worst {worst:.2f} s (target <= 10 s: {verdict})")
    slowest = max(range(len(results)), key=lambda i: results[i]["flows"])
    out.append(f"  where the time went, kill {slowest + 1} (seconds after the SIGKILL):")
    out += timelines[slowest]
    return out


# --- (d) one hop's p99 --------------------------------------------------------------------------------


class StatefulLatencyBolt(_Recorder, StatefulBolt):
    """bench.latency's LatencyBolt with state: records ``now - stamp``, then a get + put per tuple."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self._start(conf, context)

    def init_state(self, state: KeyValueState) -> None:
        self.counts = state

    def execute(self, tup: Tuple) -> None:
        self.samples.append(time.monotonic_ns() - tup.values[0])
        key = tup.values[1]
        self.counts.put(key, self.counts.get(key, 0) + 1)
        self.collector.ack(tup)

    def cleanup(self) -> None:
        self._write()


def hops(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-state-hop-"))
    sides: dict[str, tuple[str, dict[str, Any]]] = {
        "stateless": ("bench.latency:LatencyBolt", {}),
        "stateful": (
            "bench.state:StatefulLatencyBolt",
            {"topology.state.provider.config": {"dir": str(tmp / "state")}},
        ),
    }
    tops: dict[str, float] = {}
    for name, (sink, conf) in sides.items():
        tops[name], _ = hop(overrides, None, 0, args.max_tuples, sink=sink, conf=conf)
    top = tops["stateless"]
    p99: dict[tuple[str, float], list[float]] = {}
    kept: dict[float, Any] = {}
    loads: list[str] = []
    for r in range(args.rounds):
        for fraction in (0.1, 0.5):
            for name, (sink, conf) in sides.items():
                loads.append(uptime_load())
                shutil.rmtree(tmp / "state", ignore_errors=True)
                _, samples = hop(overrides, top * fraction, args.seconds, 0, sink=sink, conf=conf)
                value = float(np.percentile(np.asarray(samples, dtype=np.float64) / 1e6, 99))
                p99.setdefault((name, fraction), []).append(value)
                if name == "stateful":
                    kept[fraction] = samples
                print(
                    f"round {r + 1}: hop at {fraction:.0%} {name:9s} p99 {value:8.3f} ms (load {loads[-1]})",
                    file=sys.stderr,
                    flush=True,
                )
    shutil.rmtree(tmp, ignore_errors=True)
    out = [
        f"(d) one inter-worker hop, p99 over {args.seconds:.0f}s per round, {args.rounds} rounds interleaved "
        f"(load {min(loads)}..{max(loads)}); stateful: get + put per tuple, embedded, checkpoints every second",
        f"  maximum throughput: stateless {tops['stateless']:,.0f}/s, stateful {tops['stateful']:,.0f}/s "
        f"({tops['stateful'] / tops['stateless']:.0%})",
        f"  {'rate':>12s} {'stateless p99 ms (rounds)':>34s} {'stateful p99 ms (rounds)':>34s} {'verdict':>10s}",
    ]
    for fraction in (0.1, 0.5):
        base, stf = p99[("stateless", fraction)], p99[("stateful", fraction)]
        noise_hi = max(base)
        within = statistics.median(stf) <= noise_hi
        cells = [" ".join(f"{v:.2f}" for v in vals) for vals in (base, stf)]
        out.append(
            f"  {fraction:4.0%} {top * fraction:7,.0f}/s {cells[0]:>34s} {cells[1]:>34s} "
            f"{'unchanged' if within else 'higher':>10s}"
        )
    out.append("  unchanged = the stateful median p99 is within the stateless rounds' range (the bench's noise)")
    for fraction in (0.1, 0.5):
        threshold = 2 * statistics.median(p99[("stateless", fraction)])
        out.append(f"  {fraction:.0%}, last stateful round: " + _bursts(kept[fraction], top * fraction, threshold))
    return out


def _bursts(samples_ns: Any, rate: float, threshold_ms: float) -> str:
    """Where a hop's slow tuples are: bursts (slow tuples closer than 50 ms in send time), their spacing and length.

    The client paces tuples at ``rate``, so the i-th executed tuple was sent about ``i / rate`` s in.
    """
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    slow = np.flatnonzero(ms > threshold_ms)
    if len(slow) == 0:
        return f"no tuple slower than {threshold_ms:.2f} ms (twice the stateless p99)"
    times = slow / rate
    starts = [0, *[int(i) + 1 for i in np.flatnonzero(np.diff(times) > 0.05)]]
    ends = [*starts[1:], len(times)]
    spans = [(times[a], times[b - 1], float(ms[slow[a:b]].max())) for a, b in zip(starts, ends, strict=True)]
    gaps = np.diff([a for a, _, _ in spans])
    spacing = f", every {float(np.median(gaps)):.2f} s (median)" if len(gaps) else ""
    return (
        f"{len(slow) / len(ms):.2%} of tuples slower than {threshold_ms:.2f} ms (twice the stateless p99), in "
        f"{len(spans)} bursts over {len(ms) / rate:.1f} s{spacing}, {sum(b - a for a, b, _ in spans) * 1000:.0f} ms "
        f"of sends in all; a burst spans a median "
        f"{float(np.median([b - a for a, b, _ in spans])) * 1000:.0f} ms of sends and peaks at a median "
        f"{float(np.median([m for _, _, m in spans])):.1f} ms"
    )


# --- (e) state TTL ----------------------------------------------------------------------------------------


def _rss_mb() -> float:
    """This process's resident set, in MB (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _barrier(state: KeyValueState, epoch: int, now: int) -> int:
    """What the executor does at a barrier (ExecutorCheckpoints._encode / _encode_ttl), without the write."""
    if isinstance(state, TtlKeyValueState):
        expired = state.advance(now)
        changes = state.take_changes()
        clock, written, ttls = state.entry_ttl(False)
        parts = encode_entry_parts(epoch, False, changes, TtlMeta(clock, written, ttls, expired))
    else:
        parts = encode_entry_parts(epoch, False, state.take_changes())
    return sum(map(len, parts))


def ttl(args: argparse.Namespace) -> list[str]:
    rng = random.Random(5)
    n: int = args.keys
    load = uptime_load()
    keys = [f"user{i:07d}" for i in range(n)]
    order = [keys[rng.randrange(n)] for _ in range(n)]
    off = KeyValueState({k: i for i, k in enumerate(keys)})
    on = KeyValueState({k: i for i, k in enumerate(keys)}).enable_ttl(3_600_000)
    on.advance(0)  # every key stamped, as after a first barrier
    on.take_changes()
    # the barrier runs get states of their own: their expiry buckets grow (a 1 h TTL never drains them)
    boff = KeyValueState({k: i for i, k in enumerate(keys)})
    bon = KeyValueState({k: i for i, k in enumerate(keys)}).enable_ttl(3_600_000)
    bon.advance(0)
    bon.take_changes()
    per = max(1, args.ttl_epoch)
    clock = [1]

    def hot(st: KeyValueState) -> Callable[[], None]:
        def run() -> None:
            get, put = st.get, st.put
            for k in order:
                put(k, get(k, 0) + 1)
            st.take_changes()

        return run

    def with_barriers(st: KeyValueState) -> Callable[[], None]:
        def run() -> None:
            get, put = st.get, st.put
            for start in range(0, n, per):
                for k in order[start : start + per]:
                    put(k, get(k, 0) + 1)
                clock[0] += 1
                _barrier(st, clock[0], clock[0])

        return run

    rounds = max(5, 5 * args.rounds)
    best: dict[str, float] = {}
    for r in range(rounds):  # interleaved, the order alternating: a load change hits both sides alike
        sides = [
            ("hot off", hot(off)),
            ("hot on", hot(on)),
            ("barriers off", with_barriers(boff)),
            ("barriers on", with_barriers(bon)),
        ]
        if r % 2:
            sides = [sides[1], sides[0], sides[3], sides[2]]
        for name, fn in sides:
            took = min(timeit.repeat(fn, number=1, repeat=1)) / n * 1e9
            best[name] = min(best.get(name, took), took)
    hot_ratio = best["hot on"] / best["hot off"]
    all_ratio = best["barriers on"] / best["barriers off"]
    lines = [
        f"(e) state TTL, {n:,} warm keys, str keys, int values, best of {rounds} interleaved (load {load}):",
        f"  get + put, TTL off              {best['hot off']:8.0f} ns",
        f"  get + put, TTL on (1 h)         {best['hot on']:8.0f} ns   ratio {hot_ratio:.3f}",
        f"  with a barrier every {per:,} ops (advance, changes taken, entry encoded):",
        f"    TTL off                       {best['barriers off']:8.0f} ns",
        f"    TTL on                        {best['barriers on']:8.0f} ns   ratio {all_ratio:.3f}"
        f"   (target <= 1.10: {'met' if all_ratio <= 1.10 else 'NOT met'})",
    ]
    lines += _ttl_stream(args)
    return lines


def _ttl_stream(args: argparse.Namespace) -> list[str]:
    total: int = args.ttl_keys
    per = max(1, args.ttl_epoch)
    period = max(1, args.ttl_epochs)
    load = uptime_load()
    state = KeyValueState().enable_ttl(period * 1000)  # a barrier per second of event time
    started = time.perf_counter()
    samples: list[tuple[int, float, int, int]] = []  # (epoch, RSS MB, live keys, full snapshot bytes)
    since_full = 0
    epoch = 0
    for start in range(0, total, per):
        epoch += 1
        put = state.put
        for i in range(start, min(total, start + per)):
            put(f"user{i:09d}", i)
        expired = state.advance(epoch * 1000)
        since_full += state.changed + len(expired)
        full = since_full > max(1000, len(state))
        changes = state.snapshot() if full else state.take_changes()
        clock, written, ttls = state.entry_ttl(full)
        size = sum(map(len, encode_entry_parts(epoch, full, changes, TtlMeta(clock, written, ttls, expired))))
        del changes
        if full:
            since_full = 0
        samples.append((epoch, _rss_mb(), len(state), size if full else 0))
    took = time.perf_counter() - started
    after = [s for s in samples if s[0] > 2 * period]
    rss = [s[1] for s in after]
    fulls = [s[3] for s in after if s[3]]
    step = max(1, len(samples) // 12)
    shown = ", ".join(f"{e}: {r:.0f} MB/{k // 1000}k" for e, r, k, _ in samples[::step])
    # flat: no trend once the state holds one TTL period of keys (a full snapshot's buffers come and go)
    half = len(rss) // 2
    growth = max(rss[half:]) / max(rss[:half]) - 1 if half else float("nan")
    return [
        f"  {total:,} distinct keys streamed, {per:,} new keys per epoch, TTL {period} epochs, "
        f"{epoch} barriers in {took:.1f} s (load {load} at the start, {uptime_load()} at the end):",
        f"    RSS / live keys by epoch: {shown}",
        f"    after the first two TTL periods: RSS {min(rss):.0f}..{max(rss):.0f} MB, the second half's peak "
        f"{growth:+.1%} on the first half's, "
        f"live keys {min(s[2] for s in after):,}..{max(s[2] for s in after):,}, "
        f"full snapshots {min(fulls, default=0) / 1e6:.1f}..{max(fulls, default=0) / 1e6:.1f} MB "
        f"({len(fulls)} of them)   (target flat: {'met' if growth <= 0.10 else 'NOT met'})",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="overhead,getput,recovery,hop")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--topologies", default="tuple,columnar", help="wordcounts of (a)")
    parser.add_argument("--words-tuple", type=int, default=1_500_000, help="about this many words, tuple wordcount")
    parser.add_argument("--words", type=int, default=15_000_000, help="about this many words, columnar wordcount")
    parser.add_argument("--window-tuple", type=int, default=15_000, help="words in flight at most (tuple)")
    parser.add_argument("--window-columnar", type=int, default=200_000, help="words in flight at most (columnar)")
    parser.add_argument("--rows-per-message", type=int, default=4096, help="sentences per Arrow payload")
    parser.add_argument("--columnar-queue", type=int, default=262_144, help="executor queue size (rows), columnar")
    parser.add_argument("--vocabulary", type=int, default=0, help="distinct words (0: the bundled corpus)")
    parser.add_argument("--keys", type=int, default=100_000, help="keys of the warm state of (b)")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs of (c)")
    parser.add_argument("--rate", type=int, default=2000, help="rows per second of (c)'s rate source")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per hop run of (d)")
    parser.add_argument("--max-tuples", type=int, default=200_000, help="tuples of (d)'s throughput runs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    parser.add_argument("--ttl-keys", type=int, default=10_000_000, help="distinct keys streamed through (e)")
    parser.add_argument("--ttl-epoch", type=int, default=100_000, help="operations (new keys) per epoch of (e)")
    parser.add_argument("--ttl-epochs", type=int, default=5, help="the TTL of (e)'s stream, in epochs")
    parser.add_argument("--savepoint-keys", type=int, default=1_000_000, help="keys of (f)'s savepoint")
    args = parser.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    report: list[str] = []
    started = uptime_load()
    for part in parts:
        if part == "overhead":
            report += overhead(args, overrides)
        elif part == "getput":
            report += getput(args)
        elif part == "recovery":
            report += recovery(args)
        elif part == "hop":
            report += hops(args, overrides)
        elif part == "ttl":
            report += ttl(args)
        elif part == "savepoint":  # bench/savepoint.py: a savepoint's write, restore and rescale
            from bench import savepoint

            savepoint.main(["--keys", str(args.savepoint_keys), "--rounds", str(args.rounds)])
        else:
            parser.error(f"unknown part {part!r}: choose from overhead, getput, recovery, hop, ttl, savepoint")
        report.append("")
    print(f"\nbench.state, load average {started} at the start, {uptime_load()} at the end")
    if overrides:
        print("worker settings: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
