"""`ngvi charlm`: chunking, metrics and schedule against hand-computed values, and the quick run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ngvi.experiments.charlm import methods
from ngvi.experiments.charlm.model import CharLSTM, Corpus, chunks, evaluate
from ngvi.experiments.cli import main


def test_chunks_are_inputs_and_next_characters():
    x, y = chunks("abcabcab", "abc", 3)  # two chunks of 4: "abca", "bcab"
    assert x.tolist() == [[0, 1, 2], [1, 2, 0]] and y.tolist() == [[1, 2, 0], [2, 0, 1]]
    with pytest.raises(ValueError, match="a text of 3 characters holds no chunk of 4"):
        chunks("abc", "abc", 3)


def test_unigram_entropy_and_metrics_of_a_uniform_model():
    corpus = Corpus.from_text("aabb" * 10, "ab" * 10, 3)
    # targets: training a 10, b 20 (add-one: 11/32, 21/32); test a 5, b 10
    expected = -(math.log(11 / 32) + 2 * math.log(21 / 32)) / 3
    assert corpus.unigram_entropy() == pytest.approx(expected)
    model = CharLSTM(2, 4, 1, 3)
    torch.nn.init.zeros_(model.out.weight)
    torch.nn.init.zeros_(model.out.bias)  # uniform predictions: loss log 2; argmax picks index 0 = "a"
    loss, error = evaluate(model, corpus.x_test, corpus.y_test)
    assert loss == pytest.approx(math.log(2))
    assert error == pytest.approx((corpus.y_test != 0).float().mean().item())


def test_step_size_divides_by_ten_every_scaled_k():
    # SGD: K = 80 of the paper's 200 epochs; in a 50-epoch run K = 20
    assert methods.decay_every("sgd", 50) == 20 and methods.decay_every("adam", 50) == 10
    assert [methods.step_size("sgd", e, 50) for e in (0, 19, 20, 40)] == pytest.approx(
        [0.5, 0.5, 0.05, 0.005]
    )
    assert methods.decay_every("adam", 2) == 1  # never 0


@pytest.mark.data("text/kjv.txt")
def test_quick_run_learns_and_reports_every_method(tmp_path, data_dir):
    out = tmp_path / "charlm"
    assert main(["charlm", "--quick", "--jobs", "1", "--out", str(out), "--data-dir", str(data_dir)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {f"{m}/seed0" for m in methods.OPTIONS}
    for key, r in runs.items():
        assert len(r["test_loss"]) == len(r["test_error"]) == 6 and len(r["train_loss"]) == 5, key
        assert r["diverged_in_epoch"] is None
        assert all(0.0 <= e <= 1.0 for e in r["test_error"])
        assert r["test_loss"][0] == pytest.approx(math.log(63), abs=0.1)  # an untrained model: near uniform
        assert r["test_loss"][-1] < r["test_loss"][0] - 0.3, key  # every method learns
    for name in ("sgd", "adagrad", "vadagrad"):  # below the best context-free model
        assert runs[f"{name}/seed0"]["test_loss"][-1] < runs[f"{name}/seed0"]["unigram_entropy"], name
    table = (out / "table.md").read_text()
    assert "| VadaGrad |" in table and "as SGD" in table
    assert (out / "charlm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vadagrad_init_prec_option_reaches_the_optimizer_and_only_vadagrad():
    model = CharLSTM(5, 4, 1, 3)
    default = methods.build("vadagrad", model, 1000, seed=0)
    chosen = methods.build("vadagrad", model, 1000, seed=0, vadagrad_init_prec=10.0)
    assert default.param_groups[0]["init_prec"] == 1e4 and chosen.param_groups[0]["init_prec"] == 10.0
    assert methods.OPTIONS["vadagrad"].options["init_prec"] == 1e4  # the table is not edited in place
    adam = methods.build("adam", model, 1000, seed=0, vadagrad_init_prec=10.0)
    assert adam.defaults["lr"] == methods.OPTIONS["adam"].options["lr"]


def test_vadagrad_init_prec_enters_the_config_only_when_given():
    """The committed runs' configs lack the key, so a resumed default run still matches them."""
    import argparse

    from ngvi.experiments.charlm.experiment import EXPERIMENT

    parser = argparse.ArgumentParser()
    EXPERIMENT.add_arguments(parser)
    assert "vadagrad_init_prec" not in EXPERIMENT.config(parser.parse_args([]))
    assert EXPERIMENT.config(parser.parse_args(["--vadagrad-init-prec", "1"]))["vadagrad_init_prec"] == 1.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--vadagrad-init-prec", "0"])
