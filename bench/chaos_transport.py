"""``storm.messaging.transport: bench.chaos_transport:Context``: tcp whose worker-to-worker links corrupt bytes.

The server side is the tcp transport's, unchanged; the clients a worker opens to its peers
are tcp clients that, while bench.chaos holds a ``corrupt`` window open
(:mod:`bench.chaos_plan`), disturb what they send, with the window's chance ``p`` per
message (per write of the connection for ``frame``):

* ``truncate``: a payload is cut short at a random length (an Arrow payload, one time in
  two, right after its schema message: a boundary where the stream still parses);
* ``garbage``: a payload is replaced by bytes no decoder reads (``0xc1``, msgpack's unused
  code, then random bytes);
* ``frame``: a malformed frame (an unknown control code) is written before the next chunk,
  so the server drops the connection with a logged reason; the client reconnects and
  resends what the server had not acknowledged.

These are corruptions a decoder can *detect*: what a shared, racing buffer does (issue 24)
or a peer that speaks another protocol.  Bit flips that leave valid msgpack with other values
are out of scope: the wire relies on TCP's (or TLS's) integrity for those, as Storm's does.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Final

from bench.chaos_plan import Switch
from spark_storm.messaging.api import IClient
from spark_storm.messaging.message import TaskMessage
from spark_storm.transport import tcp
from spark_storm.transport._base import as_batch
from spark_storm.transport._session import ClientSession

__all__ = ["CONTROL_KEY", "Context"]

#: The topology conf key that names the control directory.
CONTROL_KEY: Final = "bench.chaos.control"
_ARROW_MAGIC: Final = b"\xff\xff\xff\xff"
_BAD_FRAME: Final = struct.pack(">hi", -999, 4) + b"\xde\xad\xbe\xef"


def _schema_end(payload: bytes) -> int | None:
    """Where an Arrow IPC stream's first message (its schema) ends, or None."""
    if len(payload) < 8 or payload[:4] != _ARROW_MAGIC:
        return None
    length = int.from_bytes(payload[4:8], "little")
    end = 8 + length
    return end if end < len(payload) else None


def corrupt(payload: bytes, mode: str, rng: random.Random) -> bytes:
    """``payload`` truncated or replaced by unreadable bytes (see the module doc)."""
    if mode == "garbage" or len(payload) < 2:
        return b"\xc1" + rng.randbytes(rng.randrange(0, 64))
    schema_end = _schema_end(payload)
    if schema_end is not None and rng.random() < 0.5:
        return payload[:schema_end]
    return payload[: rng.randrange(1, len(payload))]


class _ChaosSession(ClientSession):
    """A client session that writes a malformed frame before a chunk, when the ``frame`` window says so."""

    chaos: Switch

    def take_outbox(self) -> list[bytes]:
        chunks = super().take_outbox()
        injection = self.chaos.active()
        hit = chunks and injection is not None and injection.mode == "frame" and self.chaos.draw(injection, "frame")
        if hit:
            self.chaos.log("frame", "malformed frame before a chunk")
            return [_BAD_FRAME, *chunks]
        return chunks


class _ChaosClient(tcp.TcpClient):
    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        self._chaos = Switch(context.control, "corrupt", f"{os.getpid()}->{host}:{port}")
        super().__init__(context, topology_id, host, port)
        # The session was made by the base class; its writer thread reads take_outbox per flush.
        self._session.__class__ = _ChaosSession
        self._session.chaos = self._chaos  # type: ignore[attr-defined]

    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        batch = as_batch(messages)
        injection = self._chaos.active()
        if injection is not None and injection.mode in ("truncate", "garbage"):
            out = []
            for message in batch:
                rng = self._chaos.draw(injection, "payload")
                if rng is None:
                    out.append(message)
                    continue
                bad = corrupt(message.payload, injection.mode, rng)
                self._chaos.log(injection.mode, f"task={message.task} {len(message.payload)}->{len(bad)} bytes")
                out.append(TaskMessage(message.task, bad))
            batch = out
        super().send(batch)


class Context(tcp.Context):
    """The tcp context, with clients that corrupt what they send while a ``corrupt`` window is open."""

    alias: ClassVar[str] = "chaos-tcp"

    def __init__(self, conf: Any) -> None:
        super().__init__(conf)
        self.control = Path(str(self.conf.get(CONTROL_KEY) or "."))

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        return _ChaosClient(self, topology_id, host, port)
