"""Commands that act on a cluster through ZooKeeper, and the ones that only read a file.

``submit``, ``activate``, ``deactivate``, ``rebalance``, ``kill`` and ``list`` (Storm's
``storm`` client commands), ``config`` and ``topology plan``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spark_storm.cli.common import command_conf
from spark_storm.config import load_config
from spark_storm.errors import ConfigError

if TYPE_CHECKING:
    pass

__all__ = ["cluster_command", "config", "plan"]


def _executors(pairs: list[str] | None) -> dict[str, int]:
    """Parse repeated ``--executors COMPONENT=N``."""
    out: dict[str, int] = {}
    for pair in pairs or []:
        component, _, count = pair.partition("=")
        if not component or not count.strip().isdigit():
            msg = f"--executors {pair!r}: give COMPONENT=N, e.g. --executors ledger=4"
            raise ConfigError(msg)
        out[component.strip()] = int(count)
    return out


def _savepoint_line(name: str, taken: Mapping[str, Any]) -> str:
    tasks = ", ".join(f"{c} ({n} tasks)" for c, n in sorted(dict(taken.get("components", {})).items()))
    return f"savepoint of {name} at epoch {taken['epoch']}: {taken['path']}  [{tasks}]"


def cluster_command(args: argparse.Namespace) -> int:
    """``spark-storm submit|activate|deactivate|rebalance|kill|list``, through ZooKeeper."""
    from spark_storm.cluster import admin
    from spark_storm.cluster.state import ClusterState

    with ClusterState(args.zookeeper, command_conf(args)) as state:
        if args.command == "submit":
            restore = None
            if args.from_savepoint:
                from spark_storm.worker.checkpoint.seed import restore_for

                restore = restore_for(args.from_savepoint, args.allow_unmatched_state)
            record = admin.submit(
                state,
                args.file,
                args.workers,
                check_classes=not args.no_class_check,
                properties=args.filter,
                restore=restore,
            )
            if args.from_savepoint:
                print(f"starting from savepoint {args.from_savepoint}")
            print(
                f"submitted topology {record.name} ({record.workers} workers) to {state.address}; "
                f"`spark-storm list` shows its assignment"
            )
        elif args.command == "activate":
            print(f"topology {admin.activate(state, args.name).name} is active")
        elif args.command == "deactivate":
            print(f"topology {admin.deactivate(state, args.name).name} is inactive")
        elif args.command == "rebalance":
            executors = _executors(args.executors)
            record = admin.rebalance(state, args.name, args.workers, executors)
            moved = "".join(f", {c} on {n} executors" for c, n in sorted(executors.items()))
            print(f"topology {record.name}: rebalancing to {record.workers} workers{moved}")
        elif args.command == "savepoint":
            taken = admin.savepoint(state, args.name, args.dir)
            print(_savepoint_line(args.name, taken))
        elif args.command == "kill":
            if args.savepoint:
                admin.require_nimbus(state)
                taken = admin.savepoint(state, args.name, args.savepoint, commit_first=True, hold=True)
                print(_savepoint_line(args.name, taken))
            record = admin.kill(state, args.name, args.wait)
            left = max(0.0, (record.kill_at or 0) - time.time())
            print(
                f"topology {record.name} killed: its workers stop now (ordered shutdown); "
                f"removed from ZooKeeper in {left:.0f}s"
            )
        else:
            leader = state.nimbus_leader()
            print(f"nimbus leader: {leader or 'none (start `spark-storm nimbus`)'}")
            rows = admin.list_topologies(state)
            if not rows:
                print("no topologies submitted")
            else:
                print(f"{'name':24s} {'status':9s} {'workers':>9s} {'version':>7s} {'uptime':>9s}  slots")
                for row in rows:
                    print(
                        f"{row.name:24s} {row.status:9s} {f'{row.workers}/{row.requested}':>9s} "
                        f"{row.version:>7d} {_duration(row.uptime_s):>9s}  {','.join(row.slots)}"
                    )
    return 0


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def config(args: argparse.Namespace) -> int:
    """``spark-storm config``: the effective configuration, secrets hidden."""
    conf = load_config(args.conf)
    for key in sorted(conf):
        value = conf[key]
        shown = "***" if "secret" in key and value and not key.endswith(".file") else value
        print(f"{key}: {shown}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """``spark-storm topology plan``: tasks, executors and the worker each runs on."""
    from spark_storm.topology import load_topology
    from spark_storm.topology import plan as make_plan

    topo = load_topology(args.file, args.filter)
    if topo.notes:  # a Flux file: what became what
        print(f"{args.file} is a Flux file; converted:")
        for note in topo.notes:
            print(f"  {note}")
    print(make_plan(topo, args.workers).describe() if args.workers else make_plan(topo).describe())
    return 0
