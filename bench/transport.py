"""Transport throughput between two processes, as a ratio to a raw-socket baseline.

Each side sends N 100-byte TaskMessages from this process to a receiver process and
times from the first send until the receiver reports it holds all N (decoded):

* baseline: the same frame bytes over a plain TCP socket in length-prefixed 64 KiB
  writes, decoded by the receiver into (task, bytes) tuples with the fastest plain
  Python loop we know (struct.unpack_from over the block);
* tcp, zmq, zmq-ipc: ``IClient.send`` in batches into a server whose callback
  counts the batches it is handed (our decoder makes the TaskMessages).

With ``--kafka`` a broker is started (scripts/fetch-jars' jars) and two more sides run:

* kafka-raw: the same frame blocks (one record per batch) produced with kafka-python
  (``acks=all``) and consumed by a plain KafkaConsumer that decodes them with the
  baseline's loop -- what Kafka itself costs from Python, the kafka transport's baseline;
* kafka: the kafka transport (records, receipts, offset commits, announcements).

With ``--tls`` a side ``tcp-tls`` runs the tcp transport over mutual TLS 1.3 (a CA and
certificates made for the run, as the tests make them); its ratio to plain tcp is printed.

Sides run interleaved for several rounds; the best round of each is reported, since
the machines are noisy and the best round is the least disturbed one.

    python -m bench.transport [--messages 1000000] [--batch 1000] [--rounds 3] [--kafka] [--tls]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from spark_storm.messaging import MessageBatch, TaskMessage
from spark_storm.messaging.wire import encode_messages
from spark_storm.transport import make_context

PAYLOAD = 100
SIDES: dict[str, dict[str, Any]] = {
    "tcp": {"storm.messaging.transport": "tcp"},
    "zmq": {"storm.messaging.transport": "zmq"},
    "zmq-ipc": {"storm.messaging.transport": "zmq", "storm.local.mode.zmq": True},
}


def _recv_exact(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            msg = "sender hung up"
            raise ConnectionError(msg)
        got += k


def baseline_receiver(port_out: Connection, done: Connection, n: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_out.send(listener.getsockname()[1])
    sock, _ = listener.accept()
    header = struct.Struct(">hi")
    unpack = header.unpack_from
    lbuf = bytearray(4)
    block = bytearray(1 << 17)
    lview, bview = memoryview(lbuf), memoryview(block)
    count = 0
    while count < n:
        _recv_exact(sock, lview, 4)
        (length,) = struct.unpack(">I", lbuf)
        _recv_exact(sock, bview, length)
        data = bytes(bview[:length])
        out: list[tuple[int, bytes]] = []
        append = out.append
        pos = 0
        while pos < length:
            task, plen = unpack(data, pos)
            start = pos + 6
            pos = start + plen
            append((task, data[start:pos]))
        count += len(out)
    done.send(count)
    sock.close()
    listener.close()


def transport_receiver(conf: dict[str, Any], port_out: Connection, done: Connection, n: int) -> None:
    ctx = make_context(conf)
    count = 0

    def on_batch(batch: MessageBatch) -> None:
        nonlocal count
        count += len(batch)
        if count >= n:
            done.send(count)

    server = ctx.bind("bench", 0, on_batch)
    port_out.send(server.port)
    done.recv()  # parent says stop
    ctx.term()


def _decode_count(data: bytes) -> int:
    unpack = struct.Struct(">hi").unpack_from
    out: list[tuple[int, bytes]] = []
    pos, length = 0, len(data)
    while pos < length:
        task, plen = unpack(data, pos)
        start = pos + 6
        pos = start + plen
        out.append((task, data[start:pos]))
    return len(out)


def kafka_raw_receiver(bootstrap: str, topic: str, ready: Connection, done: Connection, n: int) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=1 << 24)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    consumer.position(tp)
    ready.send(True)
    count = 0
    while count < n:
        for records in consumer.poll(timeout_ms=100).values():
            for record in records:
                count += _decode_count(record.value)
    done.send(count)
    consumer.close()


def run_kafka_raw(bootstrap: str, n: int, batch: int) -> float:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"bench-raw-{time.monotonic_ns()}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    spawn = mp.get_context("spawn")
    ready_r, ready_w = spawn.Pipe(duplex=False)
    done_r, done_w = spawn.Pipe(duplex=False)
    proc = spawn.Process(target=kafka_raw_receiver, args=(bootstrap, topic, ready_w, done_w, n))
    proc.start()
    ready_r.recv()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=1, batch_size=256 * 1024, max_request_size=1 << 24
    )
    block = encode_messages([TaskMessage(i % 1000, b"p" * PAYLOAD) for i in range(batch)])
    t0 = time.perf_counter()
    for _ in range(n // batch):
        producer.send(topic, block)
    producer.flush()
    done_r.recv()
    elapsed = time.perf_counter() - t0
    producer.close()
    proc.join(20)
    return elapsed


def run_baseline(n: int, batch: int) -> float:
    port_r, port_w = mp.Pipe(duplex=False)
    done_r, done_w = mp.Pipe(duplex=False)
    proc = mp.get_context("spawn").Process(target=baseline_receiver, args=(port_w, done_w, n))
    proc.start()
    port = port_r.recv()
    frames = encode_messages([TaskMessage(i % 1000, b"p" * PAYLOAD) for i in range(batch)])
    frame = 6 + PAYLOAD
    per_block = (65536 // frame) * frame
    blocks = []
    for off in range(0, len(frames), per_block):
        chunk = frames[off : off + per_block]
        blocks.append(struct.pack(">I", len(chunk)) + chunk)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    for _ in range(n // batch):
        for b in blocks:
            sock.sendall(b)
    done_r.recv()
    elapsed = time.perf_counter() - t0
    sock.close()
    proc.join(10)
    return elapsed


def run_transport(conf: dict[str, Any], n: int, batch: int) -> float:
    spawn = mp.get_context("spawn")
    port_r, port_w = spawn.Pipe(duplex=False)
    done_r, done_w = spawn.Pipe()
    proc = spawn.Process(target=transport_receiver, args=(conf, port_w, done_w, n))
    proc.start()
    port = port_r.recv()
    ctx = make_context(conf)
    client = ctx.connect("bench", "127.0.0.1", port)
    if not client.wait_ready(30):
        msg = f"{conf}: client never became ready: {client.metrics()}"
        raise RuntimeError(msg)
    msgs = [TaskMessage(i % 1000, b"p" * PAYLOAD) for i in range(batch)]
    t0 = time.perf_counter()
    for _ in range(n // batch):
        client.send(msgs)
    done_r.recv()
    elapsed = time.perf_counter() - t0
    done_r.send("stop")
    ctx.term()
    proc.join(20)
    if proc.is_alive():
        proc.kill()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--kafka", action="store_true", help="also kafka-raw and the kafka transport (starts a broker)")
    parser.add_argument("--tls", action="store_true", help="also tcp over mutual TLS (needs the dev extra)")
    args = parser.parse_args(argv)
    n = args.messages - args.messages % args.batch
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.tls:
        import tempfile
        from pathlib import Path

        from tests.support.tls import make_pki, tls_conf

        SIDES["tcp-tls"] = tls_conf(make_pki(Path(tempfile.mkdtemp(prefix="bench-pki-"))))
        sides.append("tcp-tls")
    broker = None
    if args.kafka:
        import tempfile

        from spark_storm.tools.kafka_broker import KafkaBroker

        broker = KafkaBroker(tempfile.mkdtemp(prefix="bench-kafka-"))
        bootstrap = broker.start()
        SIDES["kafka"] = {"storm.messaging.transport": "kafka", "storm.messaging.kafka.bootstrap.servers": bootstrap}
        sides += ["kafka-raw", "kafka"]
    best: dict[str, float] = {}
    try:
        for r in range(args.rounds):
            for name in ["baseline", *sides]:
                if name == "baseline":
                    secs = run_baseline(n, args.batch)
                elif name == "kafka-raw":
                    secs = run_kafka_raw(bootstrap, n, args.batch)
                else:
                    secs = run_transport(SIDES[name], n, args.batch)
                best[name] = min(best.get(name, float("inf")), secs)
                print(f"round {r + 1}: {name:9s} {n / secs:12,.0f} msg/s", file=sys.stderr, flush=True)
    finally:
        if broker is not None:
            broker.stop()
    base = n / best["baseline"]
    print(f"\n{n:,} messages of {PAYLOAD} bytes, batches of {args.batch}, best of {args.rounds} rounds")
    print(f"{'side':10s} {'msg/s':>12s} {'MB/s':>8s} {'vs baseline':>12s}")
    for name in ["baseline", *sides]:
        rate = n / best[name]
        mbs = rate * PAYLOAD / 1e6
        print(f"{name:10s} {rate:12,.0f} {mbs:8.1f} {rate / base:11.0%}")
    if "kafka" in best:
        print(f"kafka transport vs kafka-raw: {best['kafka-raw'] / best['kafka']:.0%}")
    if "tcp-tls" in best and "tcp" in best:
        print(f"tcp over TLS vs plain tcp: {best['tcp'] / best['tcp-tls']:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
