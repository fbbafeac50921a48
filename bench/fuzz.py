"""Fuzz the wire decoder and the session protocol with mutated frame streams.

``python -m bench.fuzz`` runs 1,000,000 inputs (``--inputs``) and prints how many ended in
each outcome class.  Inputs are valid client and server streams (handshake, sequenced
data, delivery groups, commits, load, backpressure, ...) mutated by a seeded generator:
bit flips, random bytes, inserted/deleted/duplicated ranges, truncation, splices of two
streams, and frame lengths and codes set to boundary values.  Each input goes, cut at
random points, through a :class:`ServerPeer` of a real (local transport) server, a
:class:`ClientProtocol`, or a bare :class:`FrameDecoder`.

The only acceptable outcomes are "accepted" and the typed errors a connection is closed
with (``WireFormatError``, ``AuthenticationError``, ``ConnectionBrokenError``); anything
else is a crash, printed with its input, and makes the exit status 1.  A server-side peer
must also never hold more than its limits allow.  The CI tier runs 100,000 inputs
(tests/hostile/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import itertools
import random
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable

from spark_storm.errors import AuthenticationError, ConnectionBrokenError, WireFormatError
from spark_storm.messaging import BackpressureStatus, IContext, TaskMessage
from spark_storm.messaging.handshake import new_session_id
from spark_storm.messaging.wire import (
    HANDSHAKE_MAX_BYTES,
    Auth,
    BatchAck,
    BatchCommit,
    BatchHeader,
    Challenge,
    Close,
    Eob,
    Failure,
    FrameDecoder,
    Hello,
    LoadMetrics,
    Ok,
    Receipt,
    Seq,
    encode_control,
    encode_messages,
)
from spark_storm.transport import make_context
from spark_storm.transport._base import ClientBase, ServerBase
from spark_storm.transport._session import (
    MAX_CONTROLS_PER_MESSAGE,
    ClientProtocol,
    ClientSession,
    PeerLimits,
    ServerPeer,
    SessionTable,
)

TOPOLOGY = "fuzz"
LIMITS = PeerLimits(max_frame_bytes=65536, group_max_frames=512, group_max_bytes=1 << 20)
CODES = (-1, -100, -200, -201, -400, -600, -700, -701, -702, -710, -711, -800, -801, -802, 0, 1, 32767, -999)
LENGTHS = (0, 1, 5, 6, 25, 65535, 65536, 65537, 2**31 - 1, -1, -(2**31))
TYPED = (WireFormatError, AuthenticationError, ConnectionBrokenError)


def _data(rng: random.Random, n: int) -> bytes:
    return encode_messages([TaskMessage(rng.randrange(32768), rng.randbytes(rng.randrange(40))) for _ in range(n)])


def client_streams(rng: random.Random) -> list[tuple[bytes, list[int]]]:
    """Valid client -> server streams, with the offsets of their frame headers."""
    hello = encode_control(Hello(1, TOPOLOGY, new_session_id(), rng.randbytes(16)))
    auth = encode_control(Auth(b""))
    parts: list[list[bytes]] = [
        [hello],
        [hello, auth],
        [hello, auth, encode_control(Seq(0, 3)), _data(rng, 3)],
        [hello, auth, encode_control(Seq(0, 2)), _data(rng, 2), encode_control(Seq(2, 4)), _data(rng, 4)],
        [
            hello,
            auth,
            encode_control(BatchHeader("q-1", 7, 0, 0, 3, 1)),
            encode_control(Seq(0, 3)),
            _data(rng, 3),
            encode_control(BatchCommit("q-1", 7)),
        ],
        [hello, auth, encode_control(BatchHeader("q", 1, 2, 3, 0, 2)), encode_control(Eob())],
        [hello, auth, encode_control(LoadMetrics({1: 0.5, 2: 1.0})), encode_control(Close())],
        [hello, auth, encode_control(Seq(5, 1)), _data(rng, 1), encode_control(Seq(0, 1)), _data(rng, 1)],
    ]
    out = []
    for frames in parts:
        offsets, pos = [], 0
        for frame in frames:
            # data blocks hold several frames; every one of them starts a header
            inner = 0
            while inner < len(frame):
                offsets.append(pos + inner)
                inner += 6 + struct.unpack_from(">i", frame, inner + 2)[0]
            pos += len(frame)
        out.append((b"".join(frames), offsets))
    return out


def server_streams(rng: random.Random) -> list[tuple[bytes, list[int]]]:
    """Valid server -> client streams."""
    frames = [
        encode_control(Challenge(1, False, rng.randbytes(16))),
        encode_control(Ok(b"", -1)),
        encode_control(Receipt(3)),
        encode_control(BatchAck("q-1", 7, 0, 0, 1)),
        encode_control(LoadMetrics({3: 0.25})),
        encode_control(BackpressureStatus("w", frozenset({1, 2}), frozenset({3}))),
        encode_control(Eob()),
        encode_control(Failure("no")),
    ]
    out = []
    for cut in range(2, len(frames) + 1):
        chosen = frames[:cut]
        offsets, pos = [], 0
        for f in chosen:
            offsets.append(pos)
            pos += len(f)
        out.append((b"".join(chosen), offsets))
    return out


def mutate(rng: random.Random, data: bytes, offsets: list[int], other: bytes) -> bytes:
    """Apply one to three random mutations."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(9)
        n = len(buf)
        if op == 0 and n:  # flip a bit
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # random bytes
            i = rng.randrange(n)
            buf[i : i + 4] = rng.randbytes(min(4, n - i))
        elif op == 2:  # insert
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.randrange(1, 16))
        elif op == 3 and n:  # delete a range
            i = rng.randrange(n)
            del buf[i : i + rng.randrange(1, 16)]
        elif op == 4 and n:  # duplicate a range
            i = rng.randrange(n)
            buf[i:i] = buf[i : i + rng.randrange(1, 32)]
        elif op == 5 and n:  # truncate
            del buf[rng.randrange(n) :]
        elif op == 6:  # splice with another stream
            cut = rng.randrange(len(buf) + 1)
            buf = buf[:cut] + other[rng.randrange(len(other) + 1) :]
        elif op == 7 and offsets:  # a boundary length in a frame header
            at = rng.choice(offsets)
            if at + 6 <= len(buf):
                struct.pack_into(">i", buf, at + 2, rng.choice(LENGTHS))
        elif op == 8 and offsets:  # another code in a frame header
            at = rng.choice(offsets)
            if at + 2 <= len(buf):
                struct.pack_into(">h", buf, at, rng.choice(CODES))
    return bytes(buf)


def _cuts(rng: random.Random, data: bytes) -> list[bytes]:
    if not data or rng.random() < 0.5:
        return [data]
    points = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(1, 3)))
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


class Harness:
    """A real local-transport server and client the fuzzed protocol objects report to."""

    def __init__(self) -> None:
        self.ctx: IContext = make_context(
            {"storm.messaging.transport": "local", "storm.messaging.server.ledger.max.size": 1000}
        )
        server = self.ctx.bind(TOPOLOGY, 0, lambda batch: None)
        client = self.ctx.connect(TOPOLOGY, "127.0.0.1", server.port)
        assert isinstance(server, ServerBase)
        assert isinstance(client, ClientBase)
        self.server = server
        self.client = client
        self.sessions = SessionTable(64)

    def server_peer(self, rng: random.Random, data: bytes) -> None:
        message = rng.random() < 0.5  # zmq/kafka style: one message, controls bounded, whole frames
        peer = ServerPeer(
            self.server,
            self.sessions,
            None,
            "fuzz",
            LIMITS,
            lambda frame: None,
            message_controls=MAX_CONTROLS_PER_MESSAGE if message else None,
        )
        try:
            for piece in [data] if message else _cuts(rng, data):
                peer.on_bytes(piece)
                if not peer.ready and peer._pre_auth_bytes > HANDSHAKE_MAX_BYTES:  # pragma: no cover
                    msg = "pre-auth bytes accepted over the handshake limit"
                    raise AssertionError(msg)
                bound = LIMITS.max_frame_bytes + 6 + LIMITS.group_max_bytes + 65536
                if peer.buffered_bytes > bound:  # pragma: no cover - a bound broke
                    msg = f"peer holds {peer.buffered_bytes} bytes, over {bound}"
                    raise AssertionError(msg)
            peer.check_eof()
        finally:
            peer.release()

    def client_protocol(self, rng: random.Random, data: bytes) -> None:
        session = ClientSession(1 << 20, 1 << 19, "drop", -1, "fuzz")
        proto = ClientProtocol(self.client, session, None, "fuzz", LIMITS.max_frame_bytes)
        for piece in _cuts(rng, data):
            proto.on_bytes(piece)

    def decoder(self, rng: random.Random, data: bytes) -> None:
        decoder = FrameDecoder(LIMITS.max_frame_bytes)
        for piece in _cuts(rng, data):
            decoder.feed(piece, MAX_CONTROLS_PER_MESSAGE if rng.random() < 0.3 else None)
        decoder.check_eof()

    def close(self) -> None:
        self.ctx.term()


def fuzz(inputs: int, seed: int = 1, report: Callable[[int], None] | None = None) -> Counter[str]:
    """Run ``inputs`` mutated inputs; return the count of each outcome class."""
    rng = random.Random(seed)
    harness = Harness()
    outcomes: Counter[str] = Counter()
    try:
        client = client_streams(rng)
        server = server_streams(rng)
        for i in range(inputs):
            kind = rng.random()
            if kind < 0.6:
                target, pool, name = harness.server_peer, client, "server"
            elif kind < 0.85:
                target, pool, name = harness.client_protocol, server, "client"
            else:
                target, pool, name = harness.decoder, client + server, "decoder"
            data, offsets = rng.choice(pool)
            if rng.random() < 0.95:
                data = mutate(rng, data, offsets, rng.choice(pool)[0])
            try:
                target(rng, data)
                outcomes[f"{name}: accepted"] += 1
            except TYPED as exc:
                outcomes[f"{name}: {type(exc).__name__}"] += 1
            except Exception as exc:
                outcomes[f"{name}: CRASH {type(exc).__name__}"] += 1
                sys.stderr.write(f"crash on input {i} ({name}): {exc!r}\n  {data.hex()}\n")
            if report is not None and (i + 1) % 100_000 == 0:
                report(i + 1)
    finally:
        harness.close()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.monotonic()

    def progress(done: int) -> None:
        print(f"  {done:,} inputs, {time.monotonic() - started:.0f}s", flush=True)

    outcomes = fuzz(args.inputs, args.seed, progress)
    total = sum(outcomes.values())
    print(f"{total:,} inputs in {time.monotonic() - started:.1f}s (seed {args.seed})")
    for name, count in sorted(outcomes.items()):
        print(f"  {name:<40} {count:>10,}")
    crashes = sum(c for k, c in outcomes.items() if "CRASH" in k)
    print(f"crashes: {crashes}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
