"""The long-running processes: worker, local-cluster, nimbus and supervisor.

Each runs until SIGTERM or Ctrl-C (:func:`~spark_storm.cli.signals.run_until_signalled`),
then shuts down in order.  A worker and a supervisor take a second signal as "now": the
worker exits without draining, the supervisor kills its workers first; both exit with 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from spark_storm.cli.common import command_conf, overrides, start_ui
from spark_storm.cli.signals import run_until_signalled
from spark_storm.config import Config, load_config
from spark_storm.errors import ConfigError, StormError

if TYPE_CHECKING:
    from spark_storm.ui import UIServer
    from spark_storm.worker.worker import Worker

__all__ = ["local_cluster", "nimbus", "run_cluster_worker", "run_worker", "supervisor", "worker"]

logger = logging.getLogger(__name__)

#: Exit status when the worker's ordered shutdown outlives its deadline by 5 s.
_WATCHDOG_EXIT = 4


class _Runner(Protocol):
    """What :func:`_serve` drives: a :class:`Worker` or a ``ZooKeeperWorker``."""

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def failed(self) -> bool: ...

    def start(self) -> object: ...

    def request_stop(self, reason: str, *, failure: bool = ...) -> None: ...

    def stop(self, timeout: float) -> bool: ...


def worker(args: argparse.Namespace) -> int:
    """``spark-storm worker``: one worker, in static mode or cluster mode."""
    conf = command_conf(args)
    if args.zookeeper is not None or args.topology_id is not None:
        if args.topology or args.workers:
            msg = (
                "worker: --zookeeper/--topology-id (cluster mode: plan from ZooKeeper) and --topology/--workers "
                "(static mode) exclude each other; give one form"
            )
            raise ConfigError(msg)
        if not args.topology_id:
            msg = "worker: cluster mode needs --topology-id NAME (the submitted topology; `spark-storm list` shows it)"
            raise ConfigError(msg)
        return run_cluster_worker(args.zookeeper, args.topology_id, args.host, args.port, conf)
    if not args.topology:
        msg = "worker: give --topology FILE (static mode) or --zookeeper ZK --topology-id NAME (cluster mode)"
        raise ConfigError(msg)
    return run_worker(args.topology, args.host, args.port, args.workers, conf, args.filter)


def run_worker(
    topology_path: str, host: str, port: int, workers: str | None, conf: Config, properties: str | None = None
) -> int:
    """Run one worker on a static slot list until SIGTERM/SIGINT; a second signal or the deadline forces exit."""
    from spark_storm.topology import Slot, load_topology, plan
    from spark_storm.worker.worker import Worker

    topo = load_topology(topology_path, properties)
    p = plan(topo, workers) if workers else plan(topo)
    runner = Worker(p, Slot(host, port), conf)
    runner.tune_process()
    return _serve(runner, lambda: runner, conf)


def run_cluster_worker(zookeeper: str | None, topology_id: str, host: str, port: int, conf: Config) -> int:
    """Run one worker whose plan and status come from ZooKeeper (what a supervisor launches)."""
    from spark_storm.topology import Slot
    from spark_storm.worker.zk_worker import ZooKeeperWorker

    runner = ZooKeeperWorker(zookeeper, topology_id, Slot(host, port), conf, tune_process=True)
    return _serve(runner, lambda: runner.worker, conf)


def _serve(runner: _Runner, worker_of: Callable[[], Worker | None], conf: Config) -> int:
    """Start ``runner``, wait for its stop (a signal or its own), run the ordered shutdown."""

    def start() -> None:
        try:
            runner.start()
        except StormError:
            runner.stop(5)  # what started (server, threads, a ZooKeeper session) goes down before the error
            raise
        started = worker_of()
        if started is not None:
            print(
                f"worker {started.slot} of {started.topology_id} listening; tasks {sorted(started.local_tasks)}; "
                f"metrics on port {started.metrics_port}; heartbeat {started.heartbeat_path}",
                flush=True,
            )

    run_until_signalled(
        start,
        until=runner.stopping.is_set,
        on_signal=lambda name: runner.request_stop(f"signal {name}", failure=False),
        on_second_signal=lambda: logger.error("second signal: exiting now without draining"),
        poll_s=0.1,  # a worker that stops by itself (a failure, a kill) is noticed within 0.1 s
    )
    timeout = conf.get_int("topology.worker.shutdown.timeout.ms", minimum=0) / 1000
    watchdog = threading.Timer(timeout + 5, lambda: os._exit(_WATCHDOG_EXIT))
    watchdog.daemon = True
    watchdog.start()
    clean = runner.stop(timeout)
    watchdog.cancel()
    stopped = worker_of()
    name = stopped.slot if stopped is not None else "(not started)"
    print(f"worker {name} stopped ({'clean' if clean else 'deadline passed'})", flush=True)
    return 0 if clean and not runner.failed else 1


def local_cluster(args: argparse.Namespace) -> int:
    """``spark-storm local-cluster``: N workers on loopback (and the UI) until Ctrl-C or a worker exits."""
    from spark_storm.cluster.local_cluster import LocalCluster

    settings = overrides(args.set)
    if args.from_savepoint:
        from spark_storm.topology.loader import load_topology
        from spark_storm.worker.checkpoint.seed import restore_for

        restore = restore_for(args.from_savepoint, args.allow_unmatched_state)
        settings = {**settings, **restore(load_topology(args.topology, args.filter))}
        print(f"starting from savepoint {args.from_savepoint}")
    cluster = LocalCluster(args.topology, args.workers, args.conf, settings, properties=args.filter)
    print(f"starting {args.workers} workers of {cluster.topology.name}: {cluster.workers_arg}")
    ui: UIServer | None = None

    def start() -> None:
        nonlocal ui
        # The UI binds first: a taken port then fails the command before any worker runs.
        if args.ui_port is not None:
            from spark_storm.ui import local_ui

            ui = start_ui(local_ui(cluster.heartbeat_dir, command_conf(args), None, args.ui_port))
        cluster.start()
        print(cluster.plan.describe())
        for slot in cluster.slots:
            hb = cluster.heartbeat(slot)
            if hb is not None:  # every worker wrote one: start() waited for it
                print(f"worker {slot}: pid {hb['pid']}, metrics http://127.0.0.1:{hb['metrics_port']}/metrics")
        if ui is None:
            hint = "(or run local-cluster with --ui-port 8080)"
            print(f"UI: spark-storm ui --heartbeat-dir {cluster.heartbeat_dir}  {hint}")
        else:
            print(f"UI: {ui.url}topology.html?id={cluster.topology.name}")
        print("running; Ctrl-C stops every worker (ordered shutdown)", flush=True)

    run_until_signalled(start, until=lambda: any(p.poll() is not None for p in cluster.procs.values()), poll_s=0.2)
    codes = cluster.stop()
    if ui is not None:
        ui.close()
    for slot, code in codes.items():
        print(f"worker {slot} exited with {code}")
    return 0 if all(c == 0 for c in codes.values()) else 1


def nimbus(args: argparse.Namespace) -> int:
    """``spark-storm nimbus``: contend for leadership, assign topologies (and serve the UI) until a signal."""
    from spark_storm.cluster.nimbus import Nimbus
    from spark_storm.ui import zookeeper_ui

    conf = command_conf(args)
    daemon = Nimbus(args.zookeeper, conf)
    ui: UIServer | None = None
    leading = False

    def start() -> None:
        nonlocal ui
        daemon.start()
        print(f"nimbus {daemon.identifier} contending for leadership in ZooKeeper {daemon.state.address}", flush=True)
        if args.ui_port is not None:
            # Leader or not, this nimbus serves the UI over its own session: every nimbus reads the same state.
            try:
                ui = start_ui(zookeeper_ui(daemon.state, conf, None, args.ui_port))
            except BaseException:  # the nimbus goes down with the error, which is re-raised
                daemon.stop()
                raise
            print(f"nimbus {daemon.identifier}: UI on {ui.url}", flush=True)

    def report_leadership() -> None:
        nonlocal leading
        if daemon.is_leader != leading:
            leading = daemon.is_leader
            print(f"nimbus {daemon.identifier} {'is the leader' if leading else 'is no longer the leader'}", flush=True)

    run_until_signalled(start, every=report_leadership, poll_s=0.2)
    if ui is not None:
        ui.close()
    daemon.stop()
    print(f"nimbus {daemon.identifier} stopped", flush=True)
    return 0


def supervisor(args: argparse.Namespace) -> int:
    """``spark-storm supervisor``: offer this host's slots and run the workers assigned to them."""
    from spark_storm.cluster.supervisor import Supervisor

    ports = None
    if args.slots:
        try:
            ports = [int(p) for p in args.slots.split(",") if p.strip()]
        except ValueError:
            msg = f"--slots {args.slots!r} is not a list of ports like 6700,6701"
            raise ConfigError(msg) from None
    sets = overrides(args.set)
    daemon = Supervisor(
        args.zookeeper,
        args.host,
        ports,
        load_config(args.conf, sets),
        conf_path=args.conf,
        overrides=sets,
        supervisor_id=args.id,
        local_dir=args.local_dir,
    )

    def start() -> None:
        daemon.start()
        print(
            f"supervisor {daemon.id} offering {', '.join(map(str, daemon.slots))} "
            f"in ZooKeeper {daemon.state.address}; logs in {daemon.local_dir / 'logs'}",
            flush=True,
        )

    def kill_now() -> None:
        logger.error("second signal: killing every worker now")
        daemon.kill_now()

    run_until_signalled(start, on_second_signal=kill_now)
    print(f"supervisor {daemon.id}: stopping its workers", flush=True)
    daemon.stop()
    print(f"supervisor {daemon.id} stopped", flush=True)
    return 0
