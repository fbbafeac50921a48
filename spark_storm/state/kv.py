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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from spark_storm.codec.serializer import pack_value
from spark_storm.errors import StateError

__all__ = ["DELETED", "KeyValueState", "freeze", "thaw"]


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


class KeyValueState:
    """A task's key-value state; changes since the last checkpoint are tracked by key.

    Parameters
    ----------
    data : Mapping, optional
        The state to start from (as restored from a checkpoint).
    """

    __slots__ = ("_changed", "_data")

    def __init__(self, data: Mapping[Any, Any] | None = None) -> None:
        self._data: dict[Any, Any] = {}
        self._changed: set[Any] = set()
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

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``.

        Raises
        ------
        StateError
            The key or value is of a type the state cannot store (it names the type).
        """
        kind = type(key)
        if kind is not str and not (kind is int and _INT_MIN <= key <= _INT_MAX):
            key = self._key(key)  # lists, maps, other scalars: frozen, checked when new
        kind = type(value)
        if kind not in _SAFE and not (kind is int and _INT_MIN <= value <= _INT_MAX):
            _check_value(value)
        self._data[key] = value
        self._changed.add(key)

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

    def put_many(self, keys: Any, values: Any) -> None:
        """Set many keys at once (pyarrow arrays, numpy arrays or lists of equal length)."""
        key_list, value_list = _as_list(keys), _as_list(values)
        if len(key_list) != len(value_list):
            msg = f"put_many: {len(key_list)} keys but {len(value_list)} values"
            raise StateError(msg)
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
        """Replace the whole state (keys as stored or as the codec reads them back)."""
        self._data = {(freeze(k) if type(k) not in _PLAIN else k): v for k, v in data.items()}
        self._changed = set()

    @property
    def changed(self) -> int:
        """How many keys changed since the last checkpoint."""
        return len(self._changed)


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
