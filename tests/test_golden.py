"""Every trainer's trajectory stays bitwise what it was when tests/golden/ was recorded (on the main of
before the architecture refactor), computed with CPU-independent numerics in a child process."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("golden")))
import trajectories as golden

RECORDED = json.loads(golden.FILE.read_text())


@cache
def computed() -> dict[str, dict[str, str]]:
    return json.loads(golden.run_pinned())


@pytest.mark.parametrize("case", golden.all_cases(), ids=lambda c: golden.case_id(*c))
def test_trajectory_is_bitwise_unchanged(case):
    assert computed()[golden.case_id(*case)] == RECORDED[golden.case_id(*case)]


def test_every_recorded_case_is_run():
    assert set(RECORDED) == {golden.case_id(*c) for c in golden.all_cases()}


def test_uci_yacht_split0_is_bitwise_unchanged(tmp_path):
    """`ngvi uci --tune none` on yacht's split 0: RMSE, log-likelihood and curve, to the bit."""
    from conftest import data_dir

    if not (data_dir() / "uci").is_dir():
        pytest.skip(f"no UCI data under {data_dir()}")
    golden.run_pinned("--uci", str(tmp_path), "--data-dir", str(data_dir()))
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    got = {k: {m: v[m] for m in ("curve", "loglik", "rmse")} for k, v in runs.items()}
    assert got == json.loads(golden.UCI_FILE.read_text())
