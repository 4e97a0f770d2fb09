"""Every number docs/results/claims.toml lists is recomputed from its results.json and found in its README
(issue 33: the prose around the results must not drift from the data). The checker is tests/claims_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from claims_check import ROOT, check, evaluate, load_claims, other_path, results_path, t_test_p, value

CLAIMS = load_claims()


def _id(claim: dict[str, Any]) -> str:
    return f"{Path(claim['readme']).parent.name}:{claim['text'][:40]}"


def test_the_claims_cover_the_results_folders() -> None:
    folders = {Path(c["readme"]).parts[2] for c in CLAIMS if c["readme"].startswith("docs/results/")}
    assert len(CLAIMS) >= 30
    assert len(folders) >= 12, sorted(folders)


@pytest.mark.parametrize("claim", CLAIMS, ids=[_id(c) for c in CLAIMS])
def test_readme_states_the_recomputed_number(claim: dict[str, Any]) -> None:
    for path in (results_path(claim), other_path(claim)):
        if path is not None and not path.is_file():
            pytest.skip(f"{path.relative_to(ROOT)} is absent: nothing to recompute")
    assert check(claim) is None, check(claim)


def _folder(tmp_path: Path, readme: str, rmse: list[float]) -> dict[str, Any]:
    (tmp_path / "r").mkdir(exist_ok=True)
    (tmp_path / "r" / "README.md").write_text(readme, encoding="utf-8")
    runs = {f"vadam/yacht/{i}": {"rmse": x} for i, x in enumerate(rmse)}
    (tmp_path / "r" / "results.json").write_text(json.dumps({"runs": runs}), encoding="utf-8")
    return {
        "readme": "r/README.md",
        "text": "Vadam's RMSE is {0} ± {1} over {2}\nsplits",
        "values": [
            {"expr": "mean(sel('runs', 'vadam/yacht/*', 'rmse'))", "fmt": ".2f"},
            {"expr": "sem(sel('runs', 'vadam/yacht/*', 'rmse'))", "fmt": ".2f"},
            {"expr": "count(sel('runs', 'vadam/*/*', 'rmse'))", "fmt": "d"},
        ],
    }


def test_checker_passes_a_true_claim_across_a_line_break(tmp_path: Path) -> None:
    claim = _folder(tmp_path, "Here Vadam's RMSE is 2.00 ± 0.58 over\n3 splits.\n", [1.0, 2.0, 3.0])
    assert check(claim, root=tmp_path) is None


def test_checker_fails_when_the_data_moves(tmp_path: Path) -> None:
    claim = _folder(tmp_path, "Here Vadam's RMSE is 2.00 ± 0.58 over 3 splits.\n", [1.0, 2.0, 3.3])
    message = check(claim, root=tmp_path)
    assert message is not None and "2.10 ± 0.67 over 3 splits" in message


def test_checker_fails_when_the_prose_moves(tmp_path: Path) -> None:
    claim = _folder(tmp_path, "Here Vadam's RMSE is about 2 over 3 splits.\n", [1.0, 2.0, 3.0])
    assert check(claim, root=tmp_path) is not None


def test_other_compares_a_run_with_an_earlier_one(tmp_path: Path) -> None:
    claim = _folder(tmp_path, "", [1.0, 2.0, 3.0])
    before = {"runs": {f"vadam/yacht/{i}": {"rmse": x} for i, x in enumerate([2.0, 4.0, 3.0])}}
    (tmp_path / "r" / "before.json").write_text(json.dumps(before), encoding="utf-8")
    # the paired differences 1 − 2, 2 − 4, 3 − 3: mean −1, s.d. 1, t = −√3 on 2 degrees of freedom, whose
    # two-sided p is 1 − |t|/√(2 + t²) (Student's t with 2 d.o.f. has that closed-form CDF)
    exact = 1.0 - 3.0**0.5 / 5.0**0.5
    claim |= {
        "other": "before.json",
        "text": "RMSE {0} before, {1} now (paired p = {2})",
        "values": [
            {"expr": "mean(osel('runs', 'vadam/yacht/*', 'rmse'))", "fmt": ".2f"},
            {"expr": "mean(sel('runs', 'vadam/yacht/*', 'rmse'))", "fmt": ".2f"},
            {"expr": "paired_p(sel('runs', 'vadam/yacht/*', 'rmse'), osel('runs', 'vadam/yacht/*', 'rmse'))",
             "fmt": ".4f"},
        ],
    }  # fmt: skip
    (tmp_path / "r" / "README.md").write_text(f"RMSE 3.00 before, 2.00 now (paired p = {exact:.4f})")
    assert check(claim, root=tmp_path) is None
    with pytest.raises(ValueError, match="unknown function 'osel'"):
        evaluate("mean(osel('runs', 'vadam/yacht/*', 'rmse'))", {"runs": {}})


def test_each_and_over_count_per_item() -> None:
    results = {"runs": {"a/x/0": 1.0, "a/x/1": 3.0, "b/x/0": 2.0, "b/x/1": 2.0, "a/y/0": 5.0, "b/y/0": 1.0}}
    spec = {"expr": "mean(sel('runs', 'a/{e}/*')) < mean(sel('runs', 'b/{e}/*'))", "each": ["x", "y"]}
    assert value({**spec, "over": "sum"}, results) == 0.0  # x: 2 vs 2, y: 5 vs 1
    assert evaluate("sel('runs', 'a/x/*')[-1]", results) == 3.0  # natural key order


@pytest.mark.parametrize(
    "expr",
    ["__import__('os').system('true')", "sel.__globals__", "open('x')", "mean(x=1)", "[c for c in 'ab']"],
)
def test_an_expression_cannot_run_code(expr: str) -> None:
    with pytest.raises(ValueError, match=r"unknown function|not allowed"):
        evaluate(expr, {})


@pytest.mark.parametrize(("t", "df"), [(12.706, 1), (3.182, 3), (2.262, 9), (2.045, 29)])
def test_t_test_p_at_the_tables_5_percent_points(t: float, df: int) -> None:
    # a sample of n = df + 1 points whose t statistic is t: mean t·s/√n, any spread
    n = df + 1
    x = [1.0, -1.0] * (n // 2) + [0.0] * (n % 2)
    s = float(np.std(x, ddof=1))
    shifted = [v + t * s / np.sqrt(n) for v in x]
    assert t_test_p(shifted) == pytest.approx(0.05, abs=2e-4)


def test_over_an_expression_of_the_items_holm_and_a_stage_slice() -> None:
    # issue 48: per-set p-values Holm-adjusted in the claim, a stage of per-seed values combined
    results = {"p": {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}}
    spec = {"expr": "one(sel('p', '{e}'))", "each": ["a", "b", "c", "d"]}
    assert value({**spec, "over": "holm(items())[2]"}, results) == pytest.approx(0.06)  # 2 · 0.03
    assert value({**spec, "over": "sum(holm(items()) < 0.05)"}, results) == 2.0  # a (0.03) and d (0.02)
    assert value({**spec, "over": "max(items()[1:3])"}, results) == pytest.approx(0.04)
    with pytest.raises(ValueError, match="not allowed"):
        evaluate("sel('p', 'a')[::2]", results)
