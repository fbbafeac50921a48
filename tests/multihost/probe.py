"""Answers questions about the cluster state from inside a namespace: one JSON request per stdin line.

``python -m tests.multihost.probe ZK [--set key=json]...``; requests are ``[op, args...]``,
replies ``{"ok": value}`` or ``{"error": text}``, one line each.  Besides ZooKeeper it reads
what only the namespaces reach: workers' ``/health`` and the Redis state of the stateful tests.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

from spark_storm.cluster.state import ClusterState


def _conf(args: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, pair in zip(args[::2], args[1::2], strict=True):
        assert flag == "--set", args
        key, _, raw = pair.partition("=")
        out[key] = json.loads(raw)
    return out


def answer(state: ClusterState, op: str, args: list[Any]) -> Any:
    if op == "ping":
        return "pong"
    if op == "assignment":
        a = state.read_assignment(args[0])
        if a is None:
            return None
        return {
            "version": a.version,
            "slots": [str(s) for s in a.slots],
            "time": a.time,
            "executors": {str(e): str(s) for e, s in a.executors.items()},
        }
    if op == "heartbeats":
        return {str(slot): dict(hb.record) for slot, hb in state.read_heartbeats(args[0]).items()}
    if op == "leader":
        return state.nimbus_leader()
    if op == "supervisors":
        return sorted(state.supervisors())
    if op == "checkpoints":  # the checkpoint view of each worker of a topology (its /health)
        out = {}
        for slot, hb in state.read_heartbeats(args[0]).items():
            port = hb.record.get("metrics_port")
            try:
                url = f"http://{slot.host}:{port}/health"
                with urllib.request.urlopen(url, timeout=10) as r:
                    out[str(slot)] = json.loads(r.read()).get("checkpoint") or {}
            except OSError as exc:
                out[str(slot)] = {"error": repr(exc)}
        return out
    if op == "redis_state":  # [url, topology, tasks]: the committed state of those tasks, merged
        from spark_storm.state.redis import RedisBackend

        backend = RedisBackend(args[1], args[0])
        merged: dict[str, Any] = {}
        try:
            for task in args[2]:
                _, data = backend.task_store(int(task)).restore()
                for key, value in data.items():
                    if key in merged:
                        msg = f"key {key!r} is in two tasks' state"
                        raise ValueError(msg)
                    merged[str(key)] = value
        finally:
            backend.close()
        return merged
    msg = f"unknown op {op!r}"
    raise ValueError(msg)


def main() -> int:
    state = ClusterState(sys.argv[1], _conf(sys.argv[2:])).start()
    try:
        for line in sys.stdin:
            op, *args = json.loads(line)
            try:
                reply = {"ok": answer(state, op, args)}
            except Exception as exc:
                reply = {"error": repr(exc)}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    finally:
        state.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
