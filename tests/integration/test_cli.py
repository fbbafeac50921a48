from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_storm.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_demo_round_trip_between_two_processes(transport: str) -> None:
    out = _cli("transport-demo", "--transport", transport, "--messages", "20000", "--batch", "500")
    assert out.returncode == 0, out.stderr
    assert "sent == received: OK" in out.stdout
    assert "received 20,000" in out.stdout


def test_config_shows_defaults_and_overrides_and_hides_secrets(tmp_path: Path) -> None:
    conf = tmp_path / "storm.yaml"
    conf.write_text("storm.messaging.transport: zmq\nstorm.messaging.auth.secret: hush\n")
    out = _cli("config", "--conf", str(conf))
    assert out.returncode == 0, out.stderr
    assert "storm.messaging.transport: zmq" in out.stdout
    assert "storm.messaging.tcp.min_wait_ms: 100" in out.stdout
    assert "hush" not in out.stdout


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    conf = tmp_path / "storm.yaml"
    conf.write_text("storm.messaging.tcp.min_wiat_ms: 5\n")
    out = _cli("config", "--conf", str(conf))
    assert out.returncode == 2
    assert "Did you mean 'storm.messaging.tcp.min_wait_ms'" in out.stderr
    assert "Traceback" not in out.stderr
