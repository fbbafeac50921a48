"""Several hosts on one machine: network namespaces joined by a bridge, each running its daemons.

The module's network: a switch namespace holding a bridge, and one namespace per host
(``ctl`` for ZooKeeper, nimbus and the Spark driver; ``h1``..``h3`` for supervisors and
their workers), each with a veth pair into the bridge and an address of a private /24
chosen at random.  Nothing touches the root namespace's interfaces, so all traffic stays
inside these namespaces.  A host's link is cut by taking its bridge port down (both
directions drop, no reset: a real partition).  Every namespace is deleted afterwards,
after every process started in it was stopped by PID.  Where namespaces cannot be made
(no CAP_SYS_ADMIN / CAP_NET_ADMIN, no ``ip``), the tests skip saying why.

Its helpers are in tests/support/multihost.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.multihost import Cluster, ns_cli
from tests.support.netns import Network, namespaces_unavailable


@pytest.fixture(scope="module")
def network(zookeeper_jars: Path) -> Iterator[Network]:
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    net = Network()
    try:
        net.create()
        yield net
    finally:
        net.delete()


@pytest.fixture(scope="module")
def zk_server(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """ZooKeeper in ``ctl`` on its network address (every host reaches it); yields ``addr:2181``."""
    from spark_storm.tools.zookeeper_server import ZooKeeperServer

    directory = tmp_path_factory.mktemp("zookeeper-ns")
    ns_cli(
        network, "ctl", "zookeeper", "start", "--dir", str(directory), "--port", "2181", "--host", network.addr["ctl"]
    )
    try:
        yield f"{network.addr['ctl']}:2181"
    finally:
        ZooKeeperServer(directory).stop()


@pytest.fixture
def cluster(network: Network, zk_server: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(network, zk_server, tmp_path)
    try:
        yield c
    finally:
        c.close()
