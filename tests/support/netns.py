"""Network namespaces as hosts joined by a bridge, made and deleted by the test or bench that uses them.

No pytest here: the multihost tier (tests/support/multihost.py) and bench.chaos's network
cuts both use it.  Every namespace and link is this object's own (``sst<tag>-*``); nothing
outside them is touched, and :meth:`Network.delete` kills what still runs inside them.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence

__all__ = ["HOSTS", "Network", "ip", "namespaces_unavailable"]

HOSTS = ("h1", "h2", "h3")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Network:
    """The namespaces, the bridge and each host's address; :meth:`cut` / :meth:`restore` a host's link,
    :meth:`block` / :meth:`unblock` the path between two hosts only.

    ``hosts`` names the hosts besides ``ctl`` (where a test runs its client side).
    """

    def __init__(self, hosts: Sequence[str] = HOSTS) -> None:
        tag = uuid.uuid4().hex[:6]
        self.prefix = f"sst{tag}"
        net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self.switch = f"{self.prefix}-sw"
        self.names = ("ctl", *hosts)
        self.ns = {name: f"{self.prefix}-{name}" for name in self.names}
        self.addr = {name: f"{net}.{i + 1}" for i, name in enumerate(self.names)}
        self.port = {name: f"p{tag}{i}" for i, name in enumerate(self.names)}  # bridge-side veth (<= 15 chars)
        self.created: list[str] = []

    def create(self) -> None:
        ip("netns", "add", self.switch)
        self.created.append(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for name in self.names:
            ns = self.ns[name]
            ip("netns", "add", ns)
            self.created.append(ns)
            ip("-n", self.switch, "link", "add", self.port[name], "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", self.switch, "link", "set", self.port[name], "master", "br0")
            ip("-n", self.switch, "link", "set", self.port[name], "up")
            ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, name: str) -> None:
        """Take ``name``'s bridge port down: nothing goes in or out of that host any more."""
        ip("-n", self.switch, "link", "set", self.port[name], "down")

    def restore(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", self.port[name], "up")

    def block(self, a: str, b: str) -> None:
        """Drop every packet between ``a`` and ``b`` (a blackhole route on each side); others still reach both.

        Established connections stall and retransmit, as across a real partition.
        """
        ip("-n", self.ns[a], "route", "add", "blackhole", f"{self.addr[b]}/32")
        ip("-n", self.ns[b], "route", "add", "blackhole", f"{self.addr[a]}/32")

    def unblock(self, a: str, b: str) -> None:
        ip("-n", self.ns[a], "route", "del", "blackhole", f"{self.addr[b]}/32", check=False)
        ip("-n", self.ns[b], "route", "del", "blackhole", f"{self.addr[a]}/32", check=False)

    def pids(self) -> list[int]:
        """Every process still running in one of our namespaces (all started by this test module)."""
        out: list[int] = []
        for ns in self.created:
            got = ip("netns", "pids", ns, check=False)
            out += [int(p) for p in got.stdout.split() if p.strip().isdigit()]
        return out

    def delete(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for ns in reversed(self.created):
            ip("netns", "del", ns, check=False)
        self.created.clear()


def namespaces_unavailable() -> str | None:
    """Return why namespaces cannot be used here, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command to create network namespaces: apt-get install iproute2 (scripts/test does)"
    name = f"sstprobe{uuid.uuid4().hex[:6]}"
    got = ip("netns", "add", name, check=False)
    if got.returncode != 0:
        return f"cannot create a network namespace (`ip netns add` says: {got.stderr.strip()}); needs root or CAP_SYS_ADMIN"
    ip("netns", "del", name, check=False)
    return None
