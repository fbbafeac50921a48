from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from spark_storm.config import Config, default_config, load_config
from spark_storm.errors import ConfigError
from spark_storm.worker.affinity import check_affinity, cpus_for
from spark_storm.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def test_conf_defaults_is_the_packaged_file() -> None:
    mirror = ROOT / "conf" / "defaults.yaml"
    packaged = ROOT / "spark_storm" / "defaults.yaml"
    assert mirror.read_bytes() == packaged.read_bytes()


def test_storm_yaml_and_code_overrides(tmp_path: Path) -> None:
    f = tmp_path / "storm.yaml"
    f.write_text("storm.messaging.transport: zmq\nzmq.threads: 2\n")
    conf = load_config(f, {"zmq.threads": 3})
    assert conf["storm.messaging.transport"] == "zmq"
    assert conf.get_int("zmq.threads") == 3
    assert conf.get_int("storm.messaging.tcp.min_wait_ms") == 100


def test_typo_in_an_owned_namespace_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"Did you mean 'storm\.messaging\.tcp\.min_wait_ms'"):
        Config.of({"storm.messaging.tcp.min_wiat_ms": 5})


def test_foreign_keys_pass_through_for_plugins() -> None:
    assert Config.of({"my.plugin.key": 1})["my.plugin.key"] == 1


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("zmq.threads", "many", "must be an integer, got 'many'"),
        ("zmq.threads", 0, "must be >= 1, got 0"),
        ("storm.local.mode.zmq", "perhaps", "must be true or false"),
        ("storm.messaging.send.overflow.policy", "explode", "must be one of block, drop"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object, match: str) -> None:
    conf = Config.of({key: value})
    getters: dict[str, Callable[[], object]] = {
        "storm.messaging.send.overflow.policy": lambda: conf.get_choice(key, ("block", "drop")),
        "storm.local.mode.zmq": lambda: conf.get_bool(key),
    }
    get = getters.get(key, lambda: conf.get_int(key, minimum=1))
    with pytest.raises(ConfigError, match=match):
        get()


def test_bad_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)


def test_secret_from_file_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "s"
    f.write_text("  hush \n")
    assert Config.of({"storm.messaging.auth.secret.file": str(f)}).auth_secret() == b"hush"
    assert default_config().auth_secret() is None
    with pytest.raises(ConfigError, match="cannot read"):
        Config.of({"storm.messaging.auth.secret.file": str(tmp_path / "nope")}).auth_secret()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        Config.of({"storm.messaging.auth.secret.file": str(tmp_path / "empty")}).auth_secret()
    assert "hush" not in repr(Config.of({"storm.messaging.auth.secret": "hush"}))


def test_the_defaults_file_names_each_key_once() -> None:
    """YAML lets a repeated key silently win over the first; a merge that doubled a block must fail here."""
    lines = (ROOT / "spark_storm" / "defaults.yaml").read_text().splitlines()
    keys = [line.split(":", 1)[0] for line in lines if line and not line.startswith(("#", " ")) and ":" in line]
    doubled = sorted({k for k in keys if keys.count(k) > 1})
    assert doubled == []


def test_cpu_affinity_values_and_the_cpu_each_slot_gets() -> None:
    assert check_affinity(None) is None
    assert check_affinity("slot") == "slot"
    assert check_affinity([3, 1, 3]) == (1, 3)
    for bad in ("fast", [], [-1], [True], 2, ["0"]):
        with pytest.raises(ConfigError, match=r"topology.worker.cpu.affinity.*null .* \"slot\""):
            check_affinity(bad)
    # "slot": the port's index among the host's ports, round-robin over the allowed CPUs
    ports = (6700, 6701, 6702)
    assert [cpus_for("slot", p, ports, {0, 1}) for p in ports] == [{0}, {1}, {0}]
    assert cpus_for("slot", 6701, ports, {2, 5, 7}) == {5}
    assert cpus_for("slot", 9000, ports, {0, 1}) == {1}  # a port its host list lacks sorts in with it
    assert cpus_for((0, 1), 6700, ports, {0, 1, 2}) == {0, 1}
    with pytest.raises(ConfigError, match=r"CPUs \[4\] are not available to this worker \(it may use \[0, 1\]\)"):
        cpus_for((1, 4), 6700, ports, {0, 1})
    conf = Config.of({"topology.worker.cpu.affinity": "slot", "supervisor.slots.ports": [7000, 7001]})
    settings = WorkerSettings.from_conf(conf)
    assert (settings.cpu_affinity, settings.host_ports) == ("slot", (7000, 7001))
    with pytest.raises(ConfigError, match=r"supervisor\.slots\.ports"):
        WorkerSettings.from_conf(Config.of({"topology.worker.cpu.affinity": "slot", "supervisor.slots.ports": "6700"}))
    assert WorkerSettings.from_conf(Config.of({"supervisor.slots.ports": "6700"})).host_ports == ()  # unread when off
