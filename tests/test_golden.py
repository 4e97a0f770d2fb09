"""Every trainer's trajectory stays bitwise what it was when tests/golden/trajectories.json was recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("golden")))
import trajectories as golden

RECORDED = json.loads(golden.FILE.read_text())


@pytest.mark.parametrize("case", golden.all_cases(), ids=lambda c: golden.case_id(*c))
def test_trajectory_is_bitwise_unchanged(case):
    assert golden.run_case(*case) == RECORDED[golden.case_id(*case)]


def test_every_recorded_case_is_run():
    assert set(RECORDED) == {golden.case_id(*c) for c in golden.all_cases()}


UCI_COMMAND = (
    "uci --datasets yacht --methods vadam,bbvi,mc_dropout,vogn,noisy_kfac --splits 1 --tune none --jobs 1"
)


def test_uci_yacht_split0_is_bitwise_unchanged(tmp_path):
    """`ngvi uci --tune none` on yacht's split 0: RMSE, log-likelihood and curve, to the bit."""
    from conftest import data_dir
    from ngvi.cli import main

    if not (data_dir() / "uci").is_dir():
        pytest.skip(f"no UCI data under {data_dir()}")
    assert main([*UCI_COMMAND.split(), "--data-dir", str(data_dir()), "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    got = {k: {m: v[m] for m in ("curve", "loglik", "rmse")} for k, v in runs.items()}
    assert got == json.loads(golden.FILE.with_name("uci_yacht_split0.json").read_text())
