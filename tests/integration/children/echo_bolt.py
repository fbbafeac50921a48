"""A multilang bolt child for the tests, written against the raw protocol (JSON or msgpack).

Each tuple (key, n) is emitted anchored as (key, n) and acked.  Keys that misbehave on
purpose: ``hang`` (stops answering, heartbeats too), ``garbage`` (writes a line that is not
a message), ``exit`` (says why on stderr, exits 3), ``fail`` (fails the tuple), ``error``
(reports an error, then acks).  ``--serializer msgpack`` speaks pystorm's msgpack;
``--delay-ms N`` takes N ms over each tuple (a slow child).
Ticks are acked; heartbeats answered with sync.
"""

import json
import os
import sys
import time
from typing import Any

MSGPACK = "--serializer" in sys.argv and sys.argv[sys.argv.index("--serializer") + 1] == "msgpack"
DELAY_S = float(sys.argv[sys.argv.index("--delay-ms") + 1]) / 1000 if "--delay-ms" in sys.argv else 0.0
out = sys.stdout.buffer
inp = sys.stdin.buffer

if MSGPACK:
    import msgpack

    unpacker = msgpack.Unpacker(raw=False)

    def read() -> Any:
        while True:
            for msg in unpacker:
                return msg
            data = os.read(inp.fileno(), 65536)
            if not data:
                sys.exit(0)
            unpacker.feed(data)

    def send(msg: Any) -> None:
        out.write(msgpack.packb(msg, use_bin_type=True))
        out.flush()

else:

    def read() -> Any:
        lines: list[bytes] = []
        while True:
            line = inp.readline()
            if not line:
                sys.exit(0)
            if line == b"end\n":
                return json.loads(b"".join(lines))
            lines.append(line)

    def send(msg: Any) -> None:
        out.write(json.dumps(msg).encode() + b"\nend\n")
        out.flush()


setup = read()
open(os.path.join(setup["pidDir"], str(os.getpid())), "w").close()
send({"pid": os.getpid()})
send({"command": "log", "msg": "echo bolt ready, component " + setup["context"]["componentid"], "level": 2})
while True:
    msg = read()
    if isinstance(msg, list):
        continue  # task ids of an emit
    if msg["stream"] == "__heartbeat":
        send({"command": "sync"})
        continue
    if msg["stream"] == "__tick":
        send({"command": "ack", "id": msg["id"]})
        continue
    key = msg["tuple"][0]
    if key == "hang":
        time.sleep(3600)
    if key == "garbage":
        out.write(b"this is not a multilang message\nend\n")
        out.flush()
        continue
    if key == "exit":
        sys.stderr.write("dying on purpose\n")
        sys.stderr.flush()
        sys.exit(3)
    if key == "fail":
        send({"command": "fail", "id": msg["id"]})
        continue
    if key == "error":
        send({"command": "error", "msg": "an error on purpose"})
    if DELAY_S:
        time.sleep(DELAY_S)
    send({"command": "emit", "anchors": [msg["id"]], "tuple": msg["tuple"], "need_task_ids": False})
    send({"command": "ack", "id": msg["id"]})
