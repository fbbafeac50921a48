"""``python -m bench.chaos_worker SECONDS ARGS...``: ``spark-storm ARGS...`` with the GIL switch interval at SECONDS.

bench.chaos starts its workers through this (see ``ChaosCluster`` in bench/chaos_run.py) to
run them at a 1 µs switch interval: the worker's own knob,
``topology.worker.switch.interval.ms``, accepts 0.01 ms at the least, and a race in a shared
buffer shows up far more often at 1 µs (issue 24: a shared msgpack Packer).  0 leaves the
interval alone.  The interval and the ``spark_storm`` package the worker runs are logged
first, so a run against another checkout (``PYTHONPATH``) shows which code it ran.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python -m bench.chaos_worker SECONDS [spark-storm arguments...]\n")
        return 2
    interval = float(args[0])
    if interval > 0:
        sys.setswitchinterval(interval)
    import spark_storm
    from spark_storm.cli.parser import main as cli_main

    interval_us = sys.getswitchinterval() * 1e6
    sys.stderr.write(
        f"bench.chaos_worker: switch interval {interval_us:g} us, spark_storm from {spark_storm.__file__}\n"
    )
    sys.stderr.flush()
    return cli_main(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
