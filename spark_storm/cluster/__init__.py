"""Cluster mode: ZooKeeper state, nimbus, supervisors (Storm's daemons; layer between transport and worker).

* :mod:`~spark_storm.cluster.session` — one ZooKeeper session: address, reconnects, the retrying call, reads;
* :mod:`~spark_storm.cluster.records` — what the znodes hold (supervisors, topologies, assignments, heartbeats);
* :mod:`~spark_storm.cluster.state` — :class:`ClusterState`: the typed operations, watches and the election;
* :mod:`~spark_storm.cluster.liveness` — which slots are free and which workers are alive (nimbus's rules, the UI's);
* :mod:`~spark_storm.cluster.nimbus`, :mod:`~spark_storm.cluster.supervisor`, :mod:`~spark_storm.cluster.admin`.
"""
