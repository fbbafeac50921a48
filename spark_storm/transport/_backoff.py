"""Bounded exponential backoff with jitter: a pure object, callers do the waiting."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Reconnect delays that grow exponentially from ``min_ms`` and never exceed ``max_ms``.

    Like Storm's ``StormBoundedExponentialBackoffRetry``: ``delay_ms(attempt)`` is pure
    apart from the jitter source, so tests check its bounds without sleeping.
    """

    min_ms: int
    max_ms: int
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.min_ms < 0 or self.max_ms < self.min_ms:
            msg = f"backoff needs 0 <= min_ms <= max_ms, got min_ms={self.min_ms} max_ms={self.max_ms}"
            raise ValueError(msg)

    def delay_ms(self, attempt: int) -> int:
        """Delay before reconnect attempt ``attempt`` (0-based), in ms, within [min_ms, max_ms]."""
        base = self.min_ms * (1 << min(max(attempt, 0), 20)) if self.min_ms else (1 << min(attempt, 20))
        jitter = self.rng.randrange(1 + base // 5)
        return max(self.min_ms, min(self.max_ms, base + jitter))
