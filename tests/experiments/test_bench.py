"""`ngvi bench --quick`: runs through the CLI on tiny models and writes its table (× Adam, × floor, the
project's targets), JSON and plot, resumes, and refuses bad arguments in one line. No timing assertions:
timings are noise on shared machines; only structure and sanity."""

from __future__ import annotations

import json
import math

import ngvi
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
    assert list(mlp)[:2] == ["adam", "floor"]  # the references are always timed, in the same rounds
    assert set(mlp) >= {"vadam", "vadam-compiled", "ivon"}
    assert all(math.isfinite(r["seconds"]) and r["seconds"] > 0 and r["peak_bytes"] > 0 for r in mlp.values())
    assert {"sweep/8", "sweep/16"} <= set(results["runs"])
    table = (out / "table.md").read_text()
    assert "| ngvi.Vadam |" in table and "| ngvi.Vadam, compile=True |" in table
    assert "× Adam | × floor |" in table and "Project targets" in table and "issue" not in table
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
