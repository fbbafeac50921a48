"""The worker runtime: receive path, executor queues, executors, transfer, checkpoints, lifecycle.

Bolt and spout authors import the component API from :mod:`spark_storm.bolts`; the process
itself is :class:`spark_storm.worker.worker.Worker` (``spark-storm worker``).  Importing this
package loads neither.
"""
