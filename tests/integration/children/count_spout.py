"""A multilang spout child for the tests (raw JSON protocol): emits (k<i % 5>, i) with id i on each next.

``--hang-after N``: the (N+1)th ``next`` never syncs (a hung child).  Acks and fails are
counted and reported back with ``log`` commands.
"""

import json
import os
import sys
import time
from typing import Any

HANG_AFTER = int(sys.argv[sys.argv.index("--hang-after") + 1]) if "--hang-after" in sys.argv else -1


def read() -> Any:
    lines: list[bytes] = []
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            sys.exit(0)
        if line == b"end\n":
            return json.loads(b"".join(lines))
        lines.append(line)


def send(msg: Any) -> None:
    sys.stdout.buffer.write(json.dumps(msg).encode() + b"\nend\n")
    sys.stdout.buffer.flush()


setup = read()
open(os.path.join(setup["pidDir"], str(os.getpid())), "w").close()
send({"pid": os.getpid()})
emitted = acked = 0
while True:
    msg = read()
    if isinstance(msg, list):
        continue
    if msg["command"] == "next":
        if emitted == HANG_AFTER:
            time.sleep(3600)
        send({"command": "emit", "id": emitted, "tuple": [f"k{emitted % 5}", emitted]})
        emitted += 1
    elif msg["command"] == "ack":
        acked += 1
        if acked % 10 == 0:
            send({"command": "log", "msg": f"acked {acked}"})
    send({"command": "sync"})
