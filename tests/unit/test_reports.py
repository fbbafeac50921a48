"""The records a worker reports (heartbeat, /health): one file name, one writer, parsers that name what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_storm.errors import ReportFormatError
from spark_storm.reports import (
    HEARTBEAT_FILE_NAME,
    HeartbeatFileWriter,
    WorkerHeartbeat,
    heartbeat_file_name,
    metrics_endpoint,
    parse_heartbeat,
    parse_worker_metrics,
    read_heartbeat_file,
)


def _record(**changes: object) -> WorkerHeartbeat:
    record: WorkerHeartbeat = {
        "topology": "wc-2",
        "worker": "10.0.0.1:6700",
        "pid": 42,
        "status": "running",
        "time": 1000.5,
        "uptime_s": 3.0,
        "executors": ["split[1-2]"],
        "received": 7,
        "metrics_port": 9000,
        "metrics_host": "0.0.0.0",
    }
    return {**record, **changes}  # type: ignore[typeddict-item]


def test_the_file_name_is_built_and_recognised_in_one_place(tmp_path: Path) -> None:
    assert heartbeat_file_name("wc-2", 6700) == "wc-2-6700.json"
    match = HEARTBEAT_FILE_NAME.match(heartbeat_file_name("wc-2", 6700))
    assert match is not None
    assert (match["topology"], match["port"]) == ("wc-2", "6700")
    assert HEARTBEAT_FILE_NAME.match("wc-2-6700.tmp") is None  # the writer's temporary file
    writer = HeartbeatFileWriter(tmp_path, "wc-2", 6700)
    writer.write(_record())
    assert writer.path == tmp_path / "wc-2-6700.json"
    assert read_heartbeat_file(writer.path) == _record()
    assert [p.name for p in tmp_path.iterdir()] == ["wc-2-6700.json"]  # replaced atomically, no leftover


def test_what_is_not_a_heartbeat_reads_as_none(tmp_path: Path) -> None:
    assert read_heartbeat_file(tmp_path / "gone-6700.json") is None
    (tmp_path / "list-1.json").write_text("[1, 2]")
    (tmp_path / "half-1.json").write_text('{"topology": "wc"')
    (tmp_path / "huge-1.json").write_bytes(b" " * (1 << 21))
    for name in ("list-1.json", "half-1.json", "huge-1.json"):
        assert read_heartbeat_file(tmp_path / name) is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nope", r"here is not a worker heartbeat: not JSON"),
        ("[1]", r"holds a JSON list, not an object"),
        (json.dumps({k: v for k, v in _record().items() if k != "pid"}), r"it has no 'pid'"),
        (json.dumps(_record(pid="42")), r"'pid' is '42', not int"),
        (json.dumps(_record(time=True)), r"'time' is True, not int or float"),
        (json.dumps(_record(metrics_host=5)), r"'metrics_host' is 5, not str"),
        (json.dumps(_record(worker="6700")), r"'worker' is '6700', not host:port"),
        (json.dumps(_record(assignment_version=None)), r"'assignment_version' is None, not int"),
    ],
)
def test_a_malformed_heartbeat_is_a_clear_error(text: str, match: str) -> None:
    with pytest.raises(ReportFormatError, match=match):
        parse_heartbeat(text, "here")


def test_a_heartbeat_may_carry_its_assignment_version_and_more() -> None:
    text = json.dumps({**_record(assignment_version=3), "from_a_newer_worker": 1})
    assert parse_heartbeat(text, "here")["assignment_version"] == 3
    assert parse_heartbeat(json.dumps(_record(metrics_port=None, metrics_host=None)), "here")["metrics_port"] is None


def test_the_metrics_endpoint_is_on_the_slots_host_unless_the_worker_names_one() -> None:
    assert metrics_endpoint(_record(), "10.0.0.1") == ("10.0.0.1", 9000)  # a wildcard bind
    assert metrics_endpoint(_record(metrics_host="127.0.0.1"), "10.0.0.1") == ("127.0.0.1", 9000)
    assert metrics_endpoint(_record(metrics_port=None, metrics_host=None), "10.0.0.1") is None


def test_a_health_reply_is_checked_for_what_every_reader_needs() -> None:
    ok = {"worker": "h:1", "topology": "t", "executors": {}, "active": True}
    assert parse_worker_metrics(json.dumps(ok), "GET x")["active"] is True
    with pytest.raises(ReportFormatError, match=r"GET x is not a worker's /health: 'executors' is None, not a dict"):
        parse_worker_metrics(json.dumps({"worker": "h:1", "topology": "t"}), "GET x")
    with pytest.raises(ReportFormatError, match=r"not JSON"):
        parse_worker_metrics(b"<html>", "GET x")


def test_the_records_module_sits_below_every_layer() -> None:
    code = (
        "import sys, spark_storm.reports;"
        "loaded = sorted(m for m in sys.modules if m.startswith('spark_storm.'));"
        "assert loaded == ['spark_storm.errors', 'spark_storm.reports'], loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
