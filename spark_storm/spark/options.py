"""Options of ``format("storm")`` and ``storm_sink``: parsed and validated on the driver.

Spark lower-cases option names, so they are matched case-insensitively.  Every error
names the option, the bad value and the fix, and is raised when the query starts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spark_storm.config import Config, load_config
from spark_storm.errors import ConfigError
from spark_storm.messaging.wire import ACCEPTED, PROCESSED
from spark_storm.plugins import closest, did_you_mean
from spark_storm.topology import Plan, Topology, load_topology, plan
from spark_storm.transport import TRANSPORT_ALIASES

__all__ = ["OPTION_NAMES", "StormOptions"]

logger = logging.getLogger(__name__)

OPTION_NAMES: Final = (
    "topology",
    "filter",
    "workers",
    "zookeeper",
    "assignmentWaitMs",
    "component",
    "taskColumn",
    "fields",
    "serializer",
    "transport",
    "delivery",
    "ackTimeoutMs",
    "maxRowsPerMessage",
    "conf",
    "queryId",
    "batchId",
)
DELIVERY: Final = {"none": 0, "accepted": ACCEPTED, "processed": PROCESSED}
#: Options Spark itself passes to every sink; not ours to validate.
SPARK_OWNED: Final = frozenset({"checkpointlocation", "path", "queryname", "mode", "__path"})


@dataclass(frozen=True)
class StormOptions:
    """Everything a writer task needs, picklable (the plan is computed on the driver)."""

    plan: Plan
    component: str
    tasks: tuple[int, ...]
    grouping: str
    key_columns: tuple[str, ...]
    task_column: str | None
    columns: tuple[str, ...]
    serializer: str
    delivery: int
    ack_timeout_s: float
    max_rows: int
    conf: Mapping[str, Any] = field(default_factory=dict)
    query_id: str | None = None
    batch_id: int | None = None
    zookeeper: str | None = None
    assignment_version: int = 0
    assignment_wait_s: float = 10.0

    @property
    def topology_id(self) -> str:
        return self.plan.topology.name

    def with_current_assignment(self, *, settle: bool = True) -> StormOptions:
        """Cluster mode: return a copy on the topology's current assignment, if it is newer (a retried task).

        ``settle``: first wait (up to ``assignmentWaitMs``) until every worker of a new
        assignment runs it, as the driver does for each micro-batch.
        """
        if self.zookeeper is None:
            return self
        from spark_storm.cluster.session import ZooKeeperAddress
        from spark_storm.spark.assignments import current_assignment

        address = ZooKeeperAddress.parse(self.zookeeper, self.conf)
        settle_s = self.assignment_wait_s if settle else 0.0
        _, assignment = current_assignment(address, self.topology_id, self.conf, settle_s=settle_s)
        if assignment.version <= self.assignment_version:
            return self
        import dataclasses

        return dataclasses.replace(
            self, plan=assignment.plan(self.plan.topology), assignment_version=assignment.version
        )

    def messaging_conf(self) -> Config:
        """Return the messaging configuration for the writer's connections."""
        return Config.of(dict(self.conf))

    @classmethod
    def parse(cls, options: Mapping[str, str], schema_names: list[str] | None = None) -> StormOptions:
        """Validate ``options`` (and the DataFrame's columns, when given).

        Raises
        ------
        ConfigError
            Naming the option, the value and what to do instead.
        """
        lower = {str(k).lower(): v for k, v in options.items()}
        known = {n.lower(): n for n in OPTION_NAMES}
        storm_keys = {k: v for k, v in options.items() if str(k).startswith(("storm.", "zmq.", "topology."))}
        for key in lower:
            if key not in known and key not in SPARK_OWNED and not key.startswith(("storm.", "zmq.", "topology.")):
                match = closest(key, known)
                hint = "" if match is None else f" Did you mean {known[match]!r}?"
                msg = f"unknown storm option {key!r}.{hint} Options: {', '.join(OPTION_NAMES)}, storm.* keys"
                raise ConfigError(msg)

        def get(name: str, default: str | None = None) -> str | None:
            value = lower.get(name.lower(), default)
            return None if value is None else str(value)

        topo_path = get("topology")
        zookeeper = get("zookeeper")
        if not topo_path:
            what = (
                "the submitted topology's name (e.g. wordcount)"
                if zookeeper
                else "the path of the topology YAML (e.g. conf/topologies/wordcount.yaml)"
            )
            msg = f"option 'topology' is required: {what}"
            raise ConfigError(msg)
        conf = _storm_conf(get("conf"), storm_keys, get("transport"))
        workers = get("workers")
        version = 0
        assignment_wait_s = _positive_int(get("assignmentWaitMs") or "10000", "assignmentWaitMs") / 1000
        if zookeeper is not None:
            if workers:
                msg = (
                    "options 'zookeeper' and 'workers' exclude each other: with 'zookeeper' the workers come from "
                    "the topology's current assignment; drop 'workers'"
                )
                raise ConfigError(msg)
            zookeeper, topology, the_plan, version = _from_zookeeper(zookeeper, topo_path, conf, assignment_wait_s)
        else:
            topology = load_topology(topo_path, get("filter"))
            the_plan = plan(topology, workers) if workers else plan(topology)
        sources = sorted(c.id for c in topology.sources)
        component_id = get("component") or (sources[0] if len(sources) == 1 else None)
        if component_id is None:
            msg = f"option 'component' is required: topology {topology.name!r} has sources {sources}"
            raise ConfigError(msg)
        comp = topology.component(component_id)
        if not comp.source:
            msg = (
                f"option 'component'={component_id!r} is not a source of {topology.name!r}; "
                f"Spark feeds a source component ({', '.join(sources)})"
            )
            raise ConfigError(msg)
        declared = list(comp.fields_of())
        task_column = get("taskColumn")
        fields_opt = get("fields")
        columns = [c.strip() for c in fields_opt.split(",") if c.strip()] if fields_opt else None
        if schema_names is not None:
            names = list(schema_names)
            if columns is None:
                columns = [n for n in names if n != task_column]
            missing = [c for c in columns if c not in names]
            if missing:
                msg = f"option 'fields' names columns {missing} that the DataFrame lacks (it has {names})"
                raise ConfigError(msg)
            lacking = [f for f in declared if f not in columns]
            if lacking:
                msg = (
                    f"component {component_id!r} declares fields {declared} but the rows sent lack {lacking}; "
                    f"select or alias those columns (sent: {columns})"
                )
                raise ConfigError(msg)
            if task_column and task_column not in names:
                msg = f"option 'taskColumn'={task_column!r} is not a column (columns: {names})"
                raise ConfigError(msg)
        serializer = (get("serializer") or "arrow").lower()
        if serializer not in ("arrow", "msgpack"):
            msg = f"option 'serializer'={serializer!r}: use 'arrow' (vectorised, default) or 'msgpack'"
            raise ConfigError(msg)
        delivery_name = (get("delivery") or "accepted").lower()
        if delivery_name not in DELIVERY:
            msg = f"option 'delivery'={delivery_name!r}: use none, accepted (default) or processed"
            raise ConfigError(msg)
        ack_ms = _positive_int(get("ackTimeoutMs") or "60000", "ackTimeoutMs")
        max_rows = _positive_int(get("maxRowsPerMessage") or "4096", "maxRowsPerMessage")
        batch_id = get("batchId")
        return cls(
            plan=the_plan,
            component=component_id,
            tasks=tuple(the_plan.component_tasks[component_id]),
            grouping=comp.grouping,
            key_columns=tuple(comp.grouping_fields),
            task_column=task_column,
            columns=tuple(columns or declared),
            serializer=serializer,
            delivery=DELIVERY[delivery_name],
            ack_timeout_s=ack_ms / 1000,
            max_rows=max_rows,
            conf=conf,
            query_id=get("queryId"),
            batch_id=int(batch_id) if batch_id is not None else None,
            zookeeper=zookeeper,
            assignment_version=version,
            assignment_wait_s=assignment_wait_s,
        )

    def with_ids(self, query_id: str | None, batch_id: int | None) -> StormOptions:
        """Return a copy that writes as (query_id, batch_id)."""
        import dataclasses

        return dataclasses.replace(self, query_id=query_id, batch_id=batch_id)


def _storm_conf(conf_path: str | None, storm_keys: dict[str, Any], transport: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = dict(load_config(conf_path, storm_keys) if conf_path else Config.of(storm_keys))
    if transport:
        if transport not in TRANSPORT_ALIASES and "." not in transport:
            hint = did_you_mean(transport, TRANSPORT_ALIASES)
            msg = f"option 'transport'={transport!r} is not a transport.{hint}"
            raise ConfigError(msg)
        conf["storm.messaging.transport"] = transport
    if conf.get("storm.messaging.transport") == "local":
        msg = "option 'transport'='local' cannot reach worker processes: use tcp (default) or zmq"
        raise ConfigError(msg)
    Config.of(conf)  # validates the storm.* keys
    return conf


def _from_zookeeper(spec: str, topology: str, conf: dict[str, Any], settle_s: float) -> tuple[str, Topology, Plan, int]:
    """Read the submitted topology and its current assignment: (address, topology, plan, version).

    ``topology`` is the submitted name, or a topology YAML whose name is used (the definition
    that counts is the submitted one: the workers run it).
    """
    from spark_storm.extras import require

    require("kazoo", "option 'zookeeper' (cluster mode)")
    from spark_storm.cluster.records import check_topology_name
    from spark_storm.cluster.session import ZooKeeperAddress
    from spark_storm.spark.assignments import current_assignment

    try:
        address = ZooKeeperAddress.parse(spec, conf)
    except ConfigError as exc:
        msg = f"option 'zookeeper'={spec!r}: {exc}"
        raise ConfigError(msg) from exc
    name = topology
    local: Topology | None = None
    if topology.endswith((".yaml", ".yml")) or "/" in topology or Path(topology).is_file():
        local = load_topology(topology)
        name = local.name
    check_topology_name(name)
    wait = Config.of(conf).get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000
    record, assignment = current_assignment(address, name, conf, wait_s=wait, settle_s=settle_s)
    submitted = record.topology()
    if local is not None and local != submitted:
        logger.warning(
            "option 'topology'=%r differs from the topology %r submitted to ZooKeeper %s; "
            "the submitted one is used (the workers run it)",
            topology,
            name,
            address,
        )
    return address.spec, submitted, assignment.plan(submitted), assignment.version


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        msg = f"option {name!r}={text!r} must be a positive integer"
        raise ConfigError(msg)
    return value


def new_write_id() -> str:
    """Return a fresh id for one batch (non-streaming) write; its groups are deduplicated under it."""
    return f"batch-write-{uuid.uuid4()}"
