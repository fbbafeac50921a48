"""pystorm bolts for the in-process tests (the way a streamparse user writes them)."""

from __future__ import annotations

from typing import Any

from pystorm import Bolt


class EchoBolt(Bolt):  # type: ignore[misc]
    """(key, n) -> (key, n), auto-anchored and auto-acked; the key ``boom`` raises."""

    outputs = ("key", "n")

    def initialize(self, conf: dict[str, Any], ctx: dict[str, Any]) -> None:
        self.seen = 0

    def process(self, tup: Any) -> None:
        key = tup.values[0]
        if key == "boom":
            msg = "boom on purpose"
            raise RuntimeError(msg)
        self.seen += 1
        self.emit([key, tup.values[1]])
