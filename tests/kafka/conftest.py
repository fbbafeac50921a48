from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.spark import spark_session


@pytest.fixture(scope="module")
def spark(spark_jars: list[str]) -> Iterator[Any]:
    """A local session with every connector jar (Kafka and Delta) and Delta's extension.

    Every module here asks for the same jars, so whichever starts the JVM first puts them
    all on the driver's classpath.
    """
    from spark_storm.spark import register

    session = spark_session("spark-connector-tests")
    register(session)
    yield session
    session.stop()
