"""The redis state backend against a real redis-server (Debian's), started and stopped by the project's tool."""

from __future__ import annotations

from typing import Any

import pytest

from spark_storm.config import Config
from spark_storm.state import make_backend
from tests.support.state import check_changelog, check_input_log

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from spark_storm.tools.redis_server import RedisServer, RedisServerError

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
    except RedisServerError as exc:
        pytest.skip(str(exc))
    yield server.url
    server.stop()


def test_the_redis_backend_stores_what_the_others_do(redis_url: str) -> None:
    from spark_storm.state.redis import RedisBackend

    backend = RedisBackend("topo-redis", redis_url, prefix="t1")
    check_changelog(backend)
    check_input_log(backend)
    again = RedisBackend("topo-redis", redis_url, prefix="t1")  # another host reads the same task
    assert again.task_store(4).restore()[0] == 6
    backend.close()
    again.close()


def test_an_unreachable_redis_is_an_error_naming_the_address() -> None:
    from spark_storm.errors import StateUnavailableError
    from spark_storm.netutil import free_ports

    port = free_ports(1)[0]
    with pytest.raises(StateUnavailableError, match=rf"Redis at redis://127.0.0.1:{port}/0 cannot be reached"):
        make_backend(
            Config.of(
                {
                    "topology.state.provider": "redis",
                    "topology.state.provider.config": {"url": f"redis://127.0.0.1:{port}/0", "connect.timeout.ms": 500},
                }
            ),
            "t",
        )
