"""`ngvi bench --quick`: runs through the CLI on tiny models and writes its table (× Adam, × floor, the
project's targets), JSON and plot, resumes, and refuses bad arguments in one line. No timing assertions:
timings are noise on shared machines; only structure and sanity."""

from __future__ import annotations

import json
import math

import torch

import ngvi
from ngvi.experiments.bench import measure
from ngvi.experiments.cli import main


def test_bench_quick_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--out", str(out), "--models", "mlp", "--sweep", "8,16"]
    argv += ["--methods", "vadam,vadam-compiled,ivon,vogn"]
    assert main(argv) == 0
    png = (out / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    mlp = results["runs"]["problem/mlp"]["methods"]
    assert list(mlp)[:3] == ["adam", "floor", "fwd_bwd"]  # the references: always timed, in the same rounds
    assert set(mlp) >= {"vadam", "vadam-compiled", "ivon"}
    assert all(math.isfinite(r["seconds"]) and r["seconds"] > 0 and r["peak_bytes"] > 0 for r in mlp.values())
    # every method counted, the compiled one too (torch.compile runs under the bench's counter)
    assert all("count_error" not in r and r["aten_ops"] > 0 and r["host_syncs"] >= 0 for r in mlp.values())
    fb = mlp["fwd_bwd"]
    for r in mlp.values():
        assert r["seconds_over_fwd_bwd"] == r["seconds"] - fb["seconds"]
        assert r["aten_ops_over_fwd_bwd"] == r["aten_ops"] - fb["aten_ops"]
    assert "kernel_launches" not in fb  # CUDA only
    assert not any("aten_ops" in r for r in results["runs"]["sweep/8"]["methods"].values())  # not counted
    assert {"sweep/8", "sweep/16"} <= set(results["runs"])
    table = (out / "table.md").read_text()
    assert "| ngvi.Vadam |" in table and "| ngvi.Vadam, compile=True |" in table
    assert "× Adam | × floor |" in table and "Project targets" in table and "issue" not in table
    assert "| over fwd+bwd [ms] | ATen ops/step | host syncs/step |" in table
    assert f"Forward + backward alone: {fb['aten_ops']:.0f} ATen ops and 0 host syncs per step." in table
    assert "vadam-compiled time ≤ 1.10× the floor" in table
    if not hasattr(ngvi, "VOGN"):
        assert "vogn: not available in this build" in table
    # a rerun resumes: nothing is timed again
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == results["runs"]


def test_bench_rejects_bad_arguments_in_one_line(tmp_path, capsys):
    for argv, expected in (
        (["--methods", "sgd"], "--methods: unknown sgd"),
        (["--rounds", "0"], "--rounds: expected a positive integer, got 0"),
        (["--sweep", "100,-3"], "--sweep: "),
        (["--models", "rnn"], "--models: unknown rnn"),
    ):
        assert main(["bench", "--quick", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err


def test_kfac_flop_floor_counts_the_layers():
    """forward B·o·d, backward twice that (once for the first layer), factors B(d'² + o²), preconditioning
    o·d'(o + d'), per layer, for Linear layers and a Conv2d (T = output pixels, d = C_in·k²)."""
    import torch
    from torch import nn

    from ngvi.experiments.bench.flops import kfac_flops
    from ngvi.experiments.bench.report import _kfac_floor

    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 16, 5))
    f = kfac_flops(model, torch.zeros(7, 1, 4, 4), stats_every=2)
    conv, lin = (16, 2, 9, 10), (1, 5, 32, 33)  # T, o, d, d'
    assert f.forward() == 7 * (16 * 2 * 9 + 5 * 32)
    assert f.backward() == 7 * (16 * 2 * 9 + 2 * 5 * 32)
    assert f.factors() == 7 * sum(t * (dp**2 + o**2) for t, o, _, dp in (conv, lin)) / 2
    assert f.preconditioning() == sum(o * dp * (o + dp) for _, o, _, dp in (conv, lin))
    assert f.floor() == f.forward() + f.backward() + f.factors() + f.preconditioning()
    res = {
        "methods": {
            "adam": {"label": "Adam", "seconds": 0.01},
            "kfac": {"label": "K-FAC", "seconds": 0.04},
            "noisy_kfac": {"label": "noisy K-FAC", "seconds": 0.05},
        },
        "kfac_flops": f.terms(),
        "matmul_flops_per_second": 2 * f.floor() / 0.02,  # the floor takes 20 ms at this rate
    }
    text = _kfac_floor(res)
    assert "| noisy K-FAC | 50.0 | 5.00× | 1.25× | 2.50× |" in text and "| floor |" in text


def test_bench_times_the_defaults_and_labels_the_pinned_rows():
    """Each rule's row is the optimizer as a user builds it (issue 22: the bench timed init_prec=100); the
    recorded runs' settings are extra rows that say so."""
    import torch
    from torch import nn

    from ngvi.experiments.bench.methods import COMPILED, methods

    timed = methods()
    assert set(COMPILED) == {"vadam", "vprop", "von", "ivon", "noisy_adam", "vadagrad"}
    model = nn.Linear(3, 2)
    step = timed["vadam"].build(model, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    (opt,) = [c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, torch.optim.Optimizer)]
    assert opt.param_groups[0]["init_prec"] == "auto"
    assert timed["vprop"].build(model, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    assert "init_prec=100.0" in timed["vadam-pinned"].label and "recorded runs" in timed["vadam-pinned"].label


def test_bench_table_has_the_floor_kfac_and_spread_columns():
    from ngvi.experiments.bench.report import table

    row = {"label": "x", "seconds": 0.02, "fastest": 0.018, "slowest": 0.025}
    res = {
        "problem": "p",
        "params": 10,
        "methods": {
            "adam": {**row, "label": "Adam", "seconds": 0.01},
            "floor": {**row, "label": "floor", "seconds": 0.0125},
            "kfac": {**row, "label": "K-FAC", "seconds": 0.04},
            "noisy_kfac": {**row, "label": "noisy K-FAC", "seconds": 0.05, "fastest": 0.05, "slowest": 0.06},
            "vadam": {**row, "label": "Vadam"},
        },
    }
    text = table(
        {
            "environment": {"torch": "t", "device": "cpu", "threads": 1, "processor": "x"},
            "problems": {"mlp": res},
        }
    )
    assert (
        "| method | step [ms] | spread | × Adam | × floor |" in text and "| × K-FAC | × FLOP floor |" in text
    )
    assert "| noisy K-FAC | 50.0 | +0/+20% | 5.00× | 4.00× | – | – | 1.25× | – |" in text
    assert "| Vadam | 20.0 | -10/+25% | 2.00× | 1.60× | – | – | – | – | – | – | – |" in text  # not counted
    assert "| vadam time ≤ 1.25× the floor | 1.600 | **missed** |" in text
    assert "Forward + backward alone" not in text


def test_bench_table_shows_the_step_beyond_forward_backward_ops_and_syncs():
    """The counting columns, from the fields :func:`measure.run_problem` writes: ATen ops on the CPU,
    kernel launches where they were recorded (CUDA); forward + backward's own counts below the table."""
    from ngvi.experiments.bench.report import table

    fb = {"label": "fwd+bwd", "seconds": 0.008, "aten_ops": 300.0, "host_syncs": 0.0}
    vadam = {"label": "Vadam", "seconds": 0.0125, "aten_ops": 342.0, "host_syncs": 1.0}
    kfac = {"label": "K-FAC", "seconds": 0.05, "aten_ops": 512.4, "host_syncs": 1.1}
    entries = {"adam": {"label": "Adam", "seconds": 0.01, "aten_ops": 374.0, "host_syncs": 0.0}}
    entries |= {"fwd_bwd": fb, "vadam": vadam, "kfac": kfac, "ivon": {"label": "IVON", "seconds": 0.02}}
    entries["ivon"]["count_error"] = "RuntimeError: no"
    measure.over_forward_backward(entries)
    assert vadam["aten_ops_over_fwd_bwd"] == 42 and math.isclose(vadam["seconds_over_fwd_bwd"], 0.0045)
    env = {"torch": "t", "device": "cpu", "threads": 1, "processor": "x"}
    problems = {"mlp": {"problem": "p", "params": 10, "methods": entries}}
    text = table({"environment": env, "problems": problems})
    assert "| × FLOP floor | over fwd+bwd [ms] | ATen ops/step | host syncs/step | peak [MiB] |" in text
    assert "| Vadam | 12.5 | – | 1.25× | – | – | – | – | – | 4.5 | 42 | 1 | – | – |" in text
    assert "| fwd+bwd | 8.0 | – | 0.80× | – | – | – | – | – | 0.0 | 0 | 0 | – | – |" in text
    assert "| 1.00× | – | 42.0 | 212.4 | 1.1 |" in text  # K-FAC: averaged over a cycle
    assert "Forward + backward alone: 300 ATen ops and 0 host syncs per step." in text
    assert "Not counted: IVON: RuntimeError: no." in text
    for r in entries.values():  # on CUDA: kernel launches instead of ATen ops
        r["kernel_launches"] = r.get("aten_ops", 0.0) + 1000
    measure.over_forward_backward(entries)
    text = table({"environment": env, "problems": problems})
    assert "| over fwd+bwd [ms] | kernel launches/step | host syncs/step |" in text
    assert "Forward + backward alone: 1300 kernel launches and 0 host syncs per step." in text


def test_count_step_counts_the_ops_and_the_host_reads_of_a_step():
    """A step of three ATen ops, one of which reads a value back (``.item()`` dispatches
    ``_local_scalar_dense``); the bench's counter lets torch.compile run (its fused kernels are no ATen
    ops)."""
    from ngvi.experiments.bench.counting import OpCounter, count_step, kernel_launches

    t = torch.zeros(3)
    counts = count_step(lambda: t.add_(1).sum().item(), torch.device("cpu"), steps=4)
    assert counts == {"aten_ops": 3.0, "host_syncs": 1.0}
    assert torch.equal(t, torch.full((3,), 4.0))  # the counted steps ran
    assert OpCounter.ignore_compile_internals()

    class Event:
        def __init__(self, key, count):
            self.key, self.count = key, count

    class Profile:
        def key_averages(self):
            return [Event("cudaLaunchKernel", 7), Event("cuLaunchKernel", 2), Event("aten::add_", 5)]

    assert kernel_launches(Profile()) == 9


def test_bench_counts_per_step_beyond_forward_backward_on_the_chain():
    """On the quick chain (64 Linear layers, 128 tensors): the floor is Adam plus one ``normal_`` per weight
    tensor (128 ATen ops more per step); Vadam's default finiteness check reads one value per step on the
    host, ``finite_check="device"`` none; forward + backward alone reads none. (Times are measured, not
    asserted: a timed test would fail on a loaded machine.)"""
    from ngvi.experiments.bench.methods import Method, methods, ngvi_method

    timed = methods()
    chosen = {name: timed[name] for name in ("adam", "floor", "fwd_bwd", "vadam")}
    chosen["vadam-device"] = Method("Vadam, device check", ngvi_method("vadam", finite_check="device"))
    problem = measure.problems(True)["chain"]
    res = measure.run_problem(problem, chosen, torch.device("cpu"), 2, 5, 4, False, None, count=True)
    ms = res["methods"]
    assert len(list(problem.build().parameters())) == 128
    assert ms["floor"]["aten_ops"] - ms["adam"]["aten_ops"] == 128
    assert ms["fwd_bwd"]["aten_ops_over_fwd_bwd"] == 0 and ms["fwd_bwd"]["host_syncs"] == 0
    assert ms["adam"]["aten_ops_over_fwd_bwd"] > 0
    assert ms["vadam"]["host_syncs"] == 1 and ms["vadam-device"]["host_syncs"] == 0
    assert 0 < ms["vadam"]["aten_ops_over_fwd_bwd"] < ms["adam"]["aten_ops_over_fwd_bwd"]  # flat buffers
    assert ms["adam"]["seconds_over_fwd_bwd"] == ms["adam"]["seconds"] - ms["fwd_bwd"]["seconds"]


def test_reference_packages_are_checked_by_import_not_by_the_registry(monkeypatch):
    """ivon-opt's package is called ``ivon``, which is also a registry method: without it the reference is
    reported missing instead of failing the run."""
    import builtins

    from ngvi.experiments.bench.methods import availability, methods

    real = builtins.__import__

    def no_ivon(name, *args, **kwargs):
        if name == "ivon":
            raise ModuleNotFoundError("No module named 'ivon'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ivon)
    monkeypatch.delitem(__import__("sys").modules, "ivon", raising=False)
    assert "`ivon` not importable" in availability(methods()["ivon-opt"])
    assert availability(methods()["ivon"]) is None


def test_profile_times_the_bench_way_and_compares_with_a_bench(tmp_path):
    from ngvi.experiments.bench import measure
    from ngvi.experiments.bench.profile import profile

    name = measure.problems(True)["mlp"].name
    bench = {
        "runs": {
            "problem/mlp": {
                "problem": name,
                "methods": {"adam": {"seconds": 0.01}, "vadam": {"seconds": 0.025}},
            }
        }
    }
    text = profile("mlp", ("adam", "vadam"), ("vadam",), rounds=2, steps=2, bench=bench, quick=True)
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in text.splitlines()
        if line.startswith("| ")
    }
    vadam = rows["ngvi.Vadam"]
    this, benched, agreement = (
        float(vadam[3].rstrip("×")),
        float(vadam[4].rstrip("×")),
        float(vadam[5].strip(" |")),
    )
    assert benched == 2.5  # the bench's 25 ms over its 10 ms Adam
    assert abs(agreement - this / benched) <= 0.01 + 0.005 * agreement  # rounded to two places
    assert rows["torch.optim.Adam (foreach)"][3] == "1.00×"
    assert "Operators of 2 steps of ngvi.Vadam" in text and "aten::" in text


def test_before_after_builds_each_version_s_own_classes(monkeypatch, capsys):
    """The script against this checkout loaded a second time as its "before": each rule is built from each
    version's own classes (the older registry would build this checkout's), and reported against Adam and
    the floor."""
    import sys
    from pathlib import Path

    from ngvi.experiments.bench import before_after

    src = Path(ngvi.__file__).resolve().parents[1]
    argv = ["before_after", "--before", str(src), "--rounds", "1", "--steps", "1", "--quick"]
    monkeypatch.setattr(sys, "argv", argv)
    before_after.main()
    out = capsys.readouterr().out
    rows = [
        line.split(" | ")[0].strip("| ") for line in out.splitlines() if line.startswith("| ") and "×" in line
    ]
    assert rows == ["rule", *before_after.RULES]  # the header, then one row per rule
    assert "the floor" in out
    before = sys.modules["ngvi_before"]
    model = torch.nn.Linear(3, 2)
    for rule in before_after.RULES:
        assert type(before_after.build(before, rule, model)).__module__.startswith("ngvi_before.")
        assert type(before_after.build(ngvi, rule, model)).__module__.startswith("ngvi.")


def test_the_language_model_and_the_chain_problems():
    """``--models lm``: the GPT-style model's flattened logits against next-token targets (scaled down on the
    CPU, full size on an accelerator); ``chain``: 128 small tensors, the CPU's launch-bound case."""
    from ngvi.experiments.bench.lm import FULL, SMALL

    tiny = measure.problems(True)["lm"]
    x, y = tiny.data(torch.device("cpu"))
    model = tiny.model(torch.device("cpu"))
    logits = model(x)
    assert x.shape == (2, 8) and y.shape == (16,) and logits.shape == (16, 32)
    assert torch.equal(x[:, 1:].flatten(), y.view(2, 8)[:, :-1].flatten())  # targets are the next tokens
    assert not any(p.requires_grad for p in (*model.tokens.parameters(), *model.positions.parameters()))
    assert str(SMALL.blocks) in measure.problems(False)["lm"].name
    assert f"{FULL.blocks}×{FULL.width}" in measure.problems(False, full_lm=True)["lm"].name
    assert len(list(measure.problems(False)["chain"].build().parameters())) == 128
