from __future__ import annotations

import pytest

from spark_storm.errors import StormError, TransportInitError, UnknownTransportError
from spark_storm.messaging import IContext
from spark_storm.transport import TRANSPORT_ALIASES, make_context
from spark_storm.transport.local import Context as LocalContext


def _make(name: str) -> IContext:
    return make_context({"storm.messaging.transport": name})


@pytest.mark.parametrize("alias", sorted(TRANSPORT_ALIASES))
def test_every_alias_builds_its_context(alias: str) -> None:
    ctx = _make(alias)
    try:
        assert type(ctx).alias == alias
    finally:
        ctx.term()


@pytest.mark.parametrize(
    "path",
    [
        "tests.unit.plugins.sample:WrappedLocal",
        "tests.unit.plugins.sample.WrappedLocal",
        "tests.unit.plugins.sample",
        "spark_storm.transport.local:Context",
    ],
)
def test_dotted_paths_in_both_plugin_styles(path: str) -> None:
    ctx = _make(path)
    assert isinstance(ctx, LocalContext)
    ctx.term()


def test_unknown_alias_suggests_the_close_one() -> None:
    with pytest.raises(UnknownTransportError, match=r"no such transport: 'tpc'\. Did you mean 'tcp'\?"):
        _make("tpc")


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("tests.unit.plugins.nope:Context", "no module named 'tests.unit.plugins.nope'"),
        ("tests.unit.plugins.sample:WrapedLocal", "Did you mean tests.unit.plugins.sample:WrappedLocal"),
        ("tests.unit.plugins.sample:NOT_A_TRANSPORT", "neither an IContext subclass"),
    ],
)
def test_unknown_paths_are_unknown_transport_errors(path: str, match: str) -> None:
    with pytest.raises(UnknownTransportError, match=match):
        _make(path)


def test_constructor_failure_is_a_different_error_with_the_cause_chained() -> None:
    with pytest.raises(TransportInitError, match="failed to build its context: OSError: no such device") as info:
        _make("tests.unit.plugins.sample:Exploding")
    assert isinstance(info.value.__cause__, OSError)
    assert isinstance(info.value, StormError)


def test_a_factory_returning_a_non_context_is_refused() -> None:
    with pytest.raises(TransportInitError, match="which is not an IContext"):
        _make("tests.unit.plugins.sample:factory")
