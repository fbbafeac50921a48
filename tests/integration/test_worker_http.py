"""A real worker's HTTP endpoint follows the one HTTP policy: JSON, nosniff, the origin guard."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_storm.config import load_config
from spark_storm.netutil import free_ports
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.worker.worker import Worker
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    slot = Slot("127.0.0.1", free_ports(1)[0])
    hb_dir: Path = tmp_path_factory.mktemp("hb")
    topo = topology_from_dict({"name": "web", "components": [{"id": "in", "source": True, "fields": ["x"]}]})
    w = Worker(plan(topo, [slot]), slot, load_config(None, {"worker.heartbeat.dir": str(hb_dir)}))
    w.start()
    wait_until(lambda: w.metrics()["active"], what="the worker to activate")
    yield w
    assert w.stop(10)


def _request(
    worker: Worker, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    assert worker.metrics_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", worker.metrics_port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _json(body: bytes) -> Any:
    return json.loads(body)


def test_a_cross_origin_post_is_refused_and_the_worker_stays_active(worker: Worker) -> None:
    port = worker.metrics_port
    # What a page on another site sends when it POSTs to the loopback worker through the browser.
    status, headers, body = _request(
        worker, "POST", "/deactivate", {"Origin": "http://evil.example", "Host": f"127.0.0.1:{port}"}
    )
    assert status == 403
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    assert "http://evil.example" in _json(body)["errorMessage"]
    assert worker.metrics()["active"] is True
    # DNS rebinding: the page's own name now points at 127.0.0.1, so Origin and Host agree.
    rebound = {"Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"}
    status, _, body = _request(worker, "POST", "/deactivate", rebound)
    assert status == 403
    assert "use 127.0.0.1 or localhost" in _json(body)["errorMessage"]
    assert worker.metrics()["active"] is True


def test_its_own_origin_and_scripts_may_post(worker: Worker) -> None:
    port = worker.metrics_port
    same = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    status, headers, body = _request(worker, "POST", "/deactivate", same)
    assert (status, _json(body)) == (200, {"active": False})
    assert headers["x-content-type-options"] == "nosniff"
    assert worker.metrics()["active"] is False
    status, _, body = _request(worker, "POST", "/activate")  # a script: no Origin
    assert (status, _json(body)) == (200, {"active": True})
    assert worker.metrics()["active"] is True


def test_every_reply_is_json_or_prometheus_text_and_says_nosniff(worker: Worker) -> None:
    status, headers, body = _request(worker, "GET", "/health")
    assert (status, headers["content-type"]) == (200, "application/json")
    assert _json(body)["topology"] == "web"
    status, headers, body = _request(worker, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert headers["x-content-type-options"] == "nosniff"
    for method, path in (("GET", "/nope"), ("POST", "/stop"), ("PUT", "/activate")):
        status, headers, body = _request(worker, method, path)
        assert status == (501 if method == "PUT" else 404), (method, path)
        assert headers["content-type"] == "application/json"
        assert headers["x-content-type-options"] == "nosniff"
        assert _json(body)["errorMessage"]
    assert worker.metrics()["active"] is True
