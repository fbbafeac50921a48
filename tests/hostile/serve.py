"""A real transport server in its own process, for attacks whose effect is read from outside.

``python -m tests.hostile.serve '<json>'`` with ``{"conf": {...}, "nofile": 64}`` binds topology
``h`` on port 0 with the public API, prints ``PORT <n>`` and then answers each line on stdin
with one JSON line: the server's metrics plus how many delivered payloads started with
``good`` and ``evil``.  The test reads the process's RSS and CPU from /proc itself.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import threading
from typing import Any

from spark_storm.messaging import MessageBatch
from spark_storm.transport import make_context


class Tally:
    """The receive callback: counts good and evil payloads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.good = 0
        self.evil = 0
        self.other = 0

    def __call__(self, batch: MessageBatch) -> None:
        with self.lock:
            for _, payload in batch:
                if payload.startswith(b"good"):
                    self.good += 1
                elif payload.startswith(b"evil"):
                    self.evil += 1
                else:
                    self.other += 1


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    if spec.get("nofile"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(spec["nofile"]), int(spec["nofile"])))
    tally = Tally()
    ctx = make_context(spec["conf"])
    server = ctx.bind("h", 0, tally)
    sys.stdout.write(f"PORT {server.port}\n")
    sys.stdout.flush()
    for _line in sys.stdin:
        out = dict(server.metrics())
        with tally.lock:
            out.update(good=tally.good, evil=tally.evil, other=tally.other)
        sys.stdout.write(json.dumps(out, default=str) + "\n")
        sys.stdout.flush()
    ctx.term()


if __name__ == "__main__":
    main()
