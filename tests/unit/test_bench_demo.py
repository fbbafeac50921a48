"""bench/demo.py reads what the demo prints."""

from __future__ import annotations

from bench.demo import read_output

OUTPUT = """\
26/11/27 19:14:41 WARN ProcessingTimeExecutor: Current batch is falling behind. The trigger interval is 1000 \
milliseconds, but spent 5777 milliseconds
t=  7.1s  sent    12,000 rows  | tuples/s  sentences     4,906 | batch  2196 ms (BEHIND)
26/11/27 19:14:43 WARN ProcessingTimeExecutor: Current batch is falling behind. The trigger interval is 1000 \
milliseconds, but spent 2196 milliseconds
sentences sent by Spark: 88,000; micro-batches: 38 (2 slower than the 1 s trigger); processed by the topology: 88,000
sent == processed: OK
"""


def test_it_counts_sparks_falling_behind_lines_and_names_the_checks_that_did_not_pass() -> None:
    behind, summary, failed = read_output(OUTPUT)
    assert behind == [5777, 2196]
    assert summary.startswith("sentences sent by Spark: 88,000; micro-batches: 38")
    assert failed == ["counts exact: OK"]
    assert read_output("") == ([], "(no summary)", ["sent == processed: OK", "counts exact: OK"])
