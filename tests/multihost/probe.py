"""Answers questions about the cluster state from inside a namespace: one JSON request per stdin line.

``python -m tests.multihost.probe ZK [--set key=json]...``; requests are ``[op, args...]``,
replies ``{"ok": value}`` or ``{"error": text}``, one line each.
"""

from __future__ import annotations

import json
import sys
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
