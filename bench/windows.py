"""What windows cost (issue 18's targets), as ratios and figures measured in one run.

Every side is one worker process on loopback fed by this process, a plain client sending
TaskMessages the way bench/worker.py does.  Events are ``[ts, user, v]``: ``ts`` epoch
milliseconds (event time), ``user`` one of ``--keys`` keys, ``v`` padding to ~100 bytes a
tuple or row.  Event time advances evenly over the stream (--tuples-per-second and
--rows-per-second of event time in the throughput parts), each event jittered by up to 1 s,
within the windows' 5 s lag: no event is late (checked: the window metrics of /health must
count none late and some windows fired).  Windowed bolts are stateful: ``embedded`` state
(the default provider, a temporary folder per run) checkpointed by the worker's own interval
coordinator every ``topology.state.checkpoint.interval.ms`` (1000, the default for plain
clients); a stateful topology also logs what its source tasks accept (docs/design/state.md).

(a) tuple windows (msgpack tuples, one per message, sent in sends of 1000), best of --rounds,
    sides interleaved per round:

    * no-op, 1 stage: the source task's bolt is the no-op tuple bolt (bench/worker.py's
      "1 worker" side): the plain tuple path, the baseline of the ratios;
    * window count, source: the source task's bolt is ``WindowCount`` with ``window: {length:
      60s, sliding: 10s, timestamp_field: ts, lag: 5s, key: user}`` (a sliding count per key,
      aggregated incrementally: one integer per pane and key) and the source keyed by the
      client (``grouping: fields, grouping_fields: [user]``: Spark's writer sends a key to one
      source task) -- the window engine on the plain path;
    * window tuples, source: the same with ``WindowCountTuples`` (keeps the tuples, Storm's way);
    * no-op, fields: in (pass-through) -> fields(user) -> no-op, in one worker;
    * window count, fields: in -> fields(user) -> ``WindowCount``: the usual Storm shape.

    A source's ``fields`` are its input and its default stream, so a windowed bolt at a
    source emits its windows on another stream: the ``Source*`` classes below are the example
    bolts with that one change (windows on ``windows``).  Nothing subscribes to the windows
    in any side (their emits are dropped at the collector).

(b) columnar windows (Arrow payloads of --rows-per-message rows, 16 per send), the shapes
    of (a) less Storm's way: the no-op batch bolt at the source (bench/worker.py's "1 worker,
    batch": the baseline), ``WindowCountBatch`` at the source (``count.by: user``, sealed
    panes combined into partial counts, ``window: {length: 60s, sliding: 10s, timestamp_field:
    ts, lag: 5s}``: a batch window holds every key of its task and the bolt groups), and both
    behind a pass-through source with fields(user) grouping.

Throughput is tuples (rows) sent / time from the first send until the last component
executed them all (the workers' /health); every message is built before the clock starts.
Event time runs far faster than wall time (5,000 tuples or 50,000 rows per event second,
by default, against a few hundred thousand or millions per wall second), so windows fire many
times more often per event than in a real stream: the figures are conservative.  Every side
sends millions of events (--tuples, --rows): a side lasts several seconds, through several
checkpoints (a round of checkpoints stalls a windowed task for a moment; a side of one or
two seconds gives a burst figure, not a sustained one).

(c) memory: a 10-minute window sliding every 10 s (``window: {length: 10m, sliding: 10s,
    timestamp_field: ts, lag: 5s, key: user}`` for ``WindowCount``, the same without ``key``
    for ``WindowCountBatch``; both at the source, as in (a) and (b)) over a steady stream of
    --memory-minutes of event time, made as it is sent, at most --in-flight events unexecuted
    (x10 for rows).  The worker's VmRSS (/proc/PID/status) is sampled every --sample seconds
    with the window task's watermark; printed: RSS at event minutes 5, 10 (the first window
    filled), 20, 30, ... and the least-squares slope of RSS over the samples after the first
    window filled, in MiB per million events and MiB per event minute (flat: under 5 % of the
    RSS at the fill per window length), and the mean RSS of the first and second half of
    those samples (RSS swings with the allocators: Arrow's pool).  Bounded in events
    (--memory-tuples, --memory-rows) and by --memory-timeout wall seconds a side.

    python -m bench.windows [--parts tuple,columnar,memory] [--rounds 3] [--tuples 2400000]
                            [--rows 24000000] [--keys 1000] [--sides 'SIDE;SIDE'] [--memory-minutes 120]
                            [--memory-tuples 12000000] [--memory-rows 90000000] [--profile DIR]
                            [--set KEY=VALUE]
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import yaml

from bench.scale import profile_summary
from bench.worker import executed
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.payloads import arrow_payload
from spark_storm.examples.windows import WindowCount, WindowCountBatch, WindowCountTuples
from spark_storm.messaging import TaskMessage
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.transport import make_context
from spark_storm.worker.bolt import BatchOutputCollector, TopologyContext
from spark_storm.worker.windows import TupleWindow

EX = "spark_storm.examples"
NOOP = f"{EX}.noop:NoopBolt"
NOOP_BATCH = f"{EX}.noop:NoopBatchBolt"
PASS_BATCH = "spark_storm.worker.bolt:PassThroughBatchBolt"
FIELDS = ["ts", "user", "v"]
OUT = ["start", "end", "key", "count", "id"]
#: Event time of the first event: a multiple of 10 minutes, so windows align with the stream's start.
T0 = 1_780_000_200_000
JITTER_MS = 1000  # events are out of order by up to this much (the lag, 5 s, covers it)
PAD = 82  # [ts, user, pad] packs to ~100 bytes
SLIDING = {"length": "60s", "sliding": "10s", "timestamp_field": "ts", "lag": "5s"}
TEN_MINUTES = {"length": "10m", "sliding": "10s", "timestamp_field": "ts", "lag": "5s"}


def load() -> str:
    """The 1-minute load average (printed beside the figures: the machine may have other work)."""
    return f"{os.getloadavg()[0]:.1f}"


# --- events ------------------------------------------------------------------------------------------


class Events:
    """Event ``i`` of a stream of ``total`` spread evenly over ``span_ms`` of event time."""

    def __init__(self, total: int, span_ms: int, keys: int) -> None:
        self.total = total
        self.span_ms = span_ms
        self.keys = keys
        self.users = [f"u{k:04d}" for k in range(keys)]
        self.user_array = pa.array(self.users)
        self.pad = "x" * PAD

    def ts(self, i: int) -> int:
        return T0 + i * self.span_ms // self.total + (i * 7919) % JITTER_MS

    def user(self, i: int) -> int:
        return (i * 48271) % self.keys

    def tuples(self, start: int, n: int) -> list[bytes]:
        """Events ``start .. start + n`` as msgpack tuples (one per message)."""
        users, pad, pack = self.users, self.pad, msgpack.packb
        return [pack([self.ts(i), users[self.user(i)], pad]) for i in range(start, start + n)]

    def batch(self, start: int, n: int, pad: pa.Array) -> bytes:
        """Events ``start .. start + n`` as one Arrow IPC payload (columns ts, user, v)."""
        idx = np.arange(start, start + n, dtype=np.int64)
        ts = T0 + idx * self.span_ms // self.total + (idx * 7919) % JITTER_MS
        users = self.user_array.take(pa.array((idx * 48271) % self.keys))
        return arrow_payload(pa.record_batch({"ts": pa.array(ts), "user": users, "v": pad}))

    def pad_column(self, n: int) -> pa.Array:
        return pa.array([self.pad] * n)


# --- topologies ----------------------------------------------------------------------------------------


class _Restream(BatchOutputCollector):
    """A batch collector whose default-stream emits go to ``stream``."""

    def __init__(self, inner: BatchOutputCollector, stream: str) -> None:
        self.inner = inner
        self.stream = stream

    def emit_batch(self, data: Any, stream: str = DEFAULT_STREAM, anchors: Any = None, tasks: Any = None) -> None:
        self.inner.emit_batch(data, self.stream if stream == DEFAULT_STREAM else stream, anchors, tasks)

    def ack(self, batch: ColumnarBatch) -> None:
        self.inner.ack(batch)

    def fail(self, batch: ColumnarBatch) -> None:
        self.inner.fail(batch)


class SourceWindowCount(WindowCount):
    """``WindowCount`` as a source's bolt: a source's fields are its input, so windows go out on ``windows``."""

    def execute_window(self, window: TupleWindow) -> None:
        self.collector.emit([window.start, window.end, window.key, window.value, window.id], "windows")


class SourceWindowCountTuples(WindowCountTuples):
    """``WindowCountTuples`` as a source's bolt (windows on ``windows``)."""

    def execute_window(self, window: TupleWindow) -> None:
        self.collector.emit([window.start, window.end, window.key, len(window.tuples), window.id], "windows")


class SourceWindowCountBatch(WindowCountBatch):
    """``WindowCountBatch`` as a source's bolt (windows on ``windows``)."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.collector = _Restream(self.collector, "windows")


#: side -> (bolt, shape): "1 stage" (the source task's bolt, keyed by the client) or "fields" (in -> fields(user) -> it)
SIDES: dict[str, tuple[str, str]] = {
    "no-op, 1 stage": (NOOP, "1 stage"),
    "window count, source": ("bench.windows:SourceWindowCount", "1 stage"),
    "window tuples, source": ("bench.windows:SourceWindowCountTuples", "1 stage"),
    "no-op, fields": (NOOP, "fields"),
    "window count, fields": (f"{EX}.windows:WindowCount", "fields"),
    "no-op batch, 1 stage": (NOOP_BATCH, "1 stage"),
    "window batch, source": ("bench.windows:SourceWindowCountBatch", "1 stage"),
    "no-op batch, fields": (NOOP_BATCH, "fields"),
    "window batch, fields": (f"{EX}.windows:WindowCountBatch", "fields"),
}


def topology(side: str, window: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The topology of a side (see the module doc), its state in ``tmp``."""
    bolt, shape = SIDES[side]
    batch = "batch" in side
    comp: dict[str, Any] = {"bolt": bolt}
    if side.startswith("window"):
        # a batch window holds every key of its task (the bolt groups); a tuple window is keyed
        comp["window"] = window if batch else {**window, "key": "user"}
        if batch:
            comp["conf"] = {"count.by": "user"}
    if shape == "1 stage":
        comp.update(id="in", source=True, fields=FIELDS, grouping="fields", grouping_fields=["user"])
        if side.startswith("window"):
            comp["outputs"] = {"windows": OUT}
        comps = [comp]
    else:
        comp.update(id="win", inputs=[{"from": "in", "grouping": "fields", "fields": ["user"]}])
        if side.startswith("window"):
            comp["fields"] = OUT
        source: dict[str, Any] = {"id": "in", "source": True, "fields": FIELDS}
        if batch:
            source["bolt"] = PASS_BATCH
        comps = [source, comp]
    return {
        "name": "bench-windows",
        "conf": {"topology.state.provider.config": {"dir": str(tmp / "state")}},
        "components": comps,
    }


def sink_of(side: str) -> str:
    return "in" if SIDES[side][1] == "1 stage" else "win"


# --- worker views --------------------------------------------------------------------------------------


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc/PID/status."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def window_view(cluster: LocalCluster, component: str = "win") -> dict[str, Any]:
    """The window metrics of ``component`` over every worker: fired, late, held, lowest watermark."""
    out: dict[str, Any] = {"windows": 0, "late": 0, "bad_times": 0, "held": 0, "watermark_ms": None}
    marks = []
    for slot in cluster.slots:
        for ex in cluster.health(slot)["executors"].values():
            win = ex.get("windows")
            if ex["component"] != component or not win:
                continue
            for key in ("windows", "late", "bad_times", "held"):
                out[key] += win[key]
            marks.append(win["watermark_ms"])
    if marks and None not in marks:
        out["watermark_ms"] = min(m for m in marks if m is not None)
    return out


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(out), "--rate", "100"]
    cmd += ["--gil", "--nonblocking"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the clock starts
    return proc


def _stop_spy(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        proc.wait(60)


#: Where a worker's time goes: the first rule (in this order) with a frame anywhere in a stack takes the sample.
WHERE: list[tuple[str, tuple[str, ...]]] = [
    ("checkpoint: window state put (KeyValueState.put packs the value to check it)", ("KeyValueState.put",)),
    ("checkpoint: window state saved, the rest (WindowEngine.save)", ("WindowEngine.save",)),
    ("checkpoint: changelog entry written (encode_entry, file)", ("FileTaskStore.write", "ExecutorCheckpoints._write")),
    ("checkpoint: the barrier, the rest", ("_on_barrier", "ExecutorCheckpoints._complete")),
    ("input log: accepted messages appended (stateful topology)", ("FileInputLog.append", "CheckpointManager.log")),
    (
        "window: firing (seal, combine, execute_window, evict)",
        ("Panes.fire ", "Panes.seal ", "execute_window", "Panes.evict "),
    ),
    (
        "window: events into panes (time, key, add)",
        ("RowEngine.", "ArrowEngine.", "WindowEngine.", "Panes.", "Counts.", "SessionWindows."),
    ),
    ("fields grouping: hash and split", ("routing.py",)),
    ("pass-through bolt and its emits", ("PassThrough", "TaskCollector.emit", "BatchTaskCollector.emit", "Emitter.")),
    (
        "receive: tcp, frames, decode, queue",
        ("TcpServer", "FrameDecoder", "SourceDecoder", "receive.py", "_session.py"),
    ),
    ("executor loop, acks, queues", ("executor.py", "queue.py", "collectors.py")),
]


def where_time_goes(path: Path) -> str:
    """The samples of a ``py-spy record --format raw`` file by :data:`WHERE` category, largest first."""
    counts: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        name = next((n for n, keys in WHERE if any(k in stack for k in keys)), "other (imports, timers, http)")
        counts[name] = counts.get(name, 0) + int(count)
    if not total:
        return "    (no samples: is py-spy allowed to attach here?)"
    lines = [f"    {total:,} samples of the GIL holder; by where they are:"]
    lines += [f"    {n / total:6.1%}  {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


# --- (a), (b): throughput ------------------------------------------------------------------------------


def run_side(
    side: str,
    payloads: list[bytes],
    per_send: int,
    total: int,
    overrides: dict[str, Any],
    profile: Path | None = None,
    timeout: float = 600.0,
) -> tuple[float, dict[str, Any]]:
    """Send ``payloads`` (``total`` events) to the source task; seconds until the sink executed them all."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-windows-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topology(side, SLIDING, tmp)))
    cluster = LocalCluster(str(path), 1, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    spy = None
    try:
        pid = next(iter(cluster.procs.values())).pid
        (task,) = cluster.plan.component_tasks["in"]
        slot = cluster.plan.task_slot[task]
        conn = ctx.connect(cluster.topology.name, slot.host, slot.port)
        conn.wait_ready(30)
        sends = [[TaskMessage(task, p) for p in payloads[i : i + per_send]] for i in range(0, len(payloads), per_send)]
        if profile is not None:
            spy = _spy(pid, profile)
        sink = sink_of(side)
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        for chunk in sends:
            conn.send(chunk)
        while (done := executed(cluster, sink)) < total:
            if time.monotonic() > deadline:
                msg = f"{side}: {done:,} of {total:,} executed after {timeout:.0f}s:\n{cluster.log_tail(slot)}"
                raise RuntimeError(msg)
            time.sleep(0.02)
        secs = time.perf_counter() - t0
        _stop_spy(spy)
        spy = None
        view = window_view(cluster, sink) if side.startswith("window") else {}
        view["rss_kib"], view["hwm_kib"] = rss_kib(pid)
        return secs, view
    finally:
        _stop_spy(spy)
        ctx.term()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def throughput(
    title: str,
    sides: list[str],
    payloads: list[bytes],
    per_send: int,
    total: int,
    unit: str,
    target: float,
    args: argparse.Namespace,
    overrides: dict[str, Any],
) -> list[str]:
    """Best of ``--rounds`` of each side, rounds interleaved; ``sides[0]`` is the baseline."""
    if args.sides:  # the chosen sides, with the baseline and the no-op of each shape chosen
        wanted = {w.strip() for w in args.sides.split(";") if w.strip()}
        shapes = {SIDES[s][1] for s in sides if s in wanted}
        keep = {sides[0], *(s for s in sides if s.startswith("no-op") and SIDES[s][1] in shapes)}
        sides = [s for s in sides if s in wanted or s in keep]
    best: dict[str, tuple[float, dict[str, Any], str]] = {}
    for r in range(args.rounds):
        last = r == args.rounds - 1
        for side in sides:
            profile = None
            if args.profile is not None and last and side.startswith("window"):
                profile = args.profile / f"{side.replace(' ', '-').replace(',', '')}.txt"
            ld = load()
            secs, view = run_side(side, payloads, per_send, total, overrides, profile)
            extra = f", {view['windows']:,} windows fired, {view['late']} late" if "windows" in view else ""
            print(
                f"round {r + 1}: {side:22s} {total / secs:12,.0f} {unit}/s{extra} (load {ld})",
                file=sys.stderr,
                flush=True,
            )
            if side not in best or secs < best[side][0]:
                best[side] = (secs, view, ld)
    base = total / best[sides[0]][0]
    out = [
        title,
        f"  {'side':22s} {unit + '/s per worker':>18s} {'vs ' + sides[0]:>24s} {'vs its no-op shape':>19s} "
        f"{'windows':>8s} {'late':>5s} {'RSS MiB':>8s} {'load':>5s}",
    ]
    noop_of = {SIDES[s][1]: s for s in sides if s.startswith("no-op")}
    for side in sides:
        secs, view, ld = best[side]
        rate = total / secs
        shape = total / best[noop_of[SIDES[side][1]]][0]
        fired = f"{view['windows']:8,d} {view['late']:5d}" if "windows" in view else f"{'-':>8s} {'-':>5s}"
        out.append(
            f"  {side:22s} {rate:18,.0f} {rate / base:24.1%} {rate / shape:19.1%} {fired} "
            f"{view['rss_kib'] / 1024:8.0f} {ld:>5s}"
        )
    for side in sides:
        if not side.startswith("window"):
            continue
        rate = total / best[side][0]
        view = best[side][1]
        ok = view["late"] == 0 and view["windows"] > 0
        verdict = "met" if rate >= target and ok else "NOT met"
        out.append(f"  {side}: {rate:,.0f} {unit}/s per worker (target >= {target:,.0f}: {verdict})")
        if not ok:
            out.append(f"    (not a valid run: {view['late']} late events, {view['windows']} windows fired)")
    if args.profile is not None:
        for side in sides:
            f = args.profile / f"{side.replace(' ', '-').replace(',', '')}.txt"
            if side.startswith("window") and f.exists():
                out.append(f"  py-spy --gil of the worker, {side} (last round):")
                out.append(where_time_goes(f))
                out.append(profile_summary([f], top=8))
    return out


def tuple_part(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    n = args.tuples
    span = max(1, n * 1000 // args.tuples_per_second)
    events = Events(n, span, args.keys)
    payloads = events.tuples(0, n)
    size = sum(map(len, payloads)) / n
    sides = ["no-op, 1 stage", "window count, source", "window tuples, source", "no-op, fields", "window count, fields"]
    title = (
        f"(a) tuple windows: 1 worker, {n:,} msgpack tuples of ~{size:.0f} bytes over {span / 1000:,.0f}s of event "
        f"time, {args.keys:,} keys; sliding 60s/10s count per key; best of {args.rounds}"
    )
    return throughput(title, sides, payloads, 1000, n, "tuples", 300_000, args, overrides)


def columnar_part(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    per = args.rows_per_message
    messages = max(1, args.rows // per)
    n = messages * per
    span = max(1, n * 1000 // args.rows_per_second)
    events = Events(n, span, args.keys)
    pad = events.pad_column(per)
    payloads = [events.batch(i * per, per, pad) for i in range(messages)]
    size = sum(map(len, payloads)) / n
    sides = ["no-op batch, 1 stage", "window batch, source", "no-op batch, fields", "window batch, fields"]
    title = (
        f"(b) columnar windows: 1 worker, {n:,} rows of ~{size:.0f} bytes in Arrow payloads of {per} rows over "
        f"{span / 1000:,.0f}s of event time, {args.keys:,} keys; sliding 60s/10s count per key; best of {args.rounds}"
    )
    return throughput(title, sides, payloads, 16, n, "rows", 3_000_000, args, overrides)


# --- (c) memory ----------------------------------------------------------------------------------------


def _stream_tuples(events: Events, chunk: int) -> Iterator[tuple[list[bytes], int]]:
    """The events as msgpack tuples, ``chunk`` per send, made as they are sent."""
    for start in range(0, events.total, chunk):
        n = min(chunk, events.total - start)
        yield events.tuples(start, n), n


def _stream_batches(events: Events, per: int, per_send: int) -> Iterator[tuple[list[bytes], int]]:
    """The events as Arrow payloads of ``per`` rows (``events.total`` is a multiple), ``per_send`` per send."""
    pad = events.pad_column(per)
    step = per * per_send
    for start in range(0, events.total, step):
        stop = min(start + step, events.total)
        yield [events.batch(s, per, pad) for s in range(start, stop, per)], stop - start


def run_memory(
    side: str,
    stream: Iterator[tuple[list[bytes], int]],
    in_flight: int,
    args: argparse.Namespace,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """Feed ``stream``, at most ``in_flight`` events unexecuted; RSS and window samples every ``--sample`` s."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-windows-mem-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topology(side, TEN_MINUTES, tmp)))
    cluster = LocalCluster(str(path), 1, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    sink = sink_of(side)
    try:
        pid = next(iter(cluster.procs.values())).pid
        (task,) = cluster.plan.component_tasks["in"]
        slot = cluster.plan.task_slot[task]
        conn = ctx.connect(cluster.topology.name, slot.host, slot.port)
        conn.wait_ready(30)
        samples: list[tuple[float, int, float, int, int]] = []  # wall s, events executed, event minute, RSS, held
        idle_rss = rss_kib(pid)[0]
        t0 = time.monotonic()
        deadline = t0 + args.memory_timeout
        last = 0.0
        sent = done = 0
        stopped = ""

        def sample() -> None:
            nonlocal done, last
            view = window_view(cluster, sink)
            done = executed(cluster, sink)
            last = time.monotonic()
            wm = view["watermark_ms"]
            if wm is not None:
                samples.append((last - t0, done, (wm - T0) / 60_000, rss_kib(pid)[0], view["held"]))

        for payloads, n in stream:
            conn.send([TaskMessage(task, p) for p in payloads])
            sent += n
            while sent - done > in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
                done = executed(cluster, sink)
            if time.monotonic() - last >= args.sample:
                sample()
            if time.monotonic() > deadline:
                stopped = f"stopped at the time bound ({args.memory_timeout:.0f}s wall) after {sent:,} events"
                break
        drain = time.monotonic() + 120
        while done < sent and time.monotonic() < drain:
            time.sleep(0.05)
            done = executed(cluster, sink)
        sample()
        view = window_view(cluster, sink)
        return {
            "samples": samples,
            "idle_kib": idle_rss,
            "hwm_kib": rss_kib(pid)[1],
            "sent": sent,
            "done": done,
            "wall": time.monotonic() - t0,
            "late": view["late"],
            "windows": view["windows"],
            "stopped": stopped,
        }
    finally:
        ctx.term()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _slope(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2 or max(xs) == min(xs):
        return float("nan")
    return float(np.polyfit(np.asarray(xs), np.asarray(ys), 1)[0])


def memory_part(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    span = args.memory_minutes * 60_000
    out = [
        f"(c) memory: 1 worker, a 10-minute window sliding every 10s, {args.memory_minutes} minutes of event time, "
        f"{args.keys:,} keys; worker VmRSS sampled every {args.sample}s (load {load()})"
    ]
    kinds = [k.strip() for k in args.memory_sides.split(",") if k.strip()]
    for kind in kinds:
        if kind == "tuple":
            side = "window count, source"
            stream = _stream_tuples(Events(args.memory_tuples, span, args.keys), 2000)
            res = run_memory(side, stream, args.in_flight, args, overrides)
        elif kind == "columnar":
            side = "window batch, source"
            per = args.rows_per_message
            rows = max(1, args.memory_rows // per) * per
            stream = _stream_batches(Events(rows, span, args.keys), per, 4)
            res = run_memory(side, stream, args.in_flight * 10, args, overrides)
        else:
            msg = f"unknown memory side {kind!r}: tuple or columnar"
            raise ValueError(msg)
        samples = res["samples"]
        minutes = [m for _, _, m, _, _ in samples]
        print(
            f"memory {side}: {res['done']:,} events in {res['wall']:.0f}s, event minute {max(minutes, default=0):.1f}, "
            f"{len(samples)} samples",
            file=sys.stderr,
            flush=True,
        )
        after = [s for s in samples if s[2] >= 10.0]
        per_million = _slope([s[1] / 1e6 for s in after], [s[3] / 1024 for s in after])
        per_minute = _slope([s[2] for s in after], [s[3] / 1024 for s in after])
        unit = "tuples" if kind == "tuple" else "rows"
        out.append(
            f"  {side} ({unit}): {res['done']:,} {unit} in {res['wall']:.0f}s wall "
            f"({res['done'] / max(res['wall'], 1e-9):,.0f}/s, paced), {res['windows']:,} windows fired, "
            f"{res['late']} late; idle worker {res['idle_kib'] / 1024:.0f} MiB, peak {res['hwm_kib'] / 1024:.0f} MiB"
        )
        if res["stopped"]:
            out.append(f"  {res['stopped']}")
        out.append(f"    {'event minute':>12s} {unit + ' done':>14s} {'RSS MiB':>8s} {'held':>9s}")
        seen: set[int] = set()
        top = int(max(minutes, default=0))
        for mark in [5, 10, *range(15 if top <= 40 else 20, top + 1, 5 if top <= 40 else 10)]:
            at = next((i for i, s in enumerate(samples) if s[2] >= mark), None)
            if at is not None and at not in seen:
                seen.add(at)
                _, done, minute, rss, held = samples[at]
                note = "  <- the first window filled" if mark == 10 else ""
                out.append(f"    {minute:12.1f} {done:14,d} {rss / 1024:8.1f} {held:9,d}{note}")
        if len(after) >= 2:
            rss_mib = [s[3] / 1024 for s in after]
            growth = per_minute * 10  # MiB per window length (10 event minutes) at the slope
            flat = abs(growth) < 0.05 * rss_mib[0]
            out.append(
                f"    after the first window filled ({len(after)} samples, event minutes {after[0][2]:.1f}-"
                f"{after[-1][2]:.1f}): RSS {min(rss_mib):.1f}-{max(rss_mib):.1f} MiB; slope {per_million:+.2f} MiB "
                f"per million {unit}, {per_minute:+.3f} MiB per event minute ({growth:+.1f} MiB per window length: "
                f"{'flat' if flat else 'NOT flat'}, i.e. {'under' if flat else 'over'} 5 % of the RSS at the fill)"
            )
            half = len(rss_mib) // 2
            first, second = np.mean(rss_mib[:half]), np.mean(rss_mib[half:])
            out.append(
                f"    mean RSS over the first / second half of those samples: {first:.1f} / {second:.1f} MiB "
                f"({second - first:+.1f} MiB)"
            )
        else:
            out.append("    no sample after the first window filled (raise --memory-minutes or --memory-timeout)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="tuple,columnar,memory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tuples", type=int, default=2_400_000, help="tuples of each side of (a)")
    parser.add_argument("--rows", type=int, default=24_000_000, help="about this many rows per side of (b)")
    parser.add_argument("--rows-per-message", type=int, default=4096)
    parser.add_argument("--keys", type=int, default=1000, help="distinct users")
    parser.add_argument("--sides", help="sides of (a) and (b) to run, ';'-separated (default: all)")
    parser.add_argument("--tuples-per-second", type=int, default=5000, help="tuples per event second in (a)")
    parser.add_argument("--rows-per-second", type=int, default=50_000, help="rows per event second in (b)")
    parser.add_argument("--memory-sides", default="tuple,columnar", help="which windowed bolts (c) measures")
    parser.add_argument("--memory-minutes", type=int, default=120, help="event minutes of (c)'s stream")
    parser.add_argument("--memory-tuples", type=int, default=12_000_000, help="tuples of (c), tuple side")
    parser.add_argument("--memory-rows", type=int, default=90_000_000, help="rows of (c), columnar side")
    parser.add_argument("--in-flight", type=int, default=100_000, help="tuples in flight at most in (c) (rows: x10)")
    parser.add_argument("--sample", type=float, default=0.25, help="seconds between RSS samples in (c)")
    parser.add_argument("--memory-timeout", type=float, default=600.0, help="wall seconds per side of (c), at most")
    parser.add_argument("--profile", type=Path, help="py-spy --gil the windowed sides' worker in the last round")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    args = parser.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    parts: dict[str, Callable[[argparse.Namespace, dict[str, Any]], list[str]]] = {
        "tuple": tuple_part,
        "columnar": columnar_part,
        "memory": memory_part,
    }
    report: list[str] = []
    started = load()
    for part in (p.strip() for p in args.parts.split(",") if p.strip()):
        if part not in parts:
            parser.error(f"unknown part {part!r}: choose from {', '.join(parts)}")
        report += parts[part](args, overrides)
        report.append("")
    print(f"\nbench.windows, load average {started} at the start, {load()} at the end; {os.cpu_count()} cores")
    print(
        "windowed bolts: embedded state, checkpoints every "
        f"{overrides.get('topology.state.checkpoint.interval.ms', 1000)} ms (the default)"
    )
    if overrides:
        print("worker settings: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
