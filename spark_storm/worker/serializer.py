"""Tuple serialization: values <-> bytes, chosen by ``topology.serializer``.

Payload layouts (documented in docs/protocol.md, "Tuple payloads"):

* to a *source* task (sent by Spark or any client): the tuple's values, as one array;
* between bolts: ``[source_task, stream, values]``.

The default, msgpack, is fast and safe on bytes from the network: it builds only plain
data (no code runs while decoding).  Pickle is refused unless the user turned on
``topology.serializer.allow.pickle`` *and* the links are authenticated.
"""

from __future__ import annotations

import abc
import pickle
from typing import Any, ClassVar

import msgpack

from spark_storm.config import STORM_AUTH_SECRET, Config
from spark_storm.errors import ConfigError, WireFormatError

__all__ = ["MsgpackSerializer", "PickleSerializer", "Serializer", "make_serializer"]

SERIALIZER_KEY = "topology.serializer"
ALLOW_PICKLE_KEY = "topology.serializer.allow.pickle"


class Serializer(abc.ABC):
    """Turns tuple values into bytes and back."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def dumps(self, obj: Any) -> bytes:
        """Serialize a list (of values, or a [task, stream, values] header)."""

    @abc.abstractmethod
    def loads(self, data: bytes) -> Any:
        """Deserialize; raise :class:`WireFormatError` on bytes that are not ours."""

    def loads_many(self, payloads: list[bytes]) -> list[Any]:
        """Deserialize many payloads; WireFormatError if any is bad (callers then go one by one)."""
        return [self.loads(p) for p in payloads]


class MsgpackSerializer(Serializer):
    """msgpack: str, bytes, int, float, bool, None, lists and maps."""

    name: ClassVar[str] = "msgpack"

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)

    def dumps(self, obj: Any) -> bytes:
        try:
            return self._packer.pack(obj)  # type: ignore[no-any-return]
        except (TypeError, ValueError) as exc:
            msg = f"cannot serialize {obj!r} with msgpack: {exc}; emit str/bytes/int/float/bool/None/list/dict values"
            raise WireFormatError(msg) from exc

    def loads(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            msg = f"payload of {len(data)} bytes is not valid msgpack: {exc}"
            raise WireFormatError(msg) from exc

    def loads_many(self, payloads: list[bytes]) -> list[Any]:
        unpackb = msgpack.unpackb
        try:
            return [unpackb(p, raw=False, strict_map_key=False) for p in payloads]
        except Exception as exc:  # which payload is bad is for the caller's slow path to say
            msg = f"a batch of {len(payloads)} payloads holds invalid msgpack: {exc}"
            raise WireFormatError(msg) from exc


class PickleSerializer(Serializer):
    """pickle: any Python object.  Only on authenticated links, and only when allowed."""

    name: ClassVar[str] = "pickle"

    def dumps(self, obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        # allow_pickle: make_serializer only builds this when the user enabled pickle
        # and the transport authenticates every peer with the shared secret.
        try:
            return pickle.loads(data)  # allow_pickle: built only when enabled on authenticated links
        except Exception as exc:
            msg = f"payload of {len(data)} bytes is not a pickle: {exc}"
            raise WireFormatError(msg) from exc


_ALIASES: dict[str, type[Serializer]] = {"msgpack": MsgpackSerializer, "pickle": PickleSerializer}


def make_serializer(conf: Config) -> Serializer:
    """Build the serializer named by ``topology.serializer``.

    Raises
    ------
    ConfigError
        Unknown name, or pickle without ``topology.serializer.allow.pickle`` and a secret.
    """
    name = conf.get_str(SERIALIZER_KEY)
    if name == "pickle":
        if not conf.get_bool(ALLOW_PICKLE_KEY):
            msg = (
                "topology.serializer is 'pickle', which runs code from the bytes it loads; set "
                f"{ALLOW_PICKLE_KEY}: true (and an auth secret) to accept that, or use 'msgpack'"
            )
            raise ConfigError(msg)
        if conf.auth_secret() is None:
            msg = (
                f"pickle needs authenticated links: set {STORM_AUTH_SECRET} (or .secret.file) so "
                "only peers with the secret can send bytes that get unpickled"
            )
            raise ConfigError(msg)
    cls = _ALIASES.get(name)
    if cls is None:
        from spark_storm.topology.model import resolve_class

        cls = resolve_class(name, "topology.serializer")
        if not (isinstance(cls, type) and issubclass(cls, Serializer)):
            msg = f"topology.serializer {name!r} is not a Serializer subclass"
            raise ConfigError(msg)
    return cls()
