"""Which CPUs a worker process runs on (``topology.worker.cpu.affinity``).

A worker's Python threads take turns on one interpreter lock, so they never run Python at
the same time; yet the kernel spreads them over cores.  Then every tuple the receive
thread decodes on one core is read, and freed, by an executor thread on another, and its
objects cross between the cores' caches.  On a 2-core host, pinning the worker to one CPU
raised the one-worker no-op rate by about an eighth (``bench.worker``; see
docs/operations/tuning.md).  The price: what runs outside the lock (socket system calls,
Arrow's compute and compression threads) shares that CPU too, and the kernel cannot move
the worker off a busy core.  So it is off unless asked for:

* ``null`` — the kernel places the threads (the default);
* ``"slot"`` — one CPU per worker: the worker's index among its host's slots (the
  ``supervisor.slots.ports`` its supervisor passes, else the topology's slots on this host)
  picks one of the CPUs this process may use, round-robin;
* a list of CPU numbers — exactly those (the kernel balances within them).

Linux only (``sched_setaffinity``); elsewhere a setting other than null is a ConfigError.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from spark_storm.errors import ConfigError

__all__ = ["KEY", "SLOT", "check_affinity", "cpus_for", "pin_worker"]

KEY = "topology.worker.cpu.affinity"
#: One CPU per worker, by its slot's index on the host.
SLOT = "slot"

_FIX = (
    f'give null (the kernel decides), "{SLOT}" (one CPU per worker, by its slot on this host) or a list of CPU numbers'
)


def check_affinity(value: object) -> str | tuple[int, ...] | None:
    """Return ``value`` of :data:`KEY` checked: None, :data:`SLOT` or a sorted tuple of CPU numbers.

    Raises
    ------
    ConfigError
        Naming the key, the value and what is allowed.
    """
    if value is None:
        return None
    if value == SLOT:
        return SLOT
    if isinstance(value, list | tuple) and value and all(type(c) is int and c >= 0 for c in value):
        return tuple(sorted({int(c) for c in value}))
    msg = f"config key {KEY!r} got {value!r}: {_FIX}"
    raise ConfigError(msg)


def cpus_for(setting: str | tuple[int, ...], port: int, host_ports: Sequence[int], allowed: set[int]) -> set[int]:
    """Return the CPUs a worker on ``port`` pins itself to.

    Parameters
    ----------
    setting : str or tuple of int
        A checked value of :data:`KEY` other than None.
    port : int
        The worker's own port.
    host_ports : sequence of int
        The ports of the slots on this host (``"slot"`` takes the index of ``port`` among them).
    allowed : set of int
        The CPUs this process may use (``os.sched_getaffinity(0)``).

    Raises
    ------
    ConfigError
        A listed CPU this process may not use.
    """
    cpus = sorted(allowed)
    if isinstance(setting, str):  # SLOT
        ports = sorted(set(host_ports) | {port})
        return {cpus[ports.index(port) % len(cpus)]}
    missing = sorted(set(setting) - allowed)
    if missing:
        msg = f"config key {KEY!r}: CPUs {missing} are not available to this worker (it may use {cpus}); {_FIX}"
        raise ConfigError(msg)
    return set(setting)


def pin_worker(
    setting: str | tuple[int, ...], port: int, supervisor_ports: Sequence[int], topology_ports: Sequence[int]
) -> set[int]:
    """Pin every thread of this worker process (threads started later inherit it); return the CPUs.

    ``supervisor_ports`` are the slots its supervisor passed (``supervisor.slots.ports``); a
    worker whose port is not among them (started by a local cluster, or by hand) counts the
    topology's slots on its host, ``topology_ports``.

    Raises
    ------
    ConfigError
        Not on Linux (no ``sched_setaffinity``), or a listed CPU this process may not use.
    """
    getaffinity = getattr(os, "sched_getaffinity", None)
    setaffinity = getattr(os, "sched_setaffinity", None)
    if getaffinity is None or setaffinity is None:
        msg = f"config key {KEY!r}: CPU affinity needs Linux (sched_setaffinity); set it to null here"
        raise ConfigError(msg)
    host_ports = supervisor_ports if port in supervisor_ports else topology_ports
    cpus = cpus_for(setting, port, host_ports, getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended since the listing
            setaffinity(int(tid), cpus)
    return cpus
