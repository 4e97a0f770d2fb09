"""`ngvi uci`: a 2-split, 2-epoch smoke run of every method (BO path included), resuming, merging results
run in pieces, BO warm starts, BBVI's batched samples, and the report's bolding and formatting rules on
synthetic results."""

from __future__ import annotations

import json
import math

import optuna
import pytest
import torch
from torch import nn

from conftest import need_data
from ngvi.baselines import BBVI
from ngvi.experiments.cli import main
from ngvi.experiments.core.report import bold_set, fmt_mean_se
from ngvi.experiments.core.tuning import LogUniform, storage
from ngvi.experiments.uci.experiment import STANDARD_SETS, _prior_prec_cell, fit_seconds, shipped_hparams
from ngvi.experiments.uci.methods import METHODS
from ngvi.experiments.uci.report import METRICS, _per_split, build_table
from ngvi.experiments.uci.tuning import prior_prec_at_bound, search_space, tau_at_bound, tune

AVAILABLE = [name for name, m in METHODS.items() if m.method.available()]


def run_uci(datasets, methods, splits, tune_mode, out, *, merge_from=(), jobs=2, data_dir=None) -> dict:
    """`ngvi uci` with these arguments; the results.json it leaves."""
    args = ["uci", "--datasets", ",".join(datasets), "--methods", ",".join(methods), "--splits", str(splits)]
    args += ["--tune", tune_mode, "--out", str(out), "--jobs", str(jobs)]
    args += ["--merge-from", ",".join(map(str, merge_from))] if merge_from else []
    args += ["--data-dir", data_dir] if data_dir else []
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


def _bold(results, dataset, methods, metric):
    return bold_set({m: _per_split(results, dataset, m, metric) for m in methods}, METRICS[metric][1])


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("uci")
    args = ["uci", "--datasets", "yacht", "--methods", ",".join(AVAILABLE), "--splits", "2", "--epochs", "2"]
    args += ["--tune", "bo", "--trials", "2", "--folds", "2", "--jobs", "2", "--out", str(out)]
    args += ["--data-dir", str(need_data("uci"))]
    assert main(args) == 0
    return out, args


def test_smoke_run_writes_a_valid_table_for_every_method(smoke_run):
    out, _ = smoke_run
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 * len(AVAILABLE)
    for key, run in results["runs"].items():
        assert run["rmse"] > 0 and run["loglik"] < 10, key
        assert len(run["curve"]) == 2
    table = (out / "table.md").read_text()
    for name in AVAILABLE:
        assert f"{METHODS[name].label} (ours)" in table
    assert "| yacht |" in table and "Comparison with the papers" in table
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    tuned = json.loads((out / "tuned.json").read_text())
    assert set(tuned) == {f"yacht/{m}" for m in AVAILABLE}
    assert all(v["budget"] == {"trials": 2, "folds": 2, "epochs": 2} for v in tuned.values())
    assert tuned["yacht/mc_dropout"]["dropout"] in (0.005, 0.01, 0.05, 0.1)  # Gal's grid
    assert tuned["yacht/mc_dropout"]["prior_prec"] == pytest.approx(1e-4)  # Gal's length-scale, not tuned


def test_rerun_resumes_without_refitting(smoke_run, data_dir):
    out, args = smoke_run
    before = json.loads((out / "results.json").read_text())
    assert main([*args[:-2], "--data-dir", str(data_dir)]) == 0
    after = json.loads((out / "results.json").read_text())
    assert after["runs"] == before["runs"]


def test_clear_errors(tmp_path, capsys, data_dir):
    assert main(["uci", "--methods", "sgd", "--out", str(tmp_path)]) == 2
    assert "--methods: unknown sgd" in capsys.readouterr().err
    args = ["uci", "--datasets", "yacht", "--methods", "vprop", "--tune", "none", "--epochs", "3"]
    assert main([*args, "--out", str(tmp_path), "--data-dir", str(data_dir)]) == 2
    assert "no tuned hyperparameters" in capsys.readouterr().err
    assert (
        main(["uci", "--datasets", "yacht", "--out", str(tmp_path), "--data-dir", str(tmp_path / "nope")])
        == 2
    )
    assert "NGVI_DATA" in capsys.readouterr().err


def test_shipped_hyperparameters_cover_the_committed_table():
    """``--tune none`` reproduces docs/results/uci from these: every standard set for the table's methods."""
    shipped = shipped_hparams()
    for dataset in STANDARD_SETS:
        for method in ("vadam", "bbvi", "mc_dropout", "vogn", "noisy_kfac"):
            hp = shipped[f"{dataset}/{method}"]
            assert hp["prior_prec"] > 0 and hp["noise_prec"] > 0 and hp["budget"]["epochs"] == 40
    rates = {hp["dropout"] for k, hp in shipped.items() if k.endswith("/mc_dropout")}
    assert rates <= {0.005, 0.01, 0.05, 0.1}  # Gal's grid


def fake_results(values: dict[str, list[float]]) -> dict:
    runs = {}
    for method, vs in values.items():
        for split, v in enumerate(vs):
            runs[f"yacht/{method}/{split}"] = {"rmse": v, "loglik": -v, "curve": [v, v]}
    return {"runs": runs, "hparams": {}}


def test_paired_t_test_bolding():
    # vadam is best; bbvi differs by a constant 0.5 on every split (significant); map by noise (not)
    base = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.15, 1.0]
    noise = [0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.03]
    results = fake_results(
        {
            "vadam": base,
            "bbvi": [b + 0.5 for b in base],
            "map": [b + n for b, n in zip(base, noise, strict=True)],
        }
    )
    assert _bold(results, "yacht", ["vadam", "bbvi", "map"], "rmse") == {"vadam", "map"}
    assert _bold(results, "yacht", ["vadam", "bbvi", "map"], "loglik") == {"vadam", "map"}
    table = build_table(results, ["yacht"], ["vadam", "bbvi"], "# header\n")
    assert "**1.044 ± 0.036 (8)**" in table and "1.32 ± 0.10" in table  # ours bold, Khan et al.'s Vadam row


def test_number_format_follows_the_standard_error():
    assert fmt_mean_se(3.9312, 0.2634) == "3.93 ± 0.26"
    assert fmt_mean_se(0.000612, 0.0000123) == "0.00061 ± 0.00001"
    assert fmt_mean_se(4.72, 0.0) == "4.72 ± 0.00"
    assert fmt_mean_se(4.72, float("nan")) == "4.720 (no s.e.)"  # one split: no standard error, no ± nan


def _bbvi_first_gradients(copies: int, mc_samples: int, seed: int) -> torch.Tensor:
    """BBVI's first-step gradient estimate (μ and log σ) on a fixed minibatch: with β₁ = 0, Adam's first
    moment after one step is that estimate."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = BBVI(model, 50, lr=1e-3, betas=(0.0, 0.999), init_prec=4.0, mc_samples=mc_samples, seed=seed)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, generator=g), torch.randn(6, 1, generator=g)
    xb, yb = x.repeat(copies, 1), y.repeat(copies, 1)

    def closure():
        opt.zero_grad()
        loss = ((model(xb) - yb) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    states = [opt.state[p] for p in model.parameters()]
    return torch.cat([torch.cat([s["exp_avg"].flatten(), s["log_std_exp_avg"].flatten()]) for s in states])


def test_bbvi_samples_as_minibatch_copies_is_the_same_estimator():
    """The UCI protocol draws BBVI's S train samples as S copies of the minibatch in one pass
    (``samples_in_batch``). Under the local reparameterisation every row gets its own noise, so both
    estimators have the same distribution: per coordinate, their means and their variances agree within 4
    standard errors (that of a variance estimate from the fourth central moment)."""
    assert METHODS["bbvi"].samples_in_batch
    draws = 400
    several = torch.stack([_bbvi_first_gradients(1, 5, seed) for seed in range(draws)]).double()
    copies = torch.stack([_bbvi_first_gradients(5, 1, seed) for seed in range(draws, 2 * draws)]).double()

    def mean_var_and_their_se2(x):
        mean, var = x.mean(0), x.var(0)
        fourth = (x - mean).pow(4).mean(0)
        return mean, var, var / draws, (fourth - var**2) / draws

    m1, v1, m1_se2, v1_se2 = mean_var_and_their_se2(several)
    m2, v2, m2_se2, v2_se2 = mean_var_and_their_se2(copies)
    assert ((m1 - m2).abs() <= 4 * (m1_se2 + m2_se2).sqrt() + 1e-7).all()
    assert ((v1 - v2).abs() <= 4 * (v1_se2 + v2_se2).sqrt() + 1e-12).all()
    assert (v1 > 0).all()  # every coordinate is random (the check above is not vacuous)


def test_bo_evaluates_the_warm_starts_first(tmp_path):
    seen = []

    def cv_loglik(hp):
        seen.append(hp)
        return -((math.log(hp["noise_prec"]) - 2.0) ** 2) - (math.log(hp["prior_prec"]) - 1.0) ** 2

    starts = [{"noise_prec": math.exp(2.0), "prior_prec": math.e}, {"noise_prec": 1e5, "prior_prec": 1.0}]
    best = tune(METHODS["vogn"], "yacht", cv_loglik, 3, tmp_path / "j.log", {"name": "test"}, starts=starts)
    assert seen[0] == pytest.approx(starts[0])
    assert seen[1] == pytest.approx({"noise_prec": math.exp(9.0), "prior_prec": 1.0})  # clipped to log τ ≤ 9
    assert best["noise_prec"] == pytest.approx(math.exp(2.0)) and best["cv_loglik"] == pytest.approx(0.0)
    assert best["noise_prec_box"] == [0.0, 9.0]  # recorded, so that a report can tell an edge
    assert best["prior_prec_box"] == [-4.0, 8.0]


def test_tau_on_the_edge_of_its_box_is_marked():
    """τ's box tops out at e⁹ (naval's fit supports τ ≈ 5,400; Khan et al.'s e⁵ = 148 held 7 cells on its
    edge); entries without a recorded box were tuned in Khan et al.'s, log τ ∈ [0, 5] ([1, 5] for naval)."""
    assert search_space("yacht", METHODS["vadam"])["noise_prec"] == LogUniform(0.0, 9.0)
    assert search_space("naval-propulsion-plant", METHODS["vadam"])["noise_prec"] == LogUniform(1.0, 9.0)
    old = {"prior_prec": 1.0, "source": "bo"}
    assert tau_at_bound("yacht", {**old, "noise_prec": 148.4131591025766}) == 5.0
    assert tau_at_bound("energy", {**old, "noise_prec": 147.52597564407685}) == 5.0  # log τ = 4.994
    assert tau_at_bound("naval-propulsion-plant", {**old, "noise_prec": 128.33589956166102}) is None
    assert tau_at_bound("naval-propulsion-plant", {**old, "noise_prec": math.e}) == 1.0
    assert tau_at_bound("yacht", {**old, "noise_prec": 148.4, "noise_prec_box": [0.0, 9.0]}) is None
    assert tau_at_bound("yacht", {**old, "noise_prec": math.exp(9.0), "noise_prec_box": [0.0, 9.0]}) == 9.0


def test_prior_prec_on_the_edge_of_its_box_is_marked():
    """λ's box is log λ ∈ [−4, 8] ([−3, 8] for naval and power; Khan et al.'s top e⁴ held 3 cells, and
    entries without a recorded box were tuned in their [−4, 4]); a tuned λ on a bound is marked in the
    table, MC dropout's fixed λ (Gal's 10⁻⁴) never."""
    assert search_space("power-plant", METHODS["vadam"])["prior_prec"] == LogUniform(-3.0, 8.0)
    entry = {"noise_prec": 10.0, "source": "bo"}
    assert prior_prec_at_bound("yacht", {**entry, "prior_prec": 54.598150033144236}) == 4.0
    assert prior_prec_at_bound("kin8nm", {**entry, "prior_prec": 0.01831563888873418}) == -4.0
    assert prior_prec_at_bound("power-plant", {**entry, "prior_prec": 0.049787068367863944}) == -3.0
    assert prior_prec_at_bound("yacht", {**entry, "prior_prec": 0.049787068367863944}) is None
    wider = {**entry, "prior_prec_box": [-4.0, 8.0]}
    assert prior_prec_at_bound("yacht", {**wider, "prior_prec": 54.598150033144236}) is None
    assert prior_prec_at_bound("yacht", {**wider, "prior_prec": math.exp(8.0)}) == 8.0
    edge = _prior_prec_cell("yacht/bbvi", {**entry, "prior_prec": math.exp(4.0)})
    assert edge == "54.6 **at e^4 (box edge)**"
    assert _prior_prec_cell("yacht/mc_dropout", {**entry, "prior_prec": 1e-4}) == "0.0001"


def test_merge_builds_one_table_from_pieces(tmp_path, capsys, data_dir):
    config = {"protocol": {"epochs": 40, "eval_samples": 100, "curve": True}, "seed": 0}
    hp = {
        "prior_prec": 1.0,
        "noise_prec": 10.0,
        "source": "bo",
        "budget": {"trials": 1, "folds": 2, "epochs": 40},
    }
    for method in ("vadam", "bbvi"):
        piece = tmp_path / method
        piece.mkdir()
        runs = {
            f"yacht/{method}/{s}": {"rmse": 1.0 + s, "loglik": -1.0, "curve": [1.0], "seconds": 2.0}
            for s in (0, 1)
        }
        runs["concrete/vadam/0"] = {"rmse": 5.0, "loglik": -3.0, "curve": [5.0], "seconds": 2.0}  # not wanted
        (piece / "results.json").write_text(json.dumps({"config": config, "runs": runs, "hparams": {}}))
        (piece / "tuned.json").write_text(json.dumps({f"yacht/{method}": hp}))
    out = tmp_path / "all"
    results = run_uci(
        ["yacht"],
        ["vadam", "bbvi"],
        2,
        "none",
        out,
        merge_from=[tmp_path / "vadam", tmp_path / "bbvi"],
        data_dir=str(data_dir),
    )
    assert sorted(results["runs"]) == ["yacht/bbvi/0", "yacht/bbvi/1", "yacht/vadam/0", "yacht/vadam/1"]
    assert set(json.loads((out / "tuned.json").read_text())) == {"yacht/vadam", "yacht/bbvi"}
    assert fit_seconds(results, ["yacht"], "vadam") == 4.0
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"config": {**config, "seed": 1}, "runs": {}}))
    args = ["uci", "--datasets", "yacht", "--methods", "vadam", "--out", str(out), "--merge-from", str(other)]
    assert main([*args, "--data-dir", str(data_dir)]) == 2
    assert "same protocol and seed" in capsys.readouterr().err


def test_bo_scores_a_diverged_fit_as_the_worst_value_so_far(tmp_path):
    def cv_loglik(hp):
        if hp["noise_prec"] > math.exp(4.0):
            raise FloatingPointError("diverged")
        return -((math.log(hp["noise_prec"]) - 2.0) ** 2)

    starts = [
        {"noise_prec": math.exp(1.0), "prior_prec": 1.0},
        {"noise_prec": math.exp(4.5), "prior_prec": 1.0},
    ]
    best = tune(METHODS["vogn"], "yacht", cv_loglik, 8, tmp_path / "j.log", {"name": "test"}, starts=starts)
    journal = storage(tmp_path / "j.log")
    (name,) = optuna.get_all_study_names(journal)
    assert name.startswith("yacht/vogn/")
    study = optuna.load_study(study_name=name, storage=journal)
    second = study.trials[1]
    assert second.user_attrs["diverged"] and second.value == pytest.approx(-1.0)  # the first trial's value
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert best["diverged_trials"] >= 1 and best["noise_prec"] <= math.exp(4.0)


def test_diverged_fits_are_left_out_and_listed():
    results = fake_results({"vadam": [1.0, 1.2, 0.9], "bbvi": [1.1, 1.3, 1.0]})
    results["runs"]["yacht/bbvi/2"] = {"diverged": "non-finite gradient"}
    table = build_table(results, ["yacht"], ["vadam", "bbvi"], "# header\n")
    assert "1.20 ± 0.10 (2)" in table  # bbvi: the mean of its two finished splits
    assert "Diverged fits" in table and "BBVI on yacht: 1" in table


def test_a_diverged_fit_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch, data_dir):
    from ngvi.experiments.uci import experiment
    from ngvi.optim import NonFiniteGradientError

    def diverge(*args, **kwargs):
        raise NonFiniteGradientError("non-finite gradient")

    monkeypatch.setattr(experiment, "fit", diverge)
    (tmp_path / "tuned.json").write_text(json.dumps({"yacht/vadam": {"prior_prec": 1.0, "noise_prec": 1.0}}))
    results = run_uci(["yacht"], ["vadam"], 2, "none", tmp_path, jobs=1, data_dir=str(data_dir))
    assert results["runs"] == {f"yacht/vadam/{s}": {"diverged": "non-finite gradient"} for s in (0, 1)}


def test_loglik_cells_whose_tau_sits_on_the_box_edge_are_marked():
    results = fake_results({"vadam": [1.0, 1.2, 0.9], "bbvi": [1.1, 1.3, 1.0]})
    results["hparams"] = {
        "yacht/vadam": {"prior_prec": 54.6, "noise_prec": 148.4131591025766, "source": "bo"},  # e⁵, old box
        "yacht/bbvi": {"prior_prec": 0.2, "noise_prec": 148.4, "source": "bo", "noise_prec_box": [0.0, 9.0]},
    }
    table = build_table(results, ["yacht"], ["vadam", "bbvi"], "# header\n")
    rmse, loglik = table.split("## Test log-likelihood")
    assert "†" not in rmse.split("†: τ")[0]  # RMSE cells are not marked
    vadam_cell = loglik.split("| yacht | ")[1].split(" |")[0]
    assert vadam_cell.endswith(" †")  # tuned in Khan et al.'s box, on its top
    bbvi_cell = loglik.split("| yacht | ")[1].split(" | ")[2]
    assert "†" not in bbvi_cell  # the same τ inside the wider box
