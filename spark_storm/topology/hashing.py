"""Spark-compatible Murmur3 hashing for fields grouping.

Fields grouping must send equal keys to the same task from every process: Spark
executors (which route rows before sending) and workers (which route emits between
bolts).  Python's ``hash`` is salted per process, so we use the hash Spark SQL already
has: ``pyspark.sql.functions.hash(*cols)`` — Murmur3 x86_32, seed 42, folded over the
columns (each column's hash is the next one's seed; null leaves the seed unchanged).
It is written out here because no library has Spark's variant: Spark mixes a string's
tail bytes one by one (``hashUnsafeBytes``), where reference Murmur3 packs them into one
word, so strings whose UTF-8 length is not a multiple of 4 hash differently (the tests pin
Spark's own values for lengths 1 to 5).  This module hashes one row at a time;
:mod:`spark_storm.topology.routing` has the vectorised twin (numpy) the Spark writer and
batch bolts use, and ``task_index = pmod(hash, n)``.

Supported value types, as Spark hashes them: ``None``, ``bool`` (BooleanType), ``int``
(always as LongType: a worker cannot know the column's width, so the Spark side casts
integral key columns to long before hashing), ``float`` (DoubleType: the IEEE bits as a
long; -0.0 hashes like 0.0), ``str`` (UTF-8 bytes) and ``bytes``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from typing import Final

__all__ = [
    "MURMUR3_C1",
    "MURMUR3_C2",
    "MURMUR3_FMIX1",
    "MURMUR3_FMIX2",
    "MURMUR3_H1_ADD",
    "SPARK_HASH_SEED",
    "fields_hash",
    "murmur3_bytes",
    "murmur3_int",
    "murmur3_long",
    "pmod",
]

# Murmur3 x86_32's constants, shared with the vectorised twin in ``topology.routing``
# (a property test checks the two agree row by row).
SPARK_HASH_SEED: Final = 42
MURMUR3_C1: Final = 0xCC9E2D51
MURMUR3_C2: Final = 0x1B873593
MURMUR3_H1_ADD: Final = 0xE6546B64
MURMUR3_FMIX1: Final = 0x85EBCA6B
MURMUR3_FMIX2: Final = 0xC2B2AE35
_C1: Final = MURMUR3_C1
_C2: Final = MURMUR3_C2
_M32: Final = 0xFFFFFFFF


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    k1 = ((k1 << 15) | (k1 >> 17)) & _M32
    return (k1 * _C2) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = ((h1 << 13) | (h1 >> 19)) & _M32
    return (h1 * 5 + MURMUR3_H1_ADD) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * MURMUR3_FMIX1) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * MURMUR3_FMIX2) & _M32
    h1 ^= h1 >> 16
    return h1


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def murmur3_int(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (signed int32 result)."""
    return _signed(_fmix(_mix_h1(seed & _M32, _mix_k1(value & _M32)), 4))


def murmur3_long(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashLong`` (signed int32 result)."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32))
    return _signed(_fmix(h1, 8))


def murmur3_bytes(data: bytes, seed: int) -> int:
    """Spark's ``hashUnsafeBytes`` (strings and binary; tail bytes mixed one by one, signed)."""
    n = len(data)
    aligned = n - n % 4
    h1 = seed & _M32
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _M32))
    return _signed(_fmix(h1, n))


def _hash_value(value: object, seed: int) -> int:
    if value is None:
        return seed
    if isinstance(value, bool):
        return murmur3_int(int(value), seed)
    if isinstance(value, int):
        return murmur3_long(value, seed)
    if isinstance(value, float):
        if value == 0.0:
            value = 0.0
        (bits,) = struct.unpack("<q", struct.pack("<d", value))
        return murmur3_long(bits, seed)
    if isinstance(value, str):
        return murmur3_bytes(value.encode("utf-8"), seed)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return murmur3_bytes(bytes(value), seed)
    msg = (
        f"fields grouping cannot hash a {type(value).__name__} ({value!r}); group on "
        "str, int, float, bool, bytes or null fields"
    )
    raise TypeError(msg)


def fields_hash(values: Iterable[object]) -> int:
    """Return ``pyspark.sql.functions.hash(*values)`` for one row (signed int32)."""
    key = tuple(values)
    try:
        return _cached_hash(key)
    except TypeError:  # an unhashable value (e.g. bytearray): hash without the cache
        return _fields_hash(key)


def _fields_hash(values: tuple[object, ...]) -> int:
    seed = SPARK_HASH_SEED
    for value in values:
        seed = _hash_value(value, seed)
    return seed


# Grouping keys repeat (words, user ids): remembering recent ones saves the pure-Python
# Murmur3 for most tuples.  Keyed by the tuple of values *and their types*, so 1, 1.0
# and True (equal in Python, hashed differently by Spark) never share an entry.
@functools.lru_cache(maxsize=65536)
def _cached_by_type(values: tuple[object, ...], types: tuple[type, ...]) -> int:
    return _fields_hash(values)


def _cached_hash(values: tuple[object, ...]) -> int:
    return _cached_by_type(values, tuple(map(type, values)))


def pmod(h: int, n: int) -> int:
    """Spark's ``pmod``: a non-negative remainder."""
    return h % n
