"""What the ``jobs/`` scripts share: the source component, the storm writer, running a query, main()."""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.topology import load_topology

__all__ = [
    "add_job_arguments",
    "cut_batch",
    "describe_target",
    "finish_cut_batch",
    "input_rows",
    "job_main",
    "run_query",
    "source_component",
    "stop_between_batches",
    "storm_writer",
    "target_options",
]

logger = logging.getLogger(__name__)


def add_job_arguments(parser: argparse.ArgumentParser, *, storm: bool, checkpoint_required: bool = False) -> None:
    """Add the options every job has: run length, checkpoint, jars; with ``storm``, the target topology."""
    if storm:
        parser.add_argument("--topology", required=True, help="topology YAML")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--workers", help="worker slots host:port,... (static mode)")
        target.add_argument(
            "--zookeeper", help="HOST:PORT[/chroot] of a cluster the topology was submitted to (cluster mode)"
        )
        parser.add_argument("--component", help="source component to feed (default: the topology's only source)")
        parser.add_argument("--delivery", default="processed", choices=["none", "accepted", "processed"])
        parser.add_argument("--storm-conf", help="a storm.yaml for the connections (e.g. the auth secret file)")
    parser.add_argument("--available-now", action="store_true", help="process what the source holds now, then stop")
    parser.add_argument("--seconds", type=float, default=0.0, help="without --available-now: stop after (0 = never)")
    if checkpoint_required:
        parser.add_argument("--checkpoint", required=True, help="checkpoint dir (keep it: it is the job's progress)")
    else:
        parser.add_argument("--checkpoint", help="checkpoint dir (default: a temp dir; give one to resume)")
    parser.add_argument("--jars-dir", default="jars/spark", help="connector jars for a plain python run")


def source_component(topology_path: str, component: str | None) -> tuple[str, list[str]]:
    """Return the source component to feed (the only one when ``component`` is None) and its fields.

    Raises
    ------
    ConfigError
        ``component`` is not a source of the topology, or it has several and none was named.
    """
    topology = load_topology(topology_path)
    sources = sorted(c.id for c in topology.components.values() if c.source)
    chosen = component or (sources[0] if len(sources) == 1 else None)
    if chosen not in sources:
        msg = f"--component must be one of the sources {sources} of {topology_path}, got {component!r}"
        raise ConfigError(msg)
    return chosen, list(topology.components[chosen].fields_of())


def storm_writer(df: Any, args: argparse.Namespace, component: str, checkpoint_prefix: str) -> Any:
    """``df.writeStream.format("storm")`` with the jobs' common options.

    Uses ``args.topology``, ``args.workers`` or ``args.zookeeper``, ``args.delivery``,
    ``args.storm_conf`` and ``args.checkpoint`` (a temp dir named after ``checkpoint_prefix`` when None).
    """
    return (
        df.writeStream.format("storm")
        .option("topology", args.topology)
        .options(**target_options(args))
        .option("component", component)
        .option("delivery", args.delivery)
        .options(**({"conf": args.storm_conf} if args.storm_conf else {}))
        .option("checkpointLocation", args.checkpoint or tempfile.mkdtemp(prefix=checkpoint_prefix))
    )


def target_options(args: argparse.Namespace) -> dict[str, str]:
    """``{"workers": ...}`` or ``{"zookeeper": ...}``: where the job's rows go."""
    zookeeper = getattr(args, "zookeeper", None)
    return {"zookeeper": zookeeper} if zookeeper else {"workers": args.workers}


def describe_target(args: argparse.Namespace) -> str:
    """Return the job's target for its closing line (the slots, or the cluster)."""
    zookeeper = getattr(args, "zookeeper", None)
    return f"the cluster at {zookeeper}" if zookeeper else str(args.workers)


def job_main(
    app: str,
    args: argparse.Namespace,
    run: Callable[[Any, argparse.Namespace], int],
    *,
    kafka: bool = False,
    delta: bool = False,
) -> int:
    """Run a job's ``run(spark, args)`` on its session (see ``job_session``) and stop the session.

    Returns what ``run`` returned (rows); its exceptions propagate, so spark-submit shows
    them and exits non-zero.
    """
    from spark_storm.spark.session import job_session

    spark = job_session(app, args.jars_dir, kafka=kafka, delta=delta)
    try:
        return run(spark, args)
    finally:
        spark.stop()


def input_rows(progress: Mapping[str, Any]) -> int:
    """Return a micro-batch's input rows, from the progress of a classic or a Spark Connect query.

    Over Spark Connect the progress carries the rows per source only, so
    ``progress["numInputRows"]`` is None there; the ``numInputRows`` property sums the sources.
    """
    rows = getattr(progress, "numInputRows", None)
    if rows is None:
        rows = progress.get("numInputRows")
    return int(rows or 0)


def stop_between_batches(query: Any, timeout_s: float = 30.0, checkpoint: str | Path | None = None) -> bool:
    """Stop ``query`` when no micro-batch is running, waiting up to ``timeout_s`` for one to end.

    Returns False when the stop cut a batch: one still ran at the deadline (a trigger interval
    shorter than the batches, say), or, with the query's local ``checkpoint`` directory, one
    began between the last look at the query and the stop (while batches run behind their
    trigger the next one starts at once).  Spark aborts that batch.
    """
    deadline = time.monotonic() + timeout_s
    while query.status.get("isTriggerActive"):
        if time.monotonic() > deadline:
            logger.warning(
                "query %s: a micro-batch still ran after %.0fs; stopping it in the batch", query.id, timeout_s
            )
            query.stop()
            return False
        time.sleep(0.01)
    query.stop()
    cut = None if checkpoint is None else cut_batch(checkpoint)
    if cut is not None:
        logger.warning("query %s: micro-batch %d began just before the stop, which cut it", query.id, cut)
        return False
    return True


def cut_batch(checkpoint: str | Path) -> int | None:
    """Return the micro-batch a stopped query began and did not finish, from its local checkpoint; else None.

    Spark logs a batch's offsets (``offsets/N``) when the batch begins and its commit
    (``commits/N``) when it ends.
    """

    def logged(part: str) -> set[int]:
        folder = Path(checkpoint) / part
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()

    begun = logged("offsets")
    if not begun or max(begun) <= max(logged("commits"), default=-1):
        return None
    return max(begun)


def finish_cut_batch(start_again: Callable[[], Any], timeout_s: float = 300.0) -> Any | None:
    """Finish the micro-batch a stop cut: ``start_again`` starts the same query with an ``availableNow`` trigger.

    While every micro-batch runs behind its trigger (a loaded machine) there is no moment
    between two of them, and :func:`stop_between_batches` cuts one: its rows may have reached
    the workers without Spark counting them.  Started again from its checkpoint, Spark runs
    that batch to its end (the workers ack the groups they logged already, once; a source
    without availableNow support, like the rate source, gets that one batch) and stops.
    Returns the finished query, whose progress holds the cut batch, or None when it did not
    finish within ``timeout_s`` or failed.
    """
    query = start_again()
    try:
        finished = bool(query.awaitTermination(timeout_s)) and query.exception() is None
    except Exception as exc:  # the query failed: Spark's StreamingQueryException, whatever its class
        logger.warning("query %s did not finish the micro-batch its stop cut: %s", query.id, exc)
        finished = False
    query.stop()
    return query if finished else None


def _log_progress(progress: dict[str, Any]) -> None:
    logger.info("batch %s: %s rows", progress["batchId"], input_rows(progress))


def run_query(
    writer: Any,
    available_now: bool,
    seconds: float,
    on_progress: Callable[[dict[str, Any]], None] = _log_progress,
) -> int:
    """Start ``writer`` (a DataStreamWriter) and run it to its end; return the input rows.

    ``available_now``: process what the source holds now, then stop.  Otherwise run until
    ``seconds`` passed (0 = until the query stops), stopping between micro-batches.
    ``on_progress`` gets each micro-batch's progress that had input rows (default: logged).

    Raises
    ------
    pyspark.errors.StreamingQueryException
        The query failed (after Spark's own task retries).
    """
    query = writer.trigger(availableNow=True).start() if available_now else writer.start()
    started = time.monotonic()
    seen = -1
    while query.isActive:
        if not available_now and seconds and time.monotonic() - started > seconds:
            stop_between_batches(query)
            break
        query.awaitTermination(1)
        progress = query.lastProgress
        if progress and progress["batchId"] != seen and input_rows(progress):
            seen = progress["batchId"]
            on_progress(progress)
    error = query.exception()
    if error is not None:
        raise error
    return sum(input_rows(p) for p in query.recentProgress)
