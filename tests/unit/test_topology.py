from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from spark_storm.errors import ConfigError
from spark_storm.topology import Input, Slot, TopologyBuilder, fields_hash, load_topology, parse_slots, plan
from spark_storm.topology.grouping import make_grouper
from spark_storm.topology.loader import topology_from_dict

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "conf" / "topologies" / "wordcount.yaml"


def test_spark_hash_values_match_pyspark() -> None:
    # Values read off pyspark 4.2.0: F.hash(lit(...)) and F.hash(col.cast("long")).
    from spark_storm.topology.hashing import murmur3_bytes, murmur3_int

    assert murmur3_int(0, 42) == 933211791  # F.hash(lit(0)) on an IntegerType
    assert fields_hash([None]) == 42
    assert fields_hash(["abc"]) == murmur3_bytes(b"abc", 42)
    assert fields_hash(["a", None]) == fields_hash(["a"])
    assert fields_hash([1]) != fields_hash(["1"])


@pytest.mark.parametrize(
    ("text", "spark_hash"),
    [  # F.hash(lit(text)) read off pyspark 4.2.0: UTF-8 lengths 1 to 5, where Spark's Murmur3 differs
        ("a", 1485273170),  # from the reference one in how it mixes the tail bytes (one per round)
        ("ab", -97053317),
        ("abc", 1322437556),
        ("abcd", -396302900),
        ("abcde", 814637928),
        ("é", 2119106806),
        ("€", -1809688618),
        ("😀", 1877935379),
        ("é€", -470537149),
        ("x😀", -1821035175),
    ],
)
def test_string_hashes_are_sparks_own_literal_values(text: str, spark_hash: int) -> None:
    assert fields_hash([text]) == spark_hash


def test_multi_column_and_long_hashes_are_sparks_own_literal_values() -> None:
    assert fields_hash(["a", "bc"]) == 204370463  # F.hash(lit("a"), lit("bc"))
    assert fields_hash([7]) == 1293116811  # F.hash(lit(7).cast("long"))


def test_task_ids_executors_and_slots_are_storms() -> None:
    topo = load_topology(WORDCOUNT)
    p = plan(topo, "127.0.0.1:6701,127.0.0.1:6700")
    assert p.component_tasks == {
        "count": range(1, 5),
        "report": range(5, 6),
        "sentences": range(6, 8),
        "split": range(8, 12),
    }
    assert [str(e) for e in p.executors] == [
        "count[1-2]",
        "count[3-4]",
        "report[5-5]",
        "sentences[6-6]",
        "sentences[7-7]",
        "split[8-9]",
        "split[10-11]",
    ]
    assert p.slots == (Slot("127.0.0.1", 6700), Slot("127.0.0.1", 6701))
    assert p.executor_slot[p.executors[0]] == Slot("127.0.0.1", 6700)
    assert p.executor_slot[p.executors[1]] == Slot("127.0.0.1", 6701)
    assert plan(topo, "127.0.0.1:6700,127.0.0.1:6701") == p  # order of the list does not matter


def test_uneven_split_puts_the_extra_task_first() -> None:
    topo = TopologyBuilder("t").source("s", ["x"], parallelism=3, tasks=7).build()
    p = plan(topo, "h:1")
    assert [(e.first, e.last) for e in p.executors] == [(1, 3), (4, 5), (6, 7)]


def test_builder_and_yaml_agree() -> None:
    built = (
        TopologyBuilder("wordcount")
        .source("sentences", ["sentence"], parallelism=2)
        .bolt("split", "spark_storm.examples.wordcount:SplitBolt", [Input("sentences")], ["word"], 2, 4)
        .bolt(
            "count",
            "spark_storm.examples.wordcount:CountBolt",
            [Input("split", "fields", fields=("word",))],
            ["word", "count"],
            2,
            4,
        )
        .bolt("report", "spark_storm.examples.wordcount:ReportBolt", [Input("count", "global")])
        .build()
    )
    loaded = load_topology(WORDCOUNT)
    assert plan(built, "h:1,h:2").executors == plan(loaded, "h:1,h:2").executors


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"name": "t", "components": []}, "has no components"),
        ({"name": "t", "components": [{"id": "a"}]}, "has no inputs"),
        (
            {"name": "t", "components": [{"id": "a", "source": True, "fields": ["x"], "parallelism": 0}]},
            "parallelism must be >= 1",
        ),
        (
            {
                "name": "t",
                "components": [
                    {"id": "a", "source": True, "fields": ["x"]},
                    {"id": "b", "bolt": "x:Y", "inputs": [{"from": "aa"}]},
                ],
            },
            "did you mean 'a'",
        ),
        (
            {
                "name": "t",
                "components": [
                    {"id": "a", "source": True, "fields": ["x"]},
                    {"id": "b", "bolt": "x:Y", "inputs": [{"from": "a", "grouping": "feilds"}]},
                ],
            },
            "Did you mean 'fields'",
        ),
        (
            {
                "name": "t",
                "components": [
                    {"id": "a", "source": True, "fields": ["x"]},
                    {
                        "id": "b",
                        "bolt": "x:Y",
                        "inputs": [{"from": "a", "grouping": "fields", "fields": ["y"]}],
                    },
                ],
            },
            r"groups on \['y'\]",
        ),
        (
            {"name": "t", "components": [{"id": "a", "source": True, "fields": ["x"], "paralelism": 2}]},
            "Did you mean 'parallelism'",
        ),
    ],
)
def test_bad_topologies_name_the_problem(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        topology_from_dict(data)


@pytest.mark.parametrize("spec", ["nohost", "h:0", "h:abc", "h:1,h:1"])
def test_bad_slots(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_slots(spec)


def test_groupings_choose_as_documented() -> None:
    topo = load_topology(WORDCOUNT)
    split, count = topo.components["split"], topo.components["count"]
    targets = [1, 2, 3, 4]
    fields = make_grouper(count.inputs[0], split, targets)
    seen: dict[str, set[int]] = {}
    for i in range(500):
        word = f"w{i % 37}"
        seen.setdefault(word, set()).update(fields.choose([word]))
    assert all(len(v) == 1 for v in seen.values())
    assert fields.choose(["w5"]) == [targets[fields_hash(["w5"]) % 4]]
    shuffle = make_grouper(Input("split", "shuffle"), split, targets, rng=random.Random(1))
    spread = Counter(t for _ in range(400) for t in shuffle.choose(["x"]))
    assert set(spread.values()) == {100}
    assert make_grouper(Input("split", "all"), split, targets).choose(["x"]) == targets
    assert make_grouper(Input("split", "global"), split, targets).choose(["x"]) == [1]
    local = make_grouper(Input("split", "local_or_shuffle"), split, targets, local_tasks=[3])
    assert {t for _ in range(10) for t in local.choose(["x"])} == {3}
    loads = {1: 0.9, 2: 0.0, 3: 0.9, 4: 0.9}
    aware = make_grouper(
        Input("split", "load_aware"),
        split,
        targets,
        load=lambda ts: {t: loads[t] for t in ts},
        rng=random.Random(3),
    )
    picks = Counter(t for _ in range(600) for t in aware.choose(["x"]))
    assert picks[2] == max(picks.values())
    with pytest.raises(ConfigError, match="emit_direct"):
        make_grouper(Input("split", "direct"), split, targets).choose(["x"])


def test_topology_plan_cli() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_storm.cli",
            "topology",
            "plan",
            str(WORDCOUNT),
            "--workers",
            "127.0.0.1:6700,127.0.0.1:6701",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "topology wordcount: 11 tasks, 7 executors, 2 workers" in out
    assert "worker 127.0.0.1:6700: count[1-2], report[5-5], sentences[7-7], split[10-11]" in out
    # the table's columns line up, whatever the longest name (" (source)" pushed its row right before)
    table = [line for line in out.splitlines()[1:] if not line.startswith("worker ")]
    assert table[0].startswith("component ")
    assert "sentences (source)  6..7 " in out
    assert len({line.index("  ", len("sentences (source)")) for line in table}) == 1
    assert len({line.index("[") if "[" in line else line.index("executors") for line in table}) == 1
