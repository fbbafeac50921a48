"""The ``spark-storm`` command line (also ``python -m spark_storm.cli``).

Commands
--------
demo            local Spark streaming sentences into a 2-worker wordcount topology (live progress)
transport-demo  send messages through a transport between two processes, with live progress
worker          run one worker process of a topology
local-cluster   run N worker processes on loopback until Ctrl-C
ui              the Storm UI and REST API for a cluster (--zookeeper) or a local cluster's workers
topology plan   print a topology's tasks, executors and the worker each runs on
kafka           start | stop | status a local KRaft Kafka broker (jars from scripts/fetch-jars)
zookeeper       start | stop | status a local ZooKeeper server (jars from scripts/fetch-jars)
spark-standalone start | stop | status a local Spark standalone master + worker (pyspark's own classes)
nimbus          run a nimbus (leader-elected; assigns topologies to supervisors' slots; --ui-port: the UI)
supervisor      run a supervisor (registers slots; runs, restarts and stops assigned workers)
submit          submit a topology to the cluster (through ZooKeeper)
activate        let a submitted topology's executors consume
deactivate      pause a submitted topology's executors
rebalance       change the number of workers of a submitted topology
kill            deactivate a topology, then remove it and stop its workers
list            the submitted topologies: name, status, workers, uptime
config          print the effective configuration (defaults + --conf file)
version         print the version

Modules
-------
parser    the flags of every command, and :func:`main`
demos     transport-demo, demo
daemons   worker, local-cluster, nimbus, supervisor (each until SIGTERM/Ctrl-C)
admin     submit, activate, deactivate, rebalance, kill, list, config, topology plan
servers   kafka, zookeeper, spark-standalone, ui
signals   run_until_signalled: the one signal loop the daemons and the UI share
common    --set overrides, the effective config, starting a UI
"""

from __future__ import annotations

from spark_storm.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
