"""Transport plugins used by the factory tests (both of Storm's plugin styles)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_storm.messaging import IContext
from spark_storm.transport.local import Context as LocalContext


class WrappedLocal(LocalContext):
    """Style 1: an IContext subclass."""

    alias = "wrapped"


class Exploding(LocalContext):
    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> LocalContext:
        msg = "no such device"
        raise OSError(msg)


def make_context(conf: Mapping[str, Any]) -> IContext:
    """Style 2: a module-level make_context(conf)."""
    return LocalContext.from_conf(conf)


class Factory:
    def make_context(self, conf: Mapping[str, Any]) -> object:
        return "not a context"


factory = Factory()
NOT_A_TRANSPORT = 42
