r"""Multilang serializers: Storm's JSON (``{...}\\nend\\n``) and pystorm's msgpack, batched both ways.

A child's stdout is read in large chunks; :meth:`Decoder.feed` returns every complete
message in a chunk at once.  The JSON decoder joins a chunk's messages into one JSON
array and parses it with one ``json.loads`` call (a message's own text never holds a raw
newline followed by ``end``, so splitting on ``\\nend\\n`` is exact); only when that fails
does it parse message by message, to name the bad one.  Encoders turn many messages into
one ``bytes`` for one ``write``; tuples have their own fast path
(:meth:`MultilangSerializer.encode_tuples`).

Nothing here touches a process or a thread: the codec is pure, so it is tested alone.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from typing import Any, Final

import msgpack

from spark_storm.errors import ConfigError, ProtocolError

__all__ = [
    "SERIALIZERS",
    "Decoder",
    "JsonMultilangSerializer",
    "MsgpackMultilangSerializer",
    "MultilangSerializer",
    "ProtocolError",
    "TupleRecord",
    "make_multilang_serializer",
]

#: (tuple id, source component, source stream, source task, values): what a bolt child gets.
TupleRecord = tuple[str, str, str, int, list[Any]]

_END: Final = b"\nend\n"
_SHOWN: Final = 200  # bytes of a bad message quoted in an error


def _show(data: bytes | str) -> str:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    return repr(text[:_SHOWN] + ("..." if len(text) > _SHOWN else ""))


class Decoder(abc.ABC):
    """Turns a child's output, fed in chunks of any size, into whole messages."""

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes

    @abc.abstractmethod
    def feed(self, data: bytes) -> list[Any]:
        """Return the messages ``data`` completes (possibly none).

        Raises
        ------
        ProtocolError
            The bytes are not messages of this serializer, or one message grew past
            ``max_message_bytes`` without ending.
        """


class MultilangSerializer(abc.ABC):
    """One wire format of the multilang protocol (both directions)."""

    name: str = ""

    @abc.abstractmethod
    def encode(self, messages: Sequence[Any]) -> bytes:
        """Encode ``messages`` (dicts, or lists of task ids) as one byte string."""

    @abc.abstractmethod
    def encode_tuples(self, records: Sequence[TupleRecord]) -> bytes:
        """Encode bolt tuples (``{"id", "comp", "stream", "task", "tuple"}`` messages) as one byte string."""

    @abc.abstractmethod
    def decoder(self, max_message_bytes: int) -> Decoder:
        """Return a fresh decoder for one child's output."""


class _JsonDecoder(Decoder):
    def __init__(self, max_message_bytes: int) -> None:
        super().__init__(max_message_bytes)
        self._buf = b""

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf + data if self._buf else data
        cut = buf.rfind(_END)
        if cut < 0:
            if buf[:4] == b"end\n":  # an empty message right at the start: skip its end line
                buf = buf[4:]
            if len(buf) > self.max_message_bytes:
                msg = (
                    f"a message grew past {self.max_message_bytes} bytes without its 'end' line "
                    f"(topology.multilang.max.message.bytes); it starts {_show(buf)}"
                )
                raise ProtocolError(msg)
            self._buf = buf
            return []
        self._buf = buf[cut + len(_END) :]
        complete = buf[:cut]
        if complete[:4] == b"end\n":
            complete = complete[4:]
        parts = complete.split(_END)
        try:
            out = json.loads(b"[" + b",".join(parts) + b"]")
        except ValueError:
            return self._one_by_one(parts)
        if len(out) != len(parts):  # a part held two values ("1,2"): sort it out one by one
            return self._one_by_one(parts)
        return out  # type: ignore[no-any-return]

    @staticmethod
    def _one_by_one(parts: list[bytes]) -> list[Any]:
        out = []
        for part in parts:
            if not part.strip():
                continue  # blank lines between messages (pystorm skips them too)
            try:
                out.append(json.loads(part))
            except ValueError as exc:
                msg = f"not a JSON message followed by an 'end' line: {_show(part)} ({exc})"
                raise ProtocolError(msg) from None
        return out


class JsonMultilangSerializer(MultilangSerializer):
    """Storm's own format: one JSON document, a newline, then a line ``end``, per message."""

    name = "json"

    def __init__(self) -> None:
        self._dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self._heads: dict[tuple[str, str, int], str] = {}

    def encode(self, messages: Sequence[Any]) -> bytes:
        dumps = self._dumps
        return "".join([dumps(m) + "\nend\n" for m in messages]).encode("utf-8")

    def encode_tuples(self, records: Sequence[TupleRecord]) -> bytes:
        dumps = self._dumps
        heads = self._heads
        out = []
        for tid, comp, stream, task, values in records:
            key = (comp, stream, task)
            head = heads.get(key)
            if head is None:
                if len(heads) > 4096:
                    heads.clear()
                head = heads[key] = f',"comp":{dumps(comp)},"stream":{dumps(stream)},"task":{task},"tuple":'
            out.append(f'{{"id":{dumps(tid)}{head}{dumps(values)}}}\nend\n')
        return "".join(out).encode("utf-8")

    def decoder(self, max_message_bytes: int) -> Decoder:
        return _JsonDecoder(max_message_bytes)


class _MsgpackDecoder(Decoder):
    def __init__(self, max_message_bytes: int) -> None:
        super().__init__(max_message_bytes)
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(max_message_bytes, 1 << 20))

    def feed(self, data: bytes) -> list[Any]:
        unpacker = self._unpacker
        try:
            unpacker.feed(data)
            out = list(unpacker)
        except msgpack.BufferFull:
            msg = (
                f"a msgpack message grew past {self.max_message_bytes} bytes "
                "(topology.multilang.max.message.bytes) without ending"
            )
            raise ProtocolError(msg) from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            msg = f"not msgpack messages: {exc} (in a chunk starting {_show(data[:64])})"
            raise ProtocolError(msg) from None
        return out


def _strip_array_header(packed: bytes, n: int) -> bytes:
    """``packb(list)`` is an array header then each element's encoding: drop the header."""
    if n < 16:
        return packed[1:]
    if n < 65536:
        return packed[3:]
    return packed[5:]


class MsgpackMultilangSerializer(MultilangSerializer):
    """pystorm's msgpack format: messages back to back, no delimiter (``streamparse_run -s msgpack``)."""

    name = "msgpack"

    def __init__(self) -> None:
        self._packb = msgpack.Packer(use_bin_type=True).pack

    def encode(self, messages: Sequence[Any]) -> bytes:
        items = list(messages)
        return _strip_array_header(self._packb(items), len(items)) if items else b""

    def encode_tuples(self, records: Sequence[TupleRecord]) -> bytes:
        items = [
            {"id": tid, "comp": comp, "stream": stream, "task": task, "tuple": values}
            for tid, comp, stream, task, values in records
        ]
        return _strip_array_header(self._packb(items), len(items)) if items else b""

    def decoder(self, max_message_bytes: int) -> Decoder:
        return _MsgpackDecoder(max_message_bytes)


#: Names a topology may give ``topology.multilang.serializer``: ours, and Storm's Java class names.
SERIALIZERS: Final[dict[str, type[MultilangSerializer]]] = {
    "json": JsonMultilangSerializer,
    "msgpack": MsgpackMultilangSerializer,
    "org.apache.storm.multilang.JsonSerializer": JsonMultilangSerializer,
}


def make_multilang_serializer(name: str) -> MultilangSerializer:
    """Return the serializer named ``name`` (``json``, ``msgpack``, or a Storm Java class name).

    Raises
    ------
    ConfigError
        The name is none of those (the message lists them).
    """
    cls = SERIALIZERS.get(name)
    if cls is None and isinstance(name, str) and "msgpack" in name.lower().replace("messagepack", "msgpack"):
        cls = MsgpackMultilangSerializer  # pystorm's Java side: ...MessagePackSerializer
    if cls is None:
        msg = (
            f"config key 'topology.multilang.serializer' is {name!r}; use 'json' (Storm's format) or 'msgpack' "
            "(pystorm's, with `streamparse_run -s msgpack ...` as the command)"
        )
        raise ConfigError(msg)
    return cls()
