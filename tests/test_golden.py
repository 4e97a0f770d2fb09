"""Every trainer's trajectory stays bitwise what it was when tests/golden/trajectories.json was recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("golden")))
import trajectories as golden  # noqa: E402

RECORDED = json.loads(golden.FILE.read_text())


@pytest.mark.parametrize("case", golden.all_cases(), ids=lambda c: golden.case_id(*c))
def test_trajectory_is_bitwise_unchanged(case):
    assert golden.run_case(*case) == RECORDED[golden.case_id(*case)]


def test_every_recorded_case_is_run():
    assert set(RECORDED) == {golden.case_id(*c) for c in golden.all_cases()}
