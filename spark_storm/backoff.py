"""Bounded exponential backoff with jitter: a pure object, callers do the waiting.

One class for every retry in the package: a transport client's reconnects
(``storm.messaging.tcp.min_wait_ms`` / ``max_wait_ms``, :func:`backoff_from_conf`) and a
multilang child's restarts (``topology.multilang.restart.backoff.*``, spark_storm.shell).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from spark_storm.config import TCP_MAX_WAIT_MS, TCP_MIN_WAIT_MS, Config
from spark_storm.errors import ConfigError

__all__ = ["Backoff", "backoff_from_conf"]


@dataclass
class Backoff:
    """Delays that grow exponentially from ``min_ms`` and never exceed ``max_ms``.

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
        """Delay before attempt ``attempt`` (0-based), in ms, within [min_ms, max_ms]."""
        base = self.min_ms * (1 << min(max(attempt, 0), 20)) if self.min_ms else (1 << min(attempt, 20))
        jitter = self.rng.randrange(1 + base // 5)
        return max(self.min_ms, min(self.max_ms, base + jitter))


def backoff_from_conf(conf: Config) -> Backoff:
    """Build the reconnect backoff of ``storm.messaging.tcp.min_wait_ms`` / ``max_wait_ms``.

    Raises
    ------
    ConfigError
        A negative bound, or ``max_wait_ms`` below ``min_wait_ms`` (names both keys).
    """
    min_wait, max_wait = conf.get_int(TCP_MIN_WAIT_MS, minimum=0), conf.get_int(TCP_MAX_WAIT_MS, minimum=0)
    if max_wait < min_wait:
        msg = f"config key {TCP_MAX_WAIT_MS!r} ({max_wait}) must be >= {TCP_MIN_WAIT_MS!r} ({min_wait})"
        raise ConfigError(msg)
    return Backoff(min_wait, max_wait)
