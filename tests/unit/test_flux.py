"""Storm Flux files read into topologies (no processes): Storm's own examples, substitution, includes, bad files."""

from __future__ import annotations

import contextlib
import io
import textwrap
from pathlib import Path

import pytest
import yaml

from spark_storm.cli import main
from spark_storm.errors import ConfigError
from spark_storm.topology import load_topology, plan, topology_from_dict
from spark_storm.topology.flux import read_properties, substitute
from spark_storm.topology.model import MULTILANG_COMMAND, MULTILANG_DIR, SHELL_BOLT, SHELL_SPOUT, topology_to_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "flux"


def _flux(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name", ["multilang.yaml", "shell_test.yaml"])
def test_storms_multilang_examples_become_multilang_children(name: str) -> None:
    topo = load_topology(DATA / name)
    assert topo.name == "shell-topology"
    spout, split = topo.components["sentence-spout"], topo.components["splitsentence"]
    assert (spout.spout, spout.bolt, spout.conf[MULTILANG_COMMAND]) == (
        True,
        SHELL_SPOUT,
        ["node", "randomsentence.js"],
    )
    assert (split.bolt, split.conf[MULTILANG_COMMAND], split.outputs) == (
        SHELL_BOLT,
        ["python3", "splitsentence.py"],
        {"default": ("word",)},
    )
    count = topo.components["count"]
    assert count.bolt == "spark_storm.examples.storm_testing:TestWordCounter"
    assert [(i.component, i.grouping, i.fields) for i in count.inputs] == [("splitsentence", "fields", ("word",))]
    assert topo.conf["topology.workers"] == 1
    assert topo.conf[MULTILANG_DIR] == str(DATA)  # the child runs next to the file
    assert any("FluxShellBolt -> multilang child `python3 splitsentence.py`" in n for n in topo.notes)
    if name == "shell_test.yaml":  # configMethods addComponentConfig
        assert split.conf["rabbitmq.configfile"] == "etc/rabbit.yml"
        assert split.conf["publisher.data_paths"] == ["actions"]


def test_storms_simple_wordcount_runs_on_python_equivalents() -> None:
    topo = load_topology(DATA / "simple_wordcount.yaml")
    assert topo.components["spout-1"].spout
    assert topo.components["spout-1"].bolt == "spark_storm.examples.storm_testing:TestWordSpout"
    assert topo.components["bolt-2"].bolt == "spark_storm.examples.storm_testing:LogInfoBolt"
    assert plan(topo, "127.0.0.1:6700").executors  # plannable


def test_storm_starter_wordcount_with_spark_as_the_spout() -> None:
    topo = load_topology(DATA / "storm_starter_wordcount.yaml")
    spout = topo.components["spout"]
    assert (spout.source, spout.spout, spout.outputs, spout.parallelism) == (True, False, {"default": ("sentence",)}, 5)
    assert [c.id for c in topo.sources] == ["spout"]
    assert topo.components["split"].parallelism == 8
    assert "topology.spark.sources" not in topo.conf
    assert any("a source fed by Spark" in n for n in topo.notes)


def test_kafka_spout_names_the_class_and_the_ways_to_map_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_topology(DATA / "kafka_spout.yaml")
    text = str(err.value)
    assert "spouts[0] (kafka-spout) (line 63)" in text
    assert "'org.apache.storm.kafka.spout.KafkaSpout'" in text
    assert "topology.spark.sources" in text
    assert "FluxShellSpout" in text
    assert "python:pkg.mod:Class" in text
    # the user's one-line mapping: Spark's Kafka source replaces the KafkaSpout
    mapped = (
        (DATA / "kafka_spout.yaml")
        .read_text()
        .replace(
            "config:\n  topology.workers: 1",
            "config:\n  topology.workers: 1\n  topology.spark.sources: {kafka-spout: [value]}",
        )
    )
    topo = load_topology(_flux(tmp_path, mapped))
    assert topo.components["kafka-spout"].source
    assert topo.components["splitsentence"].inputs[0].component == "kafka-spout"


def test_java_bolt_error_and_the_class_map(tmp_path: Path) -> None:
    text = """\
        name: t
        config: {topology.spark.sources: [s]}
        spouts:
          - {id: s, className: org.x.Spout}
        bolts:
          - {id: b, className: org.example.MyBolt}
        streams:
          - {from: s, to: b, grouping: {type: SHUFFLE}}
        """
    with pytest.raises(
        ConfigError, match=r"bolts\[0\] \(b\) \(line 6\): bolt 'b' names the Java class 'org.example.MyBolt'"
    ):
        load_topology(_flux(tmp_path, text))
    mapped = text.replace(
        "config: {",
        "config: {topology.flux.classes: {org.example.MyBolt: 'python:tests.integration.bolts:RecordingBolt'}, ",
    )
    topo = load_topology(_flux(tmp_path, mapped))
    assert topo.components["b"].bolt == "tests.integration.bolts:RecordingBolt"


def test_substitution_with_storms_test_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/opt/bin:/usr/bin")
    topo = load_topology(DATA / "substitution-test.yaml", DATA / "test.properties")
    assert topo.name == "substitution-topology"
    assert topo.conf["test.env.value"] == "/opt/bin:/usr/bin"
    assert topo.conf["list.property.target"] == ["A string list"]
    assert topo.conf["list.element.property.target"] == "A string list"


def test_unresolved_substitutions_name_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        ConfigError, match=r"substitution-test.yaml line 22: \$\{topology.name\} is not resolved: no properties file"
    ):
        load_topology(DATA / "substitution-test.yaml")
    props = _flux(tmp_path, "topology.nam = x\n", "p.properties")
    with pytest.raises(
        ConfigError, match=r"line 22: \$\{topology.name\} .* does not define it; did you mean 'topology.nam'"
    ):
        load_topology(DATA / "substitution-test.yaml", props)
    monkeypatch.delenv("NO_SUCH_VAR_HERE", raising=False)
    with pytest.raises(
        ConfigError, match=r"x line 2: \$\{ENV-NO_SUCH_VAR_HERE\}: environment variable 'NO_SUCH_VAR_HERE' is not set"
    ):
        substitute("# ${ignored in comments}\nname: ${ENV-NO_SUCH_VAR_HERE}\n", {}, "x")


def test_properties_files_as_java_reads_them(tmp_path: Path) -> None:
    path = _flux(
        tmp_path, "# c\n! c\na.b = 1\nc: two words\nd three\nlong = x \\\n    y\nesc\\=key = \\u0041\n", "p.properties"
    )
    assert read_properties(path) == {"a.b": "1", "c": "two words", "d": "three", "long": "x y", "esc=key": "A"}


def test_includes_resources_from_the_classpath_like_tree() -> None:
    topo = load_topology(DATA / "configs" / "include_test.yaml")
    assert topo.name == "include-topology"  # override: false keeps the includer's name
    assert sorted(topo.components) == ["count", "log", "sentence-spout", "splitsentence"]


def test_includes_override_rules(tmp_path: Path) -> None:
    _flux(
        tmp_path,
        """\
        name: base
        config: {topology.workers: 3, a: 1}
        spouts: [{id: s, className: "python:tests.integration.bolts:NoSuchSpout", outputs: [x]}]
        streams: [{from: s, to: b, grouping: {type: SHUFFLE}}]
        """,
        "base.yaml",
    )
    main_file = _flux(
        tmp_path,
        """\
        name: mine
        includes: [{file: base.yaml, override: false}]
        config: {topology.workers: 1}
        bolts: [{id: b, className: "python:tests.integration.bolts:RecordingBolt", outputs: []}]
        """,
    )
    topo = load_topology(main_file)
    assert (topo.name, topo.conf["topology.workers"], topo.conf["a"]) == ("mine", 1, 1)
    assert topo.components["b"].inputs[0].component == "s"


def test_every_grouping_parallelism_and_tasks(tmp_path: Path) -> None:
    path = _flux(
        tmp_path,
        """\
        name: g
        config: {topology.spark.sources: {s: [k, v]}}
        spouts: [{id: s, className: org.x.Spout, parallelism: 2}]
        bolts:
          - {id: b, className: "python:tests.integration.bolts:RecordingBolt", parallelism: 2, numTasks: 4, outputs: {default: [k, v], other: [k]}}
          - {id: c, className: "python:tests.integration.bolts:RecordingBolt", outputs: []}
        streams:
          - {from: s, to: b, grouping: {type: SHUFFLE}}
          - {from: s, to: c, grouping: {type: FIELDS, args: [k]}}
          - {from: b, to: c, grouping: {type: ALL}}
          - {from: b, to: c, grouping: {type: GLOBAL, streamId: other}}
          - {from: b, to: c, grouping: {type: NONE}}
          - {from: b, to: c, grouping: {type: LOCAL_OR_SHUFFLE}}
          - {from: b, to: c, grouping: {type: DIRECT}}
          - {from: b, to: c, grouping: {type: CUSTOM, customClass: {className: "python:tests.unit.test_flux:EveryOther", constructorArgs: [2]}}}
        """,
    )
    topo = load_topology(path)
    b, c = topo.components["b"], topo.components["c"]
    assert (b.parallelism, b.tasks) == (2, 4)
    assert [(i.component, i.grouping, i.stream, i.fields) for i in c.inputs] == [
        ("s", "fields", "default", ("k",)),
        ("b", "all", "default", ()),
        ("b", "global", "other", ()),
        ("b", "none", "default", ()),
        ("b", "local_or_shuffle", "default", ()),
        ("b", "direct", "default", ()),
        ("b", "custom", "default", ()),
    ]
    assert (c.inputs[-1].custom, c.inputs[-1].custom_args) == ("tests.unit.test_flux:EveryOther", (2,))
    # the custom grouping runs as Storm's CustomStreamGrouping would
    from spark_storm.topology.grouping import make_grouper

    grouper = make_grouper(c.inputs[-1], b, [7, 8, 9])
    assert grouper.choose([1]) == [8]
    assert grouper.choose([0]) == [7]
    # the converted topology round-trips through our own YAML form (what `submit` stores)
    again = topology_from_dict(yaml.safe_load(yaml.safe_dump(topology_to_dict(topo))), "stored")
    assert again == topo


from spark_storm.topology.grouping import CustomStreamGrouping  # noqa: E402 - the class the test above names


class EveryOther(CustomStreamGrouping):
    def __init__(self, step: int) -> None:
        self.step = step

    def choose_tasks(self, values):
        return [self.target_tasks[int(values[0]) % self.step]]


def test_python_classes_take_flux_constructor_args(tmp_path: Path) -> None:
    path = _flux(
        tmp_path,
        """\
        name: p
        spouts:
          - id: s
            className: "python:spark_storm.examples.storm_testing:TestWordSpout"
            constructorArgs: []
            configMethods: [{name: open_later, args: [1, "a"]}]
            properties: [{name: speed, value: 3}]
            outputs: [word]
        bolts:
          - {id: b, className: "python:spark_storm.examples.storm_testing:TestWordCounter", constructorArgs: [{ref: x}]}
        streams: [{from: s, to: b, grouping: {type: SHUFFLE}}]
        """,
    )
    with pytest.raises(
        ConfigError, match=r"bolts\[0\] \(b\) \(line 10\): constructorArgs: references to Flux 'components'"
    ):
        load_topology(path)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "name: t\nconfig: {topology.spark.sources: [s]}\nspouts: [{id: s, className: org.x.S}]\nbolts: []\nstreams:\n"
            "  - from: s\n    to: b\n    grouping: {type: SHUFLE}\n",
            r"t.yaml: streams\[0\] \(line 6\): 'to: b' names no spout or bolt",
        ),
        (
            "name: t\nconfig: {topology.spark.sources: [s]}\nspouts: [{id: s, className: org.x.S}]\n"
            "bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]\n"
            "streams:\n  - from: s\n    to: b\n    grouping:\n      type: SHUFLE\n",
            r"streams\[0\] \(line 6\).grouping \(line 9\): unknown grouping type 'SHUFLE'. Did you mean 'SHUFFLE'\?",
        ),
        (
            "name: t\nconfig: {topology.spark.sources: [s]}\nspouts: [{id: s, className: org.x.S}]\n"
            "bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]\n"
            "streams:\n  - {from: s, to: bb, grouping: {type: SHUFFLE}}\n",
            r"streams\[0\] \(line 6\): 'to: bb' names no spout or bolt; did you mean 'b'\?",
        ),
        (
            "name: t\nconfig: {topology.spark.sources: [s]}\nspouts: [{id: s, className: org.x.S}]\n"
            "bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]\n"
            "streams:\n  - {from: s, to: b, grouping: {type: FIELDS, args: [word]}}\n",
            r"FIELDS groups on \['word'\] but 's' stream 'default' has fields \[\] \(declare them: config topology.spark.sources",
        ),
        ("name: t\ntopologySource: {className: org.x.Source}\n", r"'topologySource' asks a Java class"),
        ("spouts: []\nbolts: []\n", r"'name' is missing"),
        ("name: t\nspoutz: []\nbolts: []\n", r"unknown top-level key 'spoutz'. Did you mean 'spouts'\?"),
        (
            "name: t\nbolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt, paralelism: 2}]\n",
            r"unknown key 'paralelism'. Did you mean 'parallelism'\?",
        ),
        (
            "name: t\nspouts:\n  - id: s\n    className: org.apache.storm.flux.wrappers.spouts.FluxShellSpout\n    constructorArgs: [python3 x.py]\n"
            "bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]\nstreams: [{from: s, to: b, grouping: {type: SHUFFLE}}]\n",
            r"'s' declares no stream 'default'",
        ),
        (
            "name: t\nincludes: [{file: nowhere.yaml}]\nbolts: []\n",
            r"includes\[0\] \(line 2\): included file 'nowhere.yaml' not found",
        ),
        ("name: t\nbolts: [{id: b\n", r"is not valid YAML"),
        (
            "name: t\nconfig: {topology.spark.sources: [s]}\nspouts: [{id: s, className: org.x.S}]\n"
            "bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]\n",
            r"bolt 'b' gets no stream",
        ),
    ],
    ids=[
        "missing-component",
        "unknown-grouping",
        "typo-in-to",
        "fields-of-spark-source",
        "topology-source",
        "no-name",
        "top-key",
        "def-key",
        "shell-no-fields",
        "include",
        "yaml",
        "no-stream",
    ],
)
def test_bad_flux_files_name_the_line_or_key(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_topology(_flux(tmp_path, text))


def test_plan_shows_what_became_what(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["topology", "plan", str(DATA / "multilang.yaml"), "--workers", "127.0.0.1:6700"]) == 0
    text = out.getvalue()
    assert "is a Flux file; converted:" in text
    assert "spout 'sentence-spout': FluxShellSpout -> multilang child `node randomsentence.js`" in text
    assert "TestWordCounter -> its Python equivalent" in text
    assert "splitsentence" in text.split("converted:")[1]


def test_storm_jvm_settings_are_dropped_with_a_note(tmp_path: Path) -> None:
    topo = load_topology(
        _flux(
            tmp_path,
            """\
            name: t
            config: {topology.worker.childopts: "-Xmx2g", topology.workers: 2}
            spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
            bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
            streams: [{from: s, to: b, grouping: {type: SHUFFLE}}]
            """,
        )
    )
    assert "topology.worker.childopts" not in topo.conf
    assert any("topology.worker.childopts" in n and "dropped" in n for n in topo.notes)


class Greeter:
    """A Python component Flux builds with constructorArgs, properties and configMethods."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.calls: list[tuple[str, int]] = []
        self.loud = False

    def set_loud(self, value: bool) -> None:
        self.loud = value

    def with_name(self, name: str, times: int) -> None:
        self.calls.append((name, times))


def test_flux_construct_args_build_the_python_class(tmp_path: Path) -> None:
    from spark_storm.shell import adapt_class, is_pystorm_class
    from spark_storm.topology.model import Component

    path = _flux(
        tmp_path,
        """\
        name: c
        config: {topology.spark.sources: [s]}
        spouts: [{id: s, className: org.x.S}]
        bolts:
          - id: b
            className: "python:tests.unit.test_flux:Greeter"
            outputs: []
            constructorArgs: ["hello"]
            properties: [{name: loud, value: true}, {name: extra, value: 7}]
            configMethods: [{name: with_name, args: ["storm", 2]}]
        streams: [{from: s, to: b, grouping: {type: SHUFFLE}}]
        """,
    )
    component = load_topology(path).components["b"]
    built = adapt_class(component, Greeter)()  # what an executor does: no arguments
    assert (built.greeting, built.loud, built.extra, built.calls) == ("hello", True, 7, [("storm", 2)])
    assert adapt_class(Component("x", inputs=()), Greeter) is Greeter  # nothing to construct: the class itself

    from tests.integration.pystorm_bolts import EchoBolt

    assert is_pystorm_class(EchoBolt, "Bolt")
    assert not is_pystorm_class(Greeter, "Bolt")
    assert adapt_class(component, EchoBolt).__name__ == "InProcessEchoBolt"
