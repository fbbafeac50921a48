"""The state's byte formats, once for every backend: changelog entries and input-log records.

* an **entry** (one epoch of a task's changelog): ``SST1`` magic, the CRC-32 of the body,
  the body: msgpack ``[epoch, full, keys, values, deletes]``, or, written by a state with
  TTL on, ``[epoch, full, keys, values, deletes, ttl]`` where ``ttl`` is a map: ``c`` the
  barrier's clock (ms, nil: none yet), ``w`` the write time of every key put (one number
  for a delta, a list beside ``keys`` for a full snapshot; nil where unknown), ``t`` the
  per-put TTLs as ``[index into keys, ms]`` pairs, ``x`` the keys that expired at the
  barrier (apart from ``deletes``, so a change feed tells an expiry from a delete).  Five
  items read as an entry without TTL: entries written before TTL existed still decode;
* a **record** (what a worker accepted for a source task): u32 length, u32 CRC-32, the
  body: msgpack ``[group key or nil, payloads]``.

Both are written as parts where a value is a list of big bytes (a window pane's Arrow
streams, a large payload): the bytes are the same as one ``packb``'s, but the big bytes are
not copied into the body.  The codec's msgpack, never pickle; a corrupt or truncated entry or
record is a :class:`~spark_storm.errors.StateCorruptError` naming where, never silently
empty state.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spark_storm.codec.serializer import pack_value, unpack_value
from spark_storm.errors import StateCorruptError, WireFormatError
from spark_storm.messaging.api import GroupKey
from spark_storm.state.kv import DELETED, freeze, thaw

__all__ = [
    "ENTRY_MAGIC",
    "Entry",
    "LogRecord",
    "TtlMeta",
    "decode_entry",
    "decode_record",
    "encode_entry",
    "encode_entry_parts",
    "encode_record",
    "encode_record_parts",
]

ENTRY_MAGIC: Final = b"SST1"
_CRC_BYTES: Final = 4

#: A bytes value at least this long is not copied into an entry's or a record's msgpack body:
#: the body is written as parts (the msgpack headers, and the bytes themselves).
_BIG_BYTES: Final = 4096


@dataclass(frozen=True)
class Entry:
    """One epoch of a task's changelog: the changed keys (``full``: the whole state).

    ``deletes`` holds every key the epoch removed, the expired ones too (so a restore that
    knows nothing of TTL drops them); ``expired`` says which of them expired.  ``ttl``:
    the entry carries TTL bookkeeping: ``clock`` (the barrier's), ``written`` (write time
    per key put, where known) and ``ttls`` (per-put TTLs).
    """

    epoch: int
    full: bool
    puts: dict[Any, Any]
    deletes: list[Any]
    expired: list[Any] = field(default_factory=list)
    written: dict[Any, int] = field(default_factory=dict)
    ttls: dict[Any, int] = field(default_factory=dict)
    clock: int | None = None
    ttl: bool = False

    @property
    def size(self) -> int:
        """Number of keys it holds (puts and deletes)."""
        return len(self.puts) + len(self.deletes)


@dataclass(frozen=True)
class TtlMeta:
    """The TTL bookkeeping an entry carries (see the module's format).

    ``written`` is one write time for every key put (a delta), or a map of them (a full
    snapshot; keys missing from it have none).
    """

    clock: int | None
    written: int | Mapping[Any, int] | None
    ttls: Mapping[Any, int]
    expired: Sequence[Any]


def _array_header(n: int) -> bytes:
    """Return the msgpack header of an array of ``n`` items (the shortest form, as ``packb`` writes it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    """Return the msgpack header of ``n`` bytes (bin 8/16/32, as ``packb`` writes bytes with ``use_bin_type``)."""
    if n < 1 << 8:
        return b"\xc4" + bytes((n,))
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _is_blobs(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of bytes, the first one big (a window pane's Arrow streams, say)."""
    return (
        type(value) is list
        and bool(value)
        and type(value[0]) is bytes
        and len(value[0]) >= _BIG_BYTES
        and all(type(v) is bytes for v in value)
    )


def _pack_items(values: list[Any], parts: list[bytes]) -> None:
    """Append the msgpack of each value to ``parts`` (no array header): lists of big bytes by reference."""
    run: list[Any] = []
    for value in values:
        if not _is_blobs(value):
            run.append(value)
            continue
        if run:
            parts.append(pack_value(run)[len(_array_header(len(run))) :])
            run = []
        parts.append(_array_header(len(value)))
        for blob in value:
            parts.append(_bin_header(len(blob)))
            parts.append(blob)
    if run:
        parts.append(pack_value(run)[len(_array_header(len(run))) :])


def _ttl_map(meta: TtlMeta, stored: list[Any]) -> dict[str, Any]:
    """Return the ``ttl`` item of an entry whose puts are ``stored`` (keys in stored form, in ``keys`` order)."""
    out: dict[str, Any] = {"c": meta.clock, "x": [thaw(k) for k in meta.expired]}
    written = meta.written
    if isinstance(written, Mapping):
        get = written.get
        out["w"] = [get(k) for k in stored]
    else:
        out["w"] = written
    ttls = meta.ttls
    if ttls:
        pairs = [[i, ttls[k]] for i, k in enumerate(stored) if k in ttls]
        if pairs:
            out["t"] = pairs
    return out


def encode_entry_parts(epoch: int, full: bool, changes: Mapping[Any, Any], ttl: TtlMeta | None = None) -> list[bytes]:
    """Encode one changelog entry as parts to write in order (see :func:`encode_entry`).

    The bytes are :func:`encode_entry`'s, but a value that is a list of big bytes (a pane's
    Arrow streams) is not copied into the body: its bytes are parts of their own, and the
    CRC-32 runs over the parts.  ``ttl``: the entry's TTL bookkeeping (None: the format
    without it, byte for byte as before TTL existed).
    """
    keys, values, deletes = [], [], []
    stored: list[Any] = []
    # the stored keys are needed for per-key TTL data only (a full snapshot's times, per-put TTLs)
    by_key = ttl is not None and (bool(ttl.ttls) or isinstance(ttl.written, Mapping))
    big = False
    for key, value in changes.items():
        if value is DELETED:
            deletes.append(thaw(key))
        else:
            keys.append(thaw(key))
            values.append(value)
            if by_key:
                stored.append(key)
            if not big and type(value) is list and value and type(value[0]) is bytes:
                big = len(value[0]) >= _BIG_BYTES
    extra = [_ttl_map(ttl, stored)] if ttl is not None else []
    if big:
        head = b"\x96" if extra else b"\x95"
        body = [head + pack_value(epoch) + pack_value(full) + pack_value(keys) + _array_header(len(values))]
        _pack_items(values, body)
        body.append(pack_value(deletes))
        if extra:
            body.append(pack_value(extra[0]))
    else:  # small values (a keyed count's): one packb
        body = [pack_value([epoch, full, keys, values, deletes, *extra])]
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return [ENTRY_MAGIC + crc.to_bytes(_CRC_BYTES, "big"), *body]


def encode_entry(epoch: int, full: bool, changes: Mapping[Any, Any], ttl: TtlMeta | None = None) -> bytes:
    """Encode one changelog entry: magic, CRC-32 of the body, body (msgpack)."""
    return b"".join(encode_entry_parts(epoch, full, changes, ttl))


def decode_entry(data: bytes, where: str) -> Entry:
    """Decode what :func:`encode_entry` made; StateCorruptError naming ``where`` otherwise."""
    head = len(ENTRY_MAGIC) + _CRC_BYTES
    if len(data) < head or data[: len(ENTRY_MAGIC)] != ENTRY_MAGIC:
        msg = f"{where}: not a state entry ({len(data)} bytes, bad magic); it is corrupt or truncated"
        raise StateCorruptError(msg)
    body = data[head:]
    if zlib.crc32(body) != int.from_bytes(data[len(ENTRY_MAGIC) : head], "big"):
        msg = f"{where}: checksum mismatch over {len(body)} bytes; the entry is corrupt or truncated"
        raise StateCorruptError(msg)
    try:
        items = unpack_value(body)
        epoch, full, keys, values, deletes = items[:5]
        stored = [freeze(k) for k in keys]
        puts = dict(zip(stored, values, strict=True))
        if len(items) == 5:  # no TTL (and every entry written before TTL existed)
            return Entry(int(epoch), bool(full), puts, [freeze(k) for k in deletes])
        if len(items) != 6:
            msg = f"{len(items)} items, not 5 or 6"
            raise ValueError(msg)
        return _ttl_entry(int(epoch), bool(full), puts, stored, [freeze(k) for k in deletes], items[5])
    except (WireFormatError, ValueError, TypeError, KeyError, IndexError) as exc:
        msg = f"{where}: unreadable state entry: {exc}"
        raise StateCorruptError(msg) from exc


def _ttl_entry(
    epoch: int, full: bool, puts: dict[Any, Any], stored: list[Any], deletes: list[Any], meta: Mapping[str, Any]
) -> Entry:
    expired = [freeze(k) for k in meta.get("x") or ()]
    clock = meta.get("c")
    w = meta.get("w")
    if w is None:
        written: dict[Any, int] = {}
    elif isinstance(w, list):
        if len(w) != len(stored):
            msg = f"{len(w)} write times for {len(stored)} keys"
            raise ValueError(msg)
        written = {k: int(t) for k, t in zip(stored, w, strict=True) if t is not None}
    else:
        written = dict.fromkeys(stored, int(w))
    ttls = {stored[int(i)]: int(t) for i, t in meta.get("t") or ()}
    return Entry(
        epoch,
        full,
        puts,
        deletes + expired,
        expired,
        written,
        ttls,
        None if clock is None else int(clock),
        True,
    )


@dataclass(frozen=True)
class LogRecord:
    """What a worker accepted for a source task: a delivery group (its key) or plain messages."""

    key: GroupKey | None
    payloads: list[bytes] = field(default_factory=list)


def encode_record_parts(record: LogRecord) -> list[bytes]:
    """Encode one input-log record as parts to write in order (see :func:`encode_record`).

    The bytes are :func:`encode_record`'s; big payloads are parts of their own, not copied.
    """
    payloads = record.payloads
    if not _is_blobs(payloads):
        body = pack_value([list(record.key) if record.key is not None else None, payloads])
        return [len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big"), body]
    parts = [b"\x92" + pack_value(list(record.key) if record.key is not None else None)]
    _pack_items([payloads], parts)
    crc = length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return [length.to_bytes(4, "big") + crc.to_bytes(4, "big"), *parts]


def encode_record(record: LogRecord) -> bytes:
    """Encode one input-log record: u32 length, u32 CRC-32, body (msgpack)."""
    return b"".join(encode_record_parts(record))


def decode_record(data: bytes, pos: int, where: str) -> tuple[LogRecord | None, int]:
    """Decode the record at ``pos``; (None, pos) at a truncated tail; StateCorruptError on a bad record."""
    if pos + 8 > len(data):
        return None, pos
    length = int.from_bytes(data[pos : pos + 4], "big")
    if pos + 8 + length > len(data):
        return None, pos
    body = data[pos + 8 : pos + 8 + length]
    if zlib.crc32(body) != int.from_bytes(data[pos + 4 : pos + 8], "big"):
        msg = f"{where}: input-log record at byte {pos} fails its checksum; the log is corrupt"
        raise StateCorruptError(msg)
    try:
        key, payloads = unpack_value(body)
        group = (str(key[0]), int(key[1]), int(key[2]), int(key[3])) if key is not None else None
        return LogRecord(group, [bytes(p) for p in payloads]), pos + 8 + length
    except (WireFormatError, ValueError, TypeError, IndexError) as exc:
        msg = f"{where}: unreadable input-log record at byte {pos}: {exc}"
        raise StateCorruptError(msg) from exc
