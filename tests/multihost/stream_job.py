"""The Spark driver of the multi-host tests: JSON files -> format("storm") through ZooKeeper.

``python -m tests.multihost.stream_job --zookeeper ZK --topology NAME --src DIR --checkpoint DIR
--expect ROWS`` runs local Spark (``local[2,8]``: failed tasks are retried) in this
namespace, one file per micro-batch at ``delivery=processed``, and prints one JSON line per
micro-batch (``batch``, ``rows``, ``start``, ``end`` as wall-clock seconds) until ``ROWS``
rows went through, then ``{"done": true, ...}``; a failed query prints ``{"failed": ...}``
and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from typing import Any


def _line(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zookeeper", required=True)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--ack-timeout-ms", default="6000")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--set", action="append", default=[], help="storm.* option key=value")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spark_storm.spark import register
    from spark_storm.spark.session import local_session

    spark = local_session(
        "multihost",
        "local[2,8]",
        conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
    )
    register(spark)
    extra = dict(pair.partition("=")[::2] for pair in args.set)
    query = (
        spark.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(args.src)
        .repartition(2)
        .writeStream.format("storm")
        .option("zookeeper", args.zookeeper)
        .option("topology", args.topology)
        .option("delivery", "processed")
        .option("ackTimeoutMs", args.ack_timeout_ms)
        .options(**extra)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    _line({"started": True})
    seen: set[int] = set()
    total = 0
    deadline = time.monotonic() + args.seconds
    code = 0
    try:
        while total < args.expect:
            error = query.exception()
            if error is not None or not query.isActive:
                _line({"failed": str(error)})
                code = 1
                break
            if time.monotonic() > deadline:
                _line({"failed": f"only {total} of {args.expect} rows after {args.seconds}s"})
                code = 1
                break
            for p in query.recentProgress:
                if p["batchId"] in seen or not p["numInputRows"]:
                    continue
                seen.add(p["batchId"])
                total += int(p["numInputRows"])
                start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
                end = start + p["durationMs"].get("triggerExecution", 0) / 1000
                _line({"batch": p["batchId"], "rows": p["numInputRows"], "start": start, "end": end})
            time.sleep(0.05)
    finally:
        query.stop()
        if code == 0:
            _line({"done": True, "rows": total, "batches": len(seen)})
        spark.stop()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
