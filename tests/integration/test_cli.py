from __future__ import annotations

import os
import re
import shutil
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server is not installed: apt-get install redis-server (scripts/test does)",
)
def test_redis_start_status_stop_by_pid(tmp_path: Path) -> None:
    import redis

    state = str(tmp_path / "redis")
    started = _cli("redis", "start", "--dir", state)
    assert started.returncode == 0, started.stderr
    m = re.match(r"redis serving on 127\.0\.0\.1:(\d+) \(pid (\d+), .*url (redis://\S+)\)", started.stdout)
    assert m, started.stdout
    port, pid, url = int(m[1]), int(m[2]), m[3]
    try:
        assert (tmp_path / "redis" / "server.pid").read_text().strip() == str(pid)
        client = redis.Redis.from_url(url, socket_timeout=5)
        assert client.ping()
        assert client.set("k", b"v")
        assert client.get("k") == b"v"
        client.close()
        status = _cli("redis", "status", "--dir", state)
        assert (status.returncode, status.stdout.strip()) == (0, f"redis running: pid {pid} on 127.0.0.1:{port}")
        # the running server is not mistaken for a new one: another port from this dir, or this port from another
        again = _cli("redis", "start", "--dir", state, "--port", str(port + 1 if port < 65535 else port - 1))
        assert again.returncode == 2
        assert f"already serves on 127.0.0.1:{port}" in again.stderr
        other = _cli("redis", "start", "--dir", str(tmp_path / "other"), "--port", str(port))
        assert other.returncode == 2
        assert f"a Redis server already answers on 127.0.0.1:{port}" in other.stderr
        assert "Traceback" not in again.stderr + other.stderr
    finally:
        stopped = _cli("redis", "stop", "--dir", state)
    assert stopped.stdout.strip() == "redis stopped"
    assert not _pid_alive(pid)  # stopped by its PID: the process is gone, not just unreachable
    assert _cli("redis", "status", "--dir", state).returncode == 1
    assert _cli("redis", "stop", "--dir", state).stdout.strip() == "no redis was running"


def test_redis_not_installed_names_the_debian_package(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spark_storm.cli", "redis", "start", "--dir", str(tmp_path / "redis")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": str(tmp_path)},  # no redis-server on this PATH
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "spark-storm: redis-server is not installed: apt-get install redis-server (Debian's package)"
    )
