"""The Spark side (the only layer importing pyspark): format("storm"), format("storm_state"), storm_sink, deploy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_storm.spark.connect import ServerPackageError, check_server, is_connect, ship
from spark_storm.spark.datasource import StormDataSource
from spark_storm.spark.foreach import StormForeachWriter, storm_foreach
from spark_storm.spark.options import StormOptions
from spark_storm.spark.sink import StormSink, storm_sink
from spark_storm.spark.state_source import StormStateDataSource

if TYPE_CHECKING:
    from spark_storm.spark.deployment import Deployment, DeploymentStatus, deploy

__all__ = [
    "Deployment",
    "DeploymentStatus",
    "ServerPackageError",
    "StormDataSource",
    "StormForeachWriter",
    "StormOptions",
    "StormSink",
    "StormStateDataSource",
    "check_server",
    "deploy",
    "is_connect",
    "register",
    "ship",
    "storm_foreach",
    "storm_sink",
]

#: deploy() runs ZooKeeper and nimbus (the ``cluster`` extra, kazoo): imported when first used, so
#: format("storm") and format("storm_state"), which Spark's Python workers import, need only ``spark``.
_DEPLOY_NAMES = frozenset({"Deployment", "DeploymentStatus", "deploy"})


def __getattr__(name: str) -> Any:
    if name not in _DEPLOY_NAMES:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    try:
        from spark_storm.spark import deployment
    except ModuleNotFoundError as exc:
        from spark_storm.extras import missing_extra

        error = missing_extra(exc, "spark_storm.spark.deploy()")
        if error is None:
            raise
        raise error from exc
    return getattr(deployment, name)


def register(spark: Any, *, check: bool = True) -> None:
    """Register ``format("storm")`` and ``read.format("storm_state")`` on ``spark``, a classic or a Connect session.

    Not needed when spark-storm was installed before Spark started, where Spark runs its
    Python workers: Spark finds the ``pyspark_storm`` and ``pyspark_storm_state`` modules by itself.  Needed after a
    ``%pip install`` into a running session, and for a copy shipped with :func:`ship`.

    On a Spark Connect session the data source is registered for that session on the
    server, and (``check``) one tiny job first checks that the server's Python workers can
    import spark-storm, the same version as this client.

    Raises
    ------
    ServerPackageError
        Spark Connect: the server's Python workers cannot import spark-storm (the message
        names their Python and the fixes: install it there, or ``ship(spark)``).
    """
    if check and is_connect(spark):
        check_server(spark)
    spark.dataSource.register(StormDataSource)
    spark.dataSource.register(StormStateDataSource)
