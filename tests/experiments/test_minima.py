"""`ngvi minima`: the landscape against its formula's properties, the flatness measure, and a reduced run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ngvi.experiments import minima
from ngvi.experiments.cli import main


def test_landscape_optimum_line_symmetry_and_flatness():
    """h = 1 on the whole line x = 0, h(−x, y) = h(x, y), tensors and arrays agree; the smoothed h is near
    1 at the origin and well below 1 on a narrow ridge (h = 1 at (0, 0.9) too, but the ridge is narrow)."""
    ys = np.linspace(-2, 2, 41)
    np.testing.assert_allclose(minima.h(np.zeros_like(ys), ys), 1.0)
    g = np.random.default_rng(0)
    x, y = g.uniform(-1, 1, 100), g.uniform(-1, 1, 100)
    np.testing.assert_allclose(minima.h(-x, y), minima.h(x, y), rtol=1e-12)
    np.testing.assert_allclose(minima.h(torch.tensor(x), torch.tensor(y)).numpy(), minima.h(x, y), rtol=1e-12)
    assert minima.smoothed_h([0.0, 0.0]) > 0.98
    assert minima.h(0.0, 0.9) == 1.0 and minima.smoothed_h([0.0, 0.9]) < 0.8


def test_reduced_run_writes_paths_table_and_figure(tmp_path):
    out = tmp_path / "minima"
    assert main(["minima", "--quick", "--out", str(out), "--jobs", "1"]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {f"gd/start{i}" for i in range(4)} | {f"vo/start{i}/seed0" for i in range(4)}
    for key, r in runs.items():
        start = minima.STARTS[int(key.split("start")[1][0])]
        assert r["path"][0][1:] == pytest.approx(list(start)) and r["path"][-1][0] == 200
        assert r["end"] == r["path"][-1][1:]
    # VadaGrad continues from Vadam's q: its precision only grows, so the final σ is below the switch's
    for i in range(4):
        r = runs[f"vo/start{i}/seed0"]
        assert all(f <= s * (1 + 1e-12) for f, s in zip(r["final_std"], r["switch_std"], strict=True))
    assert "| (+0.70, +0.80) | gradient descent |" in (out / "table.md").read_text()
    assert (out / "minima.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
