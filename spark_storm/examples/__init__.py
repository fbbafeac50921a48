"""Example bolts used by conf/topologies/*.yaml."""
