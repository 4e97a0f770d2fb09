"""`ngvi convergence`: its two metrics against their definitions, and a reduced run through the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ngvi.experiments.cli import main
from ngvi.experiments.convergence import experiment as conv


def test_the_two_log_losses_against_their_definitions():
    """The predictive log-loss averages probabilities per point; the authors' metric averages the whole test
    set's likelihood over samples, so it follows the best sample (checked by direct summation)."""
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(5, 7, 1, generator=g, dtype=torch.float64)
    y = (torch.rand(7, generator=g) < 0.5).double()
    p = torch.sigmoid(logits[..., 0])
    p_y = torch.where(y > 0, p, 1 - p)  # [S, N]
    expected = -p_y.mean(0).log().mean().item()
    assert conv.predictive_log_loss(logits, y) == pytest.approx(expected, rel=1e-12)
    joint = p_y.prod(1).mean().item()
    assert conv.authors_log_loss(logits, y) == pytest.approx(-math.log(joint) / 7, rel=1e-12)
    best = (-p_y.log().mean(1)).min().item()  # the best sample's mean log-loss
    assert best <= conv.authors_log_loss(logits, y) <= best + math.log(5) / 7


def test_reduced_run_writes_curves_table_and_figure(tmp_path, data_dir):
    out = tmp_path / "conv"
    args = ["convergence", "--methods", "vogn,bbvi", "--steps", "20", "--seeds", "1"]
    args += ["--out", str(out), "--jobs", "1", "--data-dir", str(data_dir)]
    assert main(args) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 3 * 2
    # BBVI's 16 samples are 16 copies of the minibatch: a different run from its 1 sample
    assert runs["M1-S16/bbvi/seed0"]["log_loss"][1:] != runs["M1-S1/bbvi/seed0"]["log_loss"][1:]
    for r in runs.values():
        assert r["iterations"] == [0, 10, 20] and len(r["log_loss"]) == len(r["authors_log_loss"]) == 3
        assert r["log_loss"][0] == pytest.approx(math.log(2), abs=0.1)  # random wide networks: p ≈ 1/2
        assert r["authors_log_loss"][0] > 1.0  # the best of 10 wide networks is still a bad one
    table = (out / "table.md").read_text()
    assert "the authors' metric" in table and "| M = 128, S = 16 | VOGN |" in table and "| BBVI |" in table
    assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
