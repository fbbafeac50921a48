"""Cluster mode: ZooKeeper state, nimbus, supervisors (Storm's daemons; layer between transport and worker)."""
