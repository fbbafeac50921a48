"""Topologies: components, groupings, Storm-style task assignment (no I/O, no pyspark)."""

from __future__ import annotations

from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot, parse_slots, plan
from spark_storm.topology.hashing import fields_hash
from spark_storm.topology.loader import load_topology, topology_from_dict
from spark_storm.topology.model import DEFAULT_STREAM, Component, Input, Topology, TopologyBuilder

__all__ = [
    "DEFAULT_STREAM",
    "Component",
    "ExecutorSpec",
    "Input",
    "Plan",
    "Slot",
    "Topology",
    "TopologyBuilder",
    "fields_hash",
    "load_topology",
    "parse_slots",
    "plan",
    "topology_from_dict",
]
