"""The ``redis`` backend: task changelogs and input logs in Redis, for tasks that move between hosts.

``topology.state.provider: redis`` with ``topology.state.provider.config: {url:
redis://host:6379/0, prefix: spark-storm}``.  A task's data is readable from every host,
so a task reassigned after its host was lost restores its state and replays its input
log on the new one.  Keys, under ``<prefix>:<topology>:task:<t>:``::

    committed              the committed epoch (int)
    entries                hash: epoch -> changelog entry (the same bytes as the embedded files)
    log:epochs             hash: segment number -> epoch
    log:seg:<n>            list of input-log records (the same bytes as the embedded files)
    log:batches            hash: query id -> last batch id in committed state

Durability is Redis's: run it with the append-only file (``spark-storm redis start`` does,
``appendfsync everysec``).  A Redis that cannot be reached is a
:class:`~spark_storm.errors.StateUnavailableError` naming the task and the address.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from spark_storm.errors import ConfigError, StateCorruptError, StateUnavailableError
from spark_storm.messaging.api import GroupKey
from spark_storm.state.backend import (
    NO_EPOCH,
    InputLog,
    StateBackend,
    TaskStore,
)
from spark_storm.state.format import (
    Entry,
    LogRecord,
    decode_entry,
    decode_record,
    encode_record,
)

__all__ = ["RedisBackend"]


@contextlib.contextmanager
def _reachable(address: str, what: str) -> Iterator[None]:
    import redis

    try:
        yield
    except redis.exceptions.ConnectionError as exc:
        msg = f"{what}: Redis at {address} cannot be reached ({exc}); start it (spark-storm redis start) or fix the url"
        raise StateUnavailableError(msg) from exc
    except redis.exceptions.TimeoutError as exc:
        msg = f"{what}: Redis at {address} did not answer in time ({exc})"
        raise StateUnavailableError(msg) from exc


def _read_origin(client: Any, key: str, guard: Callable[[], contextlib.AbstractContextManager[None]]) -> str | None:
    """Return the restore id stored at ``<key>origin`` (None: none), for a task store and an input log alike."""
    with guard():
        raw = client.get(key + "origin")
    return None if raw is None else bytes(raw).decode()


class _RedisTaskStore(TaskStore):
    def __init__(self, task: int, client: Any, key: str, address: str) -> None:
        super().__init__(task)
        self._r = client
        self._key = key
        self._address = address

    def describe(self) -> str:
        return f"task {self.task} in Redis at {self._address} ({self._key}*)"

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return _reachable(self._address, f"task {self.task}")

    def committed(self) -> int:
        with self._guard():
            raw = self._r.get(self._key + "committed")
        if raw is None:
            return NO_EPOCH
        try:
            return int(raw)
        except ValueError as exc:
            msg = f"task {self.task}: {self._key}committed holds {raw!r}, not an epoch; it is corrupt"
            raise StateCorruptError(msg) from exc

    def epochs(self) -> list[int]:
        with self._guard():
            return sorted(int(e) for e in self._r.hkeys(self._key + "entries"))

    def fulls(self) -> list[int]:
        with self._guard():
            return sorted(int(e) for e in self._r.smembers(self._key + "fulls"))

    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        data = b"".join(parts)
        with self._guard():
            pipe = self._r.pipeline()
            pipe.hset(self._key + "entries", str(epoch), data)
            if full:
                pipe.sadd(self._key + "fulls", str(epoch))
            else:
                pipe.srem(self._key + "fulls", str(epoch))
            pipe.execute()
        return len(data)

    def read(self, epoch: int) -> Entry:
        with self._guard():
            data = self._r.hget(self._key + "entries", str(epoch))
        if data is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in Redis at {self._address}"
            raise StateCorruptError(msg)
        entry = decode_entry(bytes(data), f"task {self.task}: Redis {self._key}entries[{epoch}]")
        if entry.epoch != epoch:
            msg = f"task {self.task}: Redis entry {epoch} holds epoch {entry.epoch}; it is corrupt"
            raise StateCorruptError(msg)
        return entry

    def mark_committed(self, epoch: int) -> None:
        with self._guard():
            self._r.set(self._key + "committed", str(epoch))

    def delete(self, epochs: list[int]) -> None:
        if epochs:
            with self._guard():
                self._r.hdel(self._key + "entries", *[str(e) for e in epochs])
                self._r.srem(self._key + "fulls", *[str(e) for e in epochs])

    def read_raw(self, epoch: int) -> bytes:
        with self._guard():
            data = self._r.hget(self._key + "entries", str(epoch))
        if data is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in Redis at {self._address}"
            raise StateCorruptError(msg)
        return bytes(data)

    def origin(self) -> str | None:
        return _read_origin(self._r, self._key, self._guard)

    def set_origin(self, origin: str) -> None:
        with self._guard():
            self._r.set(self._key + "origin", origin)


class _RedisInputLog(InputLog):
    def __init__(self, task: int, client: Any, key: str, address: str) -> None:
        super().__init__(task)
        self._r = client
        self._key = key + "log:"
        self._address = address
        self._open: tuple[int, int] | None = None  # (epoch, segment number)
        self._keys: dict[GroupKey, int] = {}
        with self._guard():
            raw = self._r.get(self._key + "kept")
        kept = json.loads(raw) if raw else []
        self._kept = {(str(k[0]), int(k[1]), int(k[2]), int(k[3])): None for k in kept}
        for epoch, seg in self._segments():
            for record in self._read(seg):
                if record.key is not None:
                    self._keys[record.key] = epoch

    def describe(self) -> str:
        return f"task {self.task}'s input log in Redis at {self._address}"

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return _reachable(self._address, f"task {self.task}'s input log")

    def _segments(self) -> list[tuple[int, int]]:
        with self._guard():
            raw = self._r.hgetall(self._key + "epochs")
        return sorted((int(epoch), int(seg)) for seg, epoch in raw.items())

    def _read(self, seg: int) -> Iterator[LogRecord]:
        with self._guard():
            items = self._r.lrange(f"{self._key}seg:{seg}", 0, -1)
        where = f"task {self.task}: Redis {self._key}seg:{seg}"
        for data in items:
            record, _ = decode_record(bytes(data), 0, where)
            if record is None:
                msg = f"{where}: a truncated record; the log is corrupt"
                raise StateCorruptError(msg)
            yield record

    def append(self, record: LogRecord, epoch: int) -> None:
        with self._guard():
            if self._open is None or self._open[0] != epoch:
                seg = int(self._r.incr(self._key + "next"))
                self._r.hset(self._key + "epochs", str(seg), str(epoch))
                self._open = (epoch, seg)
            self._r.rpush(f"{self._key}seg:{self._open[1]}", encode_record(record))
        if record.key is not None:
            self._keys[record.key] = epoch

    def close(self, epoch: int) -> None:
        if self._open is not None and self._open[0] <= epoch:
            self._open = None
        if epoch > self.last_barrier():
            with self._guard():
                self._r.set(self._key + "barrier", str(epoch))

    def last_barrier(self) -> int:
        with self._guard():
            raw = self._r.get(self._key + "barrier")
        return NO_EPOCH if raw is None else int(raw)

    def entries(self, after: int) -> Iterator[LogRecord]:
        for epoch, seg in self._segments():
            if epoch > after:
                yield from self._read(seg)

    def retag(self, after: int, epoch: int) -> None:
        if self.last_barrier() > after:
            with self._guard():
                self._r.set(self._key + "barrier", str(after))
        with self._guard():
            for old, seg in self._segments():
                if old > after:
                    self._r.hset(self._key + "epochs", str(seg), str(epoch))
        if self._open is not None and self._open[0] > after:
            self._open = (epoch, self._open[1])
        self._keys = {k: (epoch if e > after else e) for k, e in self._keys.items()}

    def truncate(self, epoch: int) -> None:
        self._keep([k for k, e in self._keys.items() if e <= epoch])
        if self._open is not None and self._open[0] <= epoch:
            self._open = None
        with self._guard():
            for old, seg in self._segments():
                if old <= epoch:
                    self._r.delete(f"{self._key}seg:{seg}")
                    self._r.hdel(self._key + "epochs", str(seg))
        self._keys = {k: e for k, e in self._keys.items() if e > epoch}

    def keys(self) -> set[GroupKey]:
        return set(self._keys)

    def has(self, key: GroupKey) -> bool:
        return key in self._keys or key in self._kept

    def _store_kept(self, keys: list[GroupKey]) -> None:
        with self._guard():
            self._r.set(self._key + "kept", json.dumps([list(k) for k in keys]))

    def committed_batches(self) -> dict[str, int]:
        with self._guard():
            raw = self._r.hgetall(self._key + "batches")
        return {k.decode() if isinstance(k, bytes) else str(k): int(v) for k, v in raw.items()}

    def set_committed_batches(self, batches: Mapping[str, int]) -> None:
        merged = self.committed_batches()
        with self._guard():
            for query, batch in batches.items():
                if batch > merged.get(query, -1):
                    self._r.hset(self._key + "batches", query, str(batch))
        self._prune_kept()

    def origin(self) -> str | None:
        return _read_origin(self._r, self._key, self._guard)

    def set_origin(self, origin: str) -> None:
        with self._guard():
            self._r.set(self._key + "origin", origin)

    def _clear(self) -> None:
        with self._guard():
            segments = [f"{self._key}seg:{seg}" for _epoch, seg in self._segments()]
            names = ("epochs", "barrier", "batches", "kept", "origin")
            self._r.delete(*segments, *[self._key + n for n in names])
        self._open = None
        self._keys = {}
        self._kept = {}


class RedisBackend(StateBackend):
    """Task stores and input logs in one Redis database (see the module doc)."""

    name = "redis"
    durable = True

    def __init__(self, topology: str, url: str, prefix: str = "spark-storm", connect_timeout_s: float = 5.0) -> None:
        from spark_storm.extras import require

        require("redis", "topology.state.provider: redis")
        import redis

        self.url = url
        self._prefix = f"{prefix}:{topology}:"
        try:
            self._client = redis.Redis.from_url(
                url, socket_connect_timeout=connect_timeout_s, socket_timeout=max(connect_timeout_s, 10.0)
            )
        except ValueError as exc:
            msg = f"topology.state.provider.config url {url!r} is not a Redis URL ({exc}); use redis://host:port/db"
            raise ConfigError(msg) from exc
        with _reachable(url, f"topology {topology!r}"):
            self._client.ping()

    @classmethod
    def from_settings(cls, topology: str, settings: Mapping[str, Any]) -> RedisBackend:
        """Build from ``topology.state.provider.config`` (``url`` required)."""
        url = settings.get("url")
        if not isinstance(url, str) or not url:
            msg = (
                "topology.state.provider redis needs topology.state.provider.config url, e.g. redis://127.0.0.1:6379/0"
            )
            raise ConfigError(msg)
        timeout_ms = settings.get("connect.timeout.ms", 5000)
        return cls(topology, url, str(settings.get("prefix", "spark-storm")), float(timeout_ms) / 1000)

    def describe(self) -> str:
        return f"Redis state at {self.url} ({self._prefix}*)"

    def task_store(self, task: int) -> TaskStore:
        return _RedisTaskStore(task, self._client, f"{self._prefix}task:{task}:", self.url)

    def input_log(self, task: int, writer: str) -> InputLog:
        return _RedisInputLog(task, self._client, f"{self._prefix}task:{task}:", self.url)

    def close(self) -> None:
        self._client.close()
