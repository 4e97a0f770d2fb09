"""`ngvi continual` in its reduced form: runs through the CLI on real MNIST (2 tasks of 300 images), writes
its PNG, table and results, resumes; and the EWC penalty is (λ/2) Σₖ Fₖ⊙(θ − θₖ)² up to a constant."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ngvi.experiments import continual
from ngvi.experiments.cli import main


@pytest.mark.data("mnist")
@pytest.mark.usefixtures("data_dir")  # found through $NGVI_DATA
def test_continual_quick_writes_png_table_and_resumes(tmp_path):
    out = tmp_path / "continual"
    args = [
        "continual",
        "--quick",
        "--arms",
        "adam,ewc,vogn",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--jobs",
        "1",
    ]
    assert main(args) == 0
    png = (out / "continual.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert "## permuted MNIST (2 tasks)" in table and "## split MNIST (2 tasks)" in table
    assert "| VOGN + coreset |" in table and "| EWC |" in table and "VCL + coreset 98.4" in table
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {
        f"{b}/{a}/seed0" for b in ("permuted", "split") for a in ("adam", "ewc", "vogn", "vogn+coreset")
    }
    for r in runs.values():
        assert [len(a) for a in r["accuracy"]] == [1, 2]  # after task t: the t tasks seen
        assert r["average"] == pytest.approx([sum(a) / len(a) for a in r["accuracy"]])
    assert runs["split/adam/seed0"]["accuracy"][0][0] > 0.9  # 0 vs 1 from 300 images: easy
    assert main(args) == 0  # everything cached: nothing is trained again
    assert json.loads((out / "results.json").read_text())["runs"] == runs


def test_ewc_penalty_is_the_quadratic_around_each_tasks_weights():
    """With Fisher F₁, F₂ at θ₁, θ₂ the kept sums give (λ/2)Σₖ Fₖ(θ − θₖ)² minus its value at θ = 0, so its
    gradient is λ Σₖ Fₖ(θ − θₖ) exactly."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ewc = continual._EWC(model, lam=7.0)
    fishers, anchors = [], []
    for _ in range(2):
        f = [torch.rand_like(p) for p in model.parameters()]
        theta = [torch.randn_like(p) for p in model.parameters()]
        for i, (fi, ti) in enumerate(zip(f, theta, strict=True)):
            ewc.fisher[i] += fi
            ewc.anchor[i] += fi * ti
        fishers.append(f)
        anchors.append(theta)
    model.zero_grad()
    ewc().backward()
    for i, p in enumerate(model.parameters()):
        want = 7.0 * sum(f[i] * (p.detach() - t[i]) for f, t in zip(fishers, anchors, strict=True))
        torch.testing.assert_close(p.grad, want)
