"""An empirical-Bayes run resumes under the Hugging Face Trainer (issue 43, item 2): the learned prior is
state, not a setting, so a checkpoint taken after λ moved resumes (VariationalTrainer, and a stock Trainer
with NGVICallback and TrainingArguments.weight_decay) and goes on bit for bit as the uninterrupted run."""

from __future__ import annotations

import pytest
import torch

import ngvi

pytest.importorskip("transformers")
pytest.importorskip("peft")
from test_hf import Data, arguments, assert_same, gpt2, ivon
from transformers import Trainer

from ngvi.integrations.hf import NGVICallback, VariationalTrainer

SAVE = dict(save_strategy="steps", save_steps=2, save_only_model=False)


def learning(model):
    return ivon(model, weight_decay=1e-4, empirical_bayes=ngvi.EmpiricalBayes(every=1))


@pytest.mark.parametrize("trainer", [VariationalTrainer, Trainer], ids=["VariationalTrainer", "Trainer"])
def test_an_empirical_bayes_run_resumes_from_a_checkpoint(trainer, tmp_path):
    def run(folder, max_steps, resume=None):
        model = gpt2()
        opt = learning(model)
        extra = {"callbacks": [NGVICallback()]} if trainer is Trainer else {}
        args = arguments(folder, max_steps=max_steps, weight_decay=1e-4, **SAVE)
        tr = trainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None), **extra)
        tr.train(resume_from_checkpoint=resume)
        return model, opt

    whole, opt = run(tmp_path / "a", 4)
    assert opt.param_groups[0]["weight_decay"] != 1e-4  # λ was learned: the group key moved
    run(tmp_path / "b", 2)
    model, twin = run(tmp_path / "b", 4, resume=str(tmp_path / "b" / "out" / "checkpoint-2"))
    assert twin.num_steps == opt.num_steps == 4
    assert twin.param_groups[0]["weight_decay"] == opt.param_groups[0]["weight_decay"]
    assert_same(whole, model)
    for a, b in zip(opt.posterior().variance, twin.posterior().variance, strict=True):
        assert torch.equal(a, b)


def test_a_resume_with_another_setting_is_still_refused(tmp_path):
    run_args = arguments(tmp_path, max_steps=2, **SAVE)
    model = gpt2()
    VariationalTrainer(
        model=model, args=run_args, train_dataset=Data(), optimizers=(learning(model), None)
    ).train()
    model = gpt2()
    eb = ngvi.EmpiricalBayes(every=1)
    other = ngvi.IVON(model.parameters(), 64, lr=0.05, seed=0, weight_decay=1e-4, empirical_bayes=eb)
    args = arguments(tmp_path, max_steps=4, **SAVE)
    tr = VariationalTrainer(model=model, args=args, train_dataset=Data(), optimizers=(other, None))
    with pytest.raises(ValueError, match=r"data_size given 64, checkpoint 32") as err:
        tr.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert "weight_decay" not in str(err.value)  # the learned prior is not a setting
