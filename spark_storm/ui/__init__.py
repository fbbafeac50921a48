"""The Storm UI for spark-storm: live pages and a REST API shaped like Storm's ``/api/v1``.

``spark-storm ui`` serves it; ``spark-storm local-cluster --ui-port P``, the demo and
``spark-storm nimbus --ui-port P`` serve it in-process.  The pages and the API read the
cluster through a :class:`ClusterSource` (:class:`LocalClusterSource` for heartbeat files,
:class:`ZooKeeperSource` for cluster mode) and each worker's ``GET /health``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_storm.config import Config
from spark_storm.ui.local import LocalClusterSource
from spark_storm.ui.server import UIServer
from spark_storm.ui.source import ClusterSource, ClusterView, NimbusInfo, SupervisorView, TopologyRef, WorkerRef

if TYPE_CHECKING:  # cluster mode needs kazoo (the `cluster` extra): imported when used, not with the UI
    from spark_storm.cluster.state import ClusterState
    from spark_storm.ui.zookeeper import ZooKeeperSource

__all__ = [
    "ClusterSource",
    "ClusterView",
    "LocalClusterSource",
    "NimbusInfo",
    "SupervisorView",
    "TopologyRef",
    "UIServer",
    "WorkerRef",
    "ZooKeeperSource",
    "local_ui",
    "serve_local_ui",
    "zookeeper_ui",
]


def local_ui(heartbeat_dir: str | Path, conf: Config, host: str | None = None, port: int | None = None) -> UIServer:
    """Build (not start) a UI over the workers whose heartbeats are in ``heartbeat_dir``."""
    source = LocalClusterSource(
        heartbeat_dir,
        worker_timeout_s=float(conf.get_int("ui.worker.timeout.secs", minimum=1)),
        http_timeout_s=conf.get_int("ui.http.timeout.ms", minimum=1) / 1000,
    )
    return UIServer(source, conf, host, port)


def serve_local_ui(heartbeat_dir: str | Path, conf: Config, *, any_port_if_busy: bool = False) -> UIServer:
    """Start a UI on ``ui.host:ui.port``; with ``any_port_if_busy``, on a free port when that one is taken."""
    try:
        return local_ui(heartbeat_dir, conf).start()
    except OSError:
        if not any_port_if_busy:
            raise
        return local_ui(heartbeat_dir, conf, port=0).start()


def zookeeper_ui(
    zookeeper: str | ClusterState | None, conf: Config, host: str | None = None, port: int | None = None
) -> UIServer:
    """Build (not start) a UI over a cluster whose state is in ZooKeeper.

    ``zookeeper`` is ``HOST:PORT[/chroot]`` (None: ``storm.zookeeper.*``; a session is opened
    now and closed with the UI) or a started :class:`spark_storm.cluster.state.ClusterState`
    to share (a nimbus's own; left open).  Workers are judged by nimbus's rules, with the
    ``nimbus.task.*`` timeouts of that session's configuration.
    """
    from spark_storm.extras import require

    require("kazoo", "the UI over a cluster (ZooKeeper)")
    from spark_storm.cluster.state import ClusterState
    from spark_storm.ui.zookeeper import ZooKeeperSource

    if isinstance(zookeeper, ClusterState):
        source = ZooKeeperSource(zookeeper)
    else:
        source = ZooKeeperSource.connect(zookeeper, conf)
    try:
        return UIServer(source, conf, host, port)
    except BaseException:  # the ZooKeeper session goes with it; the error is re-raised
        source.close()
        raise


def __getattr__(name: str) -> Any:
    if name == "ZooKeeperSource":
        from spark_storm.ui.zookeeper import ZooKeeperSource

        return ZooKeeperSource
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
