"""State TTL through a SIGKILL, with real worker processes: the same keys expire as without the failure.

The keyed ledger (in -> mid -> ledger, 4 stateful tasks) with ``topology.state.ttl.ms: 1500``
on the ledger component and its event clock read from the rows' ``n`` field (epoch ms).
Each batch writes a sliding range of keys at event times one second apart, so a key last
written two batches back expires at the next barrier, and one batch brings an expired key
back (it starts again from nothing).  Run once straight, once with a worker SIGKILLed in the
middle of a batch (a rollback and a replay): the committed state, and so the set of keys
that expired, must be the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ledger import ExactRun, ledger_state

pytestmark = pytest.mark.integration

BATCHES = 5


def ttl_topology(tmp: Path) -> Path:
    topo = {
        "name": "ttl-ledger",
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
        },
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "mid",
                "bolt": "spark_storm.worker.bolt:PassThroughBolt",
                "fields": ["key", "n"],
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "ledger",
                "bolt": "tests.integration.bolts:LedgerBolt",
                "parallelism": 2,
                "tasks": 4,
                "inputs": [{"from": "mid", "grouping": "fields", "fields": ["key"]}],
                "conf": {"topology.state.ttl.ms": 1500, "timestamp_field": "n"},
            },
        ],
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "ttl-ledger.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def rows(batch: int) -> list[list[Any]]:
    """Keys k{b*8} .. k{b*8+23}, each a few times, at event times batch*1000 + j; batch 4 brings k0 back."""
    out = [[f"k{j}", batch * 1000 + j % 100] for _ in range(3) for j in range(batch * 8, batch * 8 + 24)]
    if batch == 4:
        out.append(["k0", batch * 1000])
    return out


def run_ledger(tmp: Path, *, kill: bool) -> dict[str, list[int]]:
    with ExactRun(ttl_topology(tmp)) as run:
        for batch in range(BATCHES):
            if kill and batch == 2:
                sender = run.kill_mid_batch(run.with_source(), batch, rows(batch))
                sender.join(120)
                assert not sender.is_alive()
            else:
                run.send(batch, rows(batch))
            result = run.commit(batch)
            if result.rolled_back_to is not None:
                print(f"batch {batch}: rollback to {result.rolled_back_to}, resent {run.writer.resent}")
        return ledger_state(tmp / "state", run.cluster.topology.name, run.cluster.plan)


def test_keys_expire_the_same_through_a_sigkill_as_without_it(tmp_path: Path) -> None:
    straight = run_ledger(tmp_path / "straight", kill=False)
    killed = run_ledger(tmp_path / "killed", kill=True)
    written = {key for b in range(BATCHES) for key, _n in rows(b)}
    expired = written - set(straight)
    print(f"{len(written)} keys written, {len(expired)} expired, {len(straight)} left")
    assert killed == straight
    assert written - set(killed) == expired
    assert {"k1", "k8"} <= expired  # written in batches 0-1 only: gone by batch 3's barrier
    assert straight["k0"] == [1, 4000]  # expired, then written again: it started from nothing
    assert straight["k50"] == [3, 3 * (4000 + 50)]  # written in the last batch only: kept
