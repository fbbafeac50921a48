"""``KeyValueState``: what a stateful bolt reads and writes (Storm's ``KeyValueState``).

A plain dict underneath, so ``get`` and ``put`` cost a dict lookup and a set insert: the
state remembers which keys changed since the last checkpoint, and the checkpoint writes
just those (:meth:`KeyValueState.take_changes`).  Keys and values are the types tuples
carry — str, bytes, int, float, bool, None, lists and maps of those, and Spark's date,
time and decimal types — because they are stored with the codec's msgpack, never pickle.
A value the codec cannot store is refused by ``put`` (the tuple fails, the worker goes on).

Lists (and tuples) and maps work as keys too: they are kept in a hashable form (tuples,
and frozensets of pairs for maps), and ``items()`` gives them back as lists and dicts (a
list key and a tuple key with the same items are the same key, as msgpack cannot tell
them apart).  A list key costs one tuple copy per call; it is checked against the codec
only when it is new to the state.

A value changed in place must be ``put`` again to be saved (as in Storm).

**TTL** (docs/design/state.md, "State TTL"): ``put(key, value, ttl=...)``, or a component TTL the
executor turns on (:meth:`KeyValueState.enable_ttl`), makes the state a
:class:`TtlKeyValueState`.  Nothing about TTL happens per call: a key's write time is the
clock of the checkpoint barrier after its last ``put`` (:meth:`TtlKeyValueState.advance`,
called at every barrier), and the same call removes every key whose write time plus TTL
the barrier's clock has reached.  So the dict never holds a key whose expiry was decided:
an expired key reads as absent with no check in ``get``, and the decision depends only on
the barriers' clocks and the state's content (a replay decides the same).
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterator, Mapping
from typing import Any, Final

from spark_storm.codec.serializer import pack_value
from spark_storm.errors import StateError

__all__ = ["DELETED", "KeyValueState", "TtlKeyValueState", "freeze", "thaw", "ttl_ms"]


class _Deleted:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


#: The value of a deleted key in :meth:`KeyValueState.take_changes`.
DELETED: Final = _Deleted()

_PLAIN: Final = frozenset({str, int, float, bool, bytes, type(None)})
#: Scalars msgpack stores whatever their value (ints only within 64 bits: checked apart).
_SAFE: Final = frozenset({str, float, bool, bytes, type(None)})
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1


class _FrozenMap(frozenset[Any]):
    """A map key in hashable form: the frozenset of its (key, value) pairs."""

    __slots__ = ()


def freeze(value: Any) -> Any:
    """Return a key in the hashable form the state keeps (lists as tuples, maps frozen)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list or kind is tuple:
        frozen = tuple(value)
        try:
            hash(frozen)
        except TypeError:  # a list or map inside
            return tuple(freeze(v) for v in value)
        return frozen
    if kind is dict or kind is _FrozenMap:
        items = value.items() if kind is dict else value
        return _FrozenMap((freeze(k), freeze(v)) for k, v in items)
    return value


def thaw(value: Any) -> Any:
    """Return a key as the user gave it: lists and dicts for frozen keys."""
    kind = type(value)
    if kind is tuple:
        return [thaw(v) for v in value]
    if kind is _FrozenMap:
        return {thaw(k): thaw(v) for k, v in value}
    return value


def _flat(items: Any) -> bool:
    """Whether a list or tuple holds only scalars msgpack stores as they are (no packing needed)."""
    for v in items:
        kind = type(v)
        if kind not in _SAFE and not (kind is int and _INT_MIN <= v <= _INT_MAX):
            return False
    return True


def _check_value(value: Any, what: str = "value") -> None:
    """Refuse what the codec cannot store; scalars and flat lists are known good without packing."""
    kind = type(value)
    if kind is int:
        if _INT_MIN <= value <= _INT_MAX:
            return
        msg = f"state {what} {value} is an int outside 64 bits, which the codec cannot store; store it as a str"
        raise StateError(msg)
    if kind in _SAFE or ((kind is list or kind is tuple) and _flat(value)):
        return
    _check(value, what)


def _check(value: Any, what: str) -> None:
    try:
        pack_value(value)
    except (TypeError, ValueError, OverflowError) as exc:
        kind = type(value)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        msg = (
            f"state {what} of type {name} cannot be stored ({exc}); store str, bytes, int (64 bits), float, "
            "bool, None, lists and maps of those, or Spark's date/time/decimal values"
        )
        raise StateError(msg) from exc


def ttl_ms(value: Any, what: str = "ttl") -> int:
    """Return a TTL in milliseconds: a positive int (ms) or a ``timedelta``; StateError naming the value otherwise."""
    if isinstance(value, dt.timedelta):
        ms = value // dt.timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        msg = f"{what} {value!r} ({type(value).__name__}) is not a TTL; give milliseconds (an int) or a timedelta"
        raise StateError(msg)
    if ms < 1:
        msg = f"{what} {value!r} is not positive; a TTL is at least 1 ms (leave it out for the component's TTL)"
        raise StateError(msg)
    return ms


class _Book:
    """What TTL keeps beside the data: write times, per-key TTLs, and expiry buckets (one task's thread)."""

    __slots__ = (
        "buckets",
        "carry",
        "clock",
        "exempt",
        "heap",
        "pending",
        "refused",
        "stamp",
        "ttl",
        "ttls",
        "unstamped",
    )

    def __init__(self, ttl: int | None = None, exempt: str | None = None) -> None:
        #: The component's TTL in ms (None: keys without a per-put TTL never expire).
        self.ttl = ttl
        #: Keys that are lists starting with this never expire (the window engine's own).
        self.exempt = exempt
        #: Why a TTL cannot work in this state (no clock): a put with ``ttl`` raises it.
        self.refused: str | None = None
        #: Per key with a TTL: its write time (the clock of the barrier after its last put).
        self.stamp: dict[Any, int] = {}
        #: Per key whose last put gave a ``ttl``: that TTL.
        self.ttls: dict[Any, int] = {}
        #: The ``ttl`` of puts since the last barrier.
        self.pending: dict[Any, int] = {}
        #: Expiry time -> keys that expire then (a key written again since is skipped there).
        self.buckets: dict[int, list[Any]] = {}
        self.heap: list[int] = []
        #: The last barrier's clock (None: no clock yet).
        self.clock: int | None = None
        #: Keys with a TTL may lack a write time (restored from state written without TTL).
        self.unstamped = False
        #: Keys removed when the state was loaded (the next barrier's entry records them).
        self.carry: list[Any] = []

    def index(self, key: Any, written: int, ttl: int) -> None:
        at = written + ttl
        bucket = self.buckets.get(at)
        if bucket is None:
            self.buckets[at] = [key]
            heapq.heappush(self.heap, at)
        else:
            bucket.append(key)

    def is_exempt(self, key: Any) -> bool:
        return type(key) is tuple and bool(key) and key[0] == self.exempt

    def due(self, data: dict[Any, Any], now: int) -> list[Any]:
        """Remove from ``data`` every key whose write time plus TTL ``now`` has reached; return them."""
        out: list[Any] = []
        heap, buckets, stamp, ttls, ttl = self.heap, self.buckets, self.stamp, self.ttls, self.ttl
        while heap and heap[0] <= now:
            at = heapq.heappop(heap)
            for key in buckets.pop(at):
                written = stamp.get(key)
                if written is None:
                    continue
                t = ttls.get(key, ttl)
                if t is None or written + t != at:
                    continue  # written again since, or its TTL changed: another bucket has it
                del stamp[key]
                ttls.pop(key, None)
                if data.pop(key, _ABSENT) is not _ABSENT:
                    out.append(key)
        return out


_ABSENT: Final = object()


class KeyValueState:
    """A task's key-value state; changes since the last checkpoint are tracked by key.

    Parameters
    ----------
    data : Mapping, optional
        The state to start from (as restored from a checkpoint).
    """

    __slots__ = ("_changed", "_data", "_ttl")

    def __init__(self, data: Mapping[Any, Any] | None = None) -> None:
        self._data: dict[Any, Any] = {}
        self._changed: set[Any] = set()
        self._ttl: _Book | None = None
        if data:
            self.restore(data)

    # --- the bolt's API ---------------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        """Return the value of ``key``, or ``default``."""
        if type(key) is list:
            key = tuple(key)
        try:
            return self._data.get(key, default)
        except TypeError:  # a list or a map, in the key or as the key
            return self._data.get(freeze(key), default)

    def _key(self, key: Any) -> Any:
        """Return a non-str key as kept, checked against the codec unless the state holds it already."""
        frozen = tuple(key) if type(key) is list else key
        try:
            if frozen in self._data:  # it passed the check below when it was put
                return frozen
        except TypeError:  # a list or a map
            frozen = freeze(key)
            if frozen in self._data:
                return frozen
        _check_value(key, "key")
        return frozen

    def put(self, key: Any, value: Any, ttl: int | dt.timedelta | None = None) -> None:
        """Set ``key`` to ``value``; ``ttl`` (ms or a timedelta) overrides the component's TTL for this write.

        Raises
        ------
        StateError
            The key or value is of a type the state cannot store (it names the type), or a
            ``ttl`` that is not a positive duration, or one on a component with no clock for it.
        """
        if ttl is not None:
            self._put_ttl(key, value, ttl_ms(ttl))
            return
        kind = type(key)
        if kind is not str and not (kind is int and _INT_MIN <= key <= _INT_MAX):
            key = self._key(key)  # lists, maps, other scalars: frozen, checked when new
        kind = type(value)
        if kind not in _SAFE and not (kind is int and _INT_MIN <= value <= _INT_MAX):
            _check_value(value)
        self._data[key] = value
        self._changed.add(key)

    def _put_ttl(self, key: Any, value: Any, ms: int) -> None:
        """Put with a per-put TTL (the key's stored form is what the barrier looks up)."""
        book = self._book()
        KeyValueState.put(self, key, value)
        kind = type(key)
        if kind is not str and not (kind is int and _INT_MIN <= key <= _INT_MAX):
            key = self._key(key)
        book.pending[key] = ms

    def delete(self, key: Any) -> None:
        """Remove ``key`` (nothing happens when it is absent)."""
        if type(key) not in _PLAIN:
            key = freeze(key)
        if key in self._data:
            del self._data[key]
            self._changed.add(key)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate over (key, value) pairs."""
        for key, value in self._data.items():
            yield thaw(key), value

    def keys(self) -> Iterator[Any]:
        """Iterate over the keys."""
        for key in self._data:
            yield thaw(key)

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Any) -> bool:
        if type(key) in _PLAIN:
            return key in self._data
        return freeze(key) in self._data

    def __repr__(self) -> str:
        return f"KeyValueState({len(self._data)} keys, {len(self._changed)} changed)"

    # --- vectorised access (batch bolts) --------------------------------------------------
    def get_many(self, keys: Any, default: Any = None) -> Any:
        """Look up many keys at once: a pyarrow array, numpy array or list in, the same kind out."""
        values = [self.get(k, default) for k in _as_list(keys)]
        return _like(keys, values)

    def put_many(self, keys: Any, values: Any, ttl: int | dt.timedelta | None = None) -> None:
        """Set many keys at once (pyarrow arrays, numpy arrays or lists of equal length); ``ttl`` as in :meth:`put`."""
        key_list, value_list = _as_list(keys), _as_list(values)
        if len(key_list) != len(value_list):
            msg = f"put_many: {len(key_list)} keys but {len(value_list)} values"
            raise StateError(msg)
        ms = ttl_ms(ttl) if ttl is not None else 0
        pending = self._book().pending if ttl is not None else None
        if pending is None and self._ttl is not None:
            pending = self._ttl.pending if self._ttl.pending else None
        data, changed = self._data, self._changed
        safe, kept = _SAFE, self._key
        for key, value in zip(key_list, value_list, strict=True):
            kind = type(key)
            if kind is not str and not (kind is int and _INT_MIN <= key <= _INT_MAX):
                key = kept(key)
            kind = type(value)
            if kind not in safe and not (kind is int and _INT_MIN <= value <= _INT_MAX):
                _check_value(value)
            data[key] = value
            changed.add(key)
            if pending is not None:
                if ttl is not None:
                    pending[key] = ms
                else:
                    pending.pop(key, None)

    # --- the checkpoint's API ---------------------------------------------------------------
    def take_changes(self) -> dict[Any, Any]:
        """Return every key changed since the last call, with its value (or :data:`DELETED`); reset."""
        changed, self._changed = self._changed, set()
        data = self._data
        return {key: data.get(key, DELETED) for key in changed}

    def snapshot(self) -> dict[Any, Any]:
        """Return a copy of the whole state (keys in their stored form); reset the changed keys."""
        self._changed = set()
        return dict(self._data)

    def restore(self, data: Mapping[Any, Any]) -> None:
        """Replace the whole state (keys as stored or as the codec reads them back).

        With TTL on, every key's write time and per-key TTL are forgotten (keys with a TTL
        get the next barrier's clock); :meth:`TtlKeyValueState.load_ttl` puts them back.
        """
        self._data = {(freeze(k) if type(k) not in _PLAIN else k): v for k, v in data.items()}
        self._changed = set()
        book = self._ttl
        if book is not None:
            self._ttl = _Book(book.ttl, book.exempt)
            self._ttl.refused = book.refused
            self._ttl.unstamped = True

    @property
    def changed(self) -> int:
        """How many keys changed since the last checkpoint."""
        return len(self._changed)

    # --- TTL (the executor's side) --------------------------------------------------------------
    @property
    def ttl_on(self) -> bool:
        """Whether keys of this state can expire (a component TTL, or a put with ``ttl``)."""
        return isinstance(self, TtlKeyValueState)

    @property
    def ttl_clock(self) -> int | None:
        """The TTL clock at the last checkpoint barrier, in ms (the epoch's watermark; None: none yet)."""
        return self._ttl.clock if self._ttl is not None else None

    def enable_ttl(self, ttl: int | None, exempt: str | None = None) -> TtlKeyValueState:
        """Turn TTL on: keys not written for ``ttl`` ms (None: only those put with a ``ttl``) expire at barriers.

        ``exempt``: keys that are lists starting with this string never expire.  Keys already
        held get the next barrier's clock as their write time.
        """
        book = self._ttl
        if book is None:
            book = self._ttl = _Book(ttl, exempt)
        else:
            book.ttl, book.exempt = ttl, exempt
        book.refused = None
        book.unstamped = True
        # same slots: the class says which put runs (per-put TTLs pending or not)
        self.__class__ = _PendingTtlKeyValueState if book.pending else TtlKeyValueState
        assert isinstance(self, TtlKeyValueState)
        return self

    def configure_ttl(self, ttl: int | None, exempt: str | None = None) -> None:
        """Set what :meth:`enable_ttl` would, leaving TTL off until a put with ``ttl`` turns it on."""
        if self._ttl is None:
            self._ttl = _Book(ttl, exempt)
        else:
            self._ttl.ttl, self._ttl.exempt = ttl, exempt
            self._ttl.refused = None

    def refuse_ttl(self, reason: str) -> None:
        """Make a put with ``ttl`` fail with ``reason`` (the component has no clock to measure it)."""
        if self._ttl is None:
            self._ttl = _Book()
        self._ttl.refused = reason

    def _book(self) -> _Book:
        """Return the TTL book, turning TTL on (a first put with ``ttl``)."""
        book = self._ttl
        if book is not None and book.refused:
            raise StateError(book.refused)
        if not isinstance(self, TtlKeyValueState):
            self.enable_ttl(book.ttl if book is not None else None, book.exempt if book is not None else None)
            book = self._ttl
        self.__class__ = _PendingTtlKeyValueState  # until the barrier: puts without ttl forget one
        assert book is not None
        return book


class TtlKeyValueState(KeyValueState):
    """A :class:`KeyValueState` whose keys expire: what a state becomes once TTL is on.

    ``get`` and ``put`` are the plain ones (the dict holds no key whose expiry was
    decided, and a write's time is taken at the barrier), so TTL costs nothing per call.
    At every checkpoint barrier the executor calls :meth:`advance` with the barrier's
    clock, then encodes the entry with :meth:`entry_ttl`.
    """

    __slots__ = ()

    _ttl: _Book

    def advance(self, now: int | None) -> list[Any]:
        """Barrier: stamp the keys written since the last one with ``now``, remove the expired; return them.

        ``now`` is the barrier's clock in ms (the epoch's watermark, or the wall clock); it
        never goes back (an older one counts as the last).  None: no clock yet (no event
        time seen): nothing expires, and the keys written meanwhile get the first clock.
        The keys returned are in stored form, none of them among the changes to write.
        """
        book, data = self._ttl, self._data
        carry = [k for k in book.carry if k not in data] if book.carry else []
        book.carry = []
        pending, ttls, stamp, ttl = book.pending, book.ttls, book.stamp, book.ttl
        if now is None or (book.clock is not None and now < book.clock):
            now = book.clock
        if now is None:
            for key in self._changed:
                stamp.pop(key, None)
                o = pending.get(key) if pending else None
                if o is not None:
                    ttls[key] = o
                elif ttls:
                    ttls.pop(key, None)
            pending.clear()
            self.__class__ = TtlKeyValueState
            book.unstamped = True
            return carry
        book.clock = now
        changed = self._changed
        exempt = book.exempt
        index = book.index
        t: int | None
        bulk = not pending and not ttls and ttl is not None
        if bulk:  # the common case, in bulk: every key written has the component's TTL
            # Deleted keys are stamped too: expiry skips a key the dict no longer holds.
            live = changed if exempt is None else {k for k in changed if type(k) is not tuple or not book.is_exempt(k)}
            if live:
                stamp.update(dict.fromkeys(live, now))
                at = now + (ttl or 0)  # bulk: ttl is set
                bucket = book.buckets.get(at)
                if bucket is None:
                    book.buckets[at] = list(live)
                    heapq.heappush(book.heap, at)
                else:
                    bucket.extend(live)
        for key in () if bulk else changed:
            if key not in data:  # deleted
                stamp.pop(key, None)
                ttls.pop(key, None)
                continue
            o = pending.get(key) if pending else None
            if o is not None:
                ttls[key] = t = o
            else:
                if ttls:
                    ttls.pop(key, None)
                t = ttl
            if t is None or (exempt is not None and type(key) is tuple and book.is_exempt(key)):
                stamp.pop(key, None)
                continue
            stamp[key] = now
            index(key, now, t)
        pending.clear()
        self.__class__ = TtlKeyValueState
        if book.unstamped:  # keys with a TTL and no write time get this barrier's, recorded as changes
            for key in data:
                if key in stamp or (exempt is not None and book.is_exempt(key)):
                    continue
                t = ttls.get(key, ttl)
                if t is not None:
                    stamp[key] = now
                    index(key, now, t)
                    changed.add(key)
            book.unstamped = False
        expired = book.due(data, now)
        return carry + expired if carry else expired

    def entry_ttl(self, full: bool) -> tuple[int | None, int | Mapping[Any, int] | None, Mapping[Any, int]]:
        """(clock, write times, per-key TTLs) for the entry of the barrier :meth:`advance` just ran.

        Write times: one number for a delta (every key it puts was written at that barrier's
        clock; None when there was no clock yet), the per-key map for a full snapshot.
        """
        book = self._ttl
        return book.clock, (book.stamp if full else book.clock), book.ttls

    def load_ttl(self, written: Mapping[Any, int], ttls: Mapping[Any, int], clock: int | None) -> None:
        """Put back what a restore read (after :meth:`restore`): write times, per-key TTLs, the clock.

        Keys with a TTL and no write time (state written without TTL) get the next barrier's
        clock; keys whose expiry the restored clock has reached (a TTL made shorter) are
        removed now, and the next barrier's entry records them as expired.
        """
        book, data = self._ttl, self._data
        book.clock = clock
        book.ttls = {k: v for k, v in ttls.items() if k in data}
        ttl, exempt, stamp, index = book.ttl, book.exempt, book.stamp, book.index
        unstamped = False
        for key in data:
            t = book.ttls.get(key, ttl)
            if t is None or (exempt is not None and book.is_exempt(key)):
                continue
            w = written.get(key)
            if w is None:
                unstamped = True
                continue
            stamp[key] = w
            index(key, w, t)
        book.unstamped = unstamped
        if clock is not None:
            book.carry = book.due(data, clock)


class _PendingTtlKeyValueState(TtlKeyValueState):
    """A TTL state with puts that gave a ``ttl`` since the last barrier: a put without one forgets it.

    (The last put of a key in an epoch says which TTL applies; :meth:`advance` turns the
    state back into a :class:`TtlKeyValueState`, so only epochs with per-put TTLs pay this.)
    """

    __slots__ = ()

    def put(self, key: Any, value: Any, ttl: int | dt.timedelta | None = None) -> None:
        if ttl is not None:
            self._put_ttl(key, value, ttl_ms(ttl))
            return
        KeyValueState.put(self, key, value)
        self._ttl.pending.pop(key if type(key) in _PLAIN else self._key(key), None)


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, list):
        return values
    to_pylist = getattr(values, "to_pylist", None)  # pyarrow Array / ChunkedArray
    if to_pylist is not None:
        return list(to_pylist())
    tolist = getattr(values, "tolist", None)  # numpy
    if tolist is not None:
        return list(tolist())
    return list(values)


def _like(template: Any, values: list[Any]) -> Any:
    if hasattr(template, "to_pylist"):
        import pyarrow as pa

        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return values  # mixed types: a list is the honest answer
    if hasattr(template, "tolist") and type(template).__module__ == "numpy":
        import numpy as np

        return np.array(values, dtype=object if any(v is None for v in values) else None)
    return values
