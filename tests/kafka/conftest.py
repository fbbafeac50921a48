from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_storm.tools.kafka_broker import KafkaBroker, default_jars_dir


@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    """The broker jars; the only skip: scripts/fetch-jars could not reach Maven Central."""
    jars = default_jars_dir()
    if not any(jars.glob("*.jar")):
        log = Path(jars).parent / "kafka-mvn.log"
        pytest.skip(f"no Kafka jars in {jars}: scripts/fetch-jars could not reach Maven Central ({log})")
    return jars


@pytest.fixture(scope="session")
def kafka_broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real KRaft broker on 127.0.0.1 for the whole test session; yields its bootstrap address."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), kafka_jars)
    bootstrap = broker.start()
    yield bootstrap
    broker.stop()
