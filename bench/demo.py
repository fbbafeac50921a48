"""The demo's pace: how often Spark logs that a micro-batch fell behind its trigger.

Runs ``spark-storm demo --seconds S --verbose`` (``--arrow``: the columnar wordcount) ``--runs``
times, one after another, each in a process of its own, and counts the lines in which Spark
says "Current batch is falling behind" (each is one micro-batch that took longer than the
1 s trigger).  Issue 25's target is at most 2 in 45 s on the tuple wordcount: the first
micro-batch, which starts Spark's Python workers, and the one that catches up the rows of
those seconds.  Also printed per run: the duration of each of those batches as Spark gives
it, the demo's own summary, and whether its two checks passed (every row sent processed,
counts exact).  Not a ratio: the count is what the target names.

    python -m bench.demo [--runs 3] [--seconds 45] [--arrow]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

BEHIND = re.compile(r"Current batch is falling behind\. The trigger interval is \d+ milliseconds, but spent (\d+)")
SUMMARY = re.compile(r"^sentences sent by Spark: .*$", re.M)
CHECKS = ("sent == processed: OK", "counts exact: OK")
TARGET = 2


def run_demo(seconds: float, arrow: bool) -> tuple[list[int], str, list[str], float]:
    """Run the demo once: the falling-behind durations (ms), its summary, the checks it failed, wall seconds."""
    command = [sys.executable, "-m", "spark_storm.cli", "demo", "--seconds", f"{seconds:g}", "--verbose"]
    if arrow:
        command.append("--arrow")
    start = time.monotonic()
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 900, check=False)
    wall = time.monotonic() - start
    text = out.stdout + out.stderr
    if out.returncode != 0:
        msg = f"the demo exited with {out.returncode}:\n{text[-3000:]}"
        raise RuntimeError(msg)
    return (*read_output(text), wall)


def read_output(text: str) -> tuple[list[int], str, list[str]]:
    """From a demo's output: the falling-behind durations (ms), its summary line, the checks it did not pass."""
    summary = SUMMARY.search(text)
    failed = [check for check in CHECKS if check not in text]
    return [int(ms) for ms in BEHIND.findall(text)], summary.group(0) if summary else "(no summary)", failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--arrow", action="store_true", help="the columnar wordcount (its rate is 20 times higher)")
    args = parser.parse_args(argv)
    counts: list[int] = []
    for run in range(1, args.runs + 1):
        behind, summary, failed, wall = run_demo(args.seconds, args.arrow)
        counts.append(len(behind))
        spent = ", ".join(f"{ms:,} ms" for ms in behind) or "none"
        checks = "checks OK" if not failed else "FAILED: " + "; ".join(failed)
        print(f"run {run}: falling behind {len(behind)} ({spent}); {checks}; {wall:.0f} s", flush=True)
        print(f"       {summary}", flush=True)
    median = statistics.median(counts)
    verdict = "met" if median <= TARGET else "NOT met"
    print(
        f"falling behind in {args.seconds:g} s: {', '.join(map(str, counts))} (median {median:g}; "
        f"target <= {TARGET}: {verdict})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
