"""100,000 mutated frame streams through the decoder and the session protocol (bench/fuzz.py has 1 M)."""

from __future__ import annotations

import pytest

from bench.fuzz import fuzz

pytestmark = pytest.mark.hostile


def test_100k_mutated_inputs_end_only_in_typed_errors() -> None:
    outcomes = fuzz(100_000, seed=20_260_101)
    print("fuzz:", dict(sorted(outcomes.items())))
    assert sum(outcomes.values()) == 100_000
    assert not [k for k in outcomes if "CRASH" in k], outcomes
    # Each target both accepted and refused some inputs: the mutations reach past the first check.
    for target in ("server", "client", "decoder"):
        assert outcomes[f"{target}: accepted"] > 0, outcomes
        assert outcomes[f"{target}: WireFormatError"] > 0, outcomes
