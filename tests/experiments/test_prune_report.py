"""`ngvi prune`'s report: a folder's table and figure are rewritten from its results.json under the
configuration it records (no data, no training), and rows of unclipped or diverged runs say so."""

from __future__ import annotations

import json

from ngvi.experiments import prune
from ngvi.experiments.cli import main


def _run(per_epoch: list[float]) -> dict:
    curve = [per_epoch[-1] * (1 - p) + 0.1 * p for p in prune.FRACTIONS]
    return {
        "seconds": 1.0,
        "test_accuracy_per_epoch": per_epoch,
        "fractions": list(prune.FRACTIONS),
        "accuracy": {"snr": curve, "magnitude": curve},
    }


def test_label_says_unclipped_and_diverged_only_where_the_runs_show_it():
    unclipped = {"options": {"ivon": {"lr": 0.1}}}
    clipped = {"options": {"ivon": {"lr": 0.1, "clip_radius": 1e-3}}}
    fell = [_run([0.95, 0.96, 0.30]), _run([0.95, 0.20])]  # every seed ≥ 20 points below its best epoch
    fine = [_run([0.95, 0.96, 0.30]), _run([0.95, 0.97])]
    assert prune.label("ivon", fell, unclipped) == "IVON (unclipped, diverged)"
    assert prune.label("ivon", fine, unclipped) == "IVON (unclipped)"
    assert prune.label("ivon", fine, clipped) == "IVON"
    assert prune.label("vogn", fell, clipped) == "VOGN (diverged)"


def test_report_only_uses_the_recorded_configuration_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "prune"
    out.mkdir()
    config = {"epochs": 3, "batch_size": 128, "dropout": 0.2, "subset": None,
              "options": {"badam": {"lr": 1e-3}, "ivon": {"lr": 0.1, "betas": [0.9, 0.999]}}}  # fmt: skip
    runs = {"badam/seed0": _run([0.9, 0.95, 0.97]), "ivon/seed0": _run([0.95, 0.5, 0.25])}
    (out / "results.json").write_text(json.dumps({"config": config, "runs": runs}))
    args = ["prune", "--methods", "badam,ivon", "--seeds", "1", "--report-only", "--out", str(out)]
    assert main(args) == 0  # today's OPTIONS differ from the recorded ones: not refused
    table = (out / "table.md").read_text()
    assert "| IVON (unclipped, diverged) | |μ|/σ |" in table and "| BAdam | |μ| |" in table
    assert "3 epochs of minibatches of 128" in table
    assert (out / "prune.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "results.json").read_text())["runs"] == runs
    assert main(["prune", "--methods", "badam,ivon", "--seeds", "2", "--report-only", "--out", str(out)]) != 0
    assert "has no run badam/seed1, ivon/seed1" in capsys.readouterr().err
