"""ngvi under the Hugging Face Trainer and PEFT (issue 21; ``hf``: an extra, installed with dev).

Mirrors tests/test_lightning.py: :class:`VariationalTrainer` must be, bit for bit, the plain loop
``with opt.sampled_params(train=True): backward, clip`` then ``opt.step()`` over the same batches. A tiny
GPT-2 (one layer, width 16) on a character-level text, sequences of 16 tokens, a few steps each.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ngvi

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from ngvi.integrations.hf import (  # noqa: E402
    NGVICallback,
    VariationalTrainer,
    check_training,
    next_token_labels,
)

#: torch's own note when vmap meets CPU attention (predict(vectorize=True)), not ngvi's
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
transformers.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)

TEXT = "in the beginning god created the heaven and the earth. and the earth was without form, and void. " * 6
CHARS = sorted(set(TEXT))
T, N = 16, 32
SEQS = torch.tensor([CHARS.index(c) for c in TEXT])[: N * T].view(N, T)
REPO = Path(__file__).resolve().parents[2]


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": SEQS[i], "labels": SEQS[i]}


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=len(CHARS),
        n_positions=T,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def arguments(tmp_path, **kwargs) -> TrainingArguments:
    base = dict(
        per_device_train_batch_size=8,
        max_steps=4,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        logging_strategy="no",
        lr_scheduler_type="constant",
        train_sampling_strategy="sequential",
        max_grad_norm=0.5,
    )
    return TrainingArguments(str(tmp_path / "out"), **{**base, **kwargs})


def ivon(model: nn.Module, **kwargs) -> ngvi.IVON:
    return ngvi.IVON([p for p in model.parameters() if p.requires_grad], N, lr=0.05, seed=0, **kwargs)


def trained(tmp_path, model=None, trainer=VariationalTrainer, make=ivon, **kwargs):
    model = gpt2() if model is None else model
    opt = make(model)
    extra = {"callbacks": [NGVICallback()]} if trainer is Trainer else {}
    tr = trainer(
        model=model, args=arguments(tmp_path, **kwargs), train_dataset=Data(), optimizers=(opt, None), **extra
    )
    tr.train()
    return model, opt, tr


def plain_loop(steps: int = 4, batch: int = 8, max_norm: float = 0.5):
    model = gpt2()
    opt = ivon(model)
    for k in range(steps):
        ids = SEQS[k * batch % N :][:batch]
        with opt.sampled_params(train=True):
            opt.zero_grad()
            # the Trainer's token count (transformers 5.24 counts all labels of this model, not labels[:, 1:])
            model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(ids.numel()) / 1).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    return model, opt


def assert_same(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_variational_trainer_is_the_plain_loop_bit_for_bit(tmp_path):
    model, opt, tr = trained(tmp_path)
    twin_model, twin = plain_loop()
    assert opt.num_steps == twin.num_steps == 4 and not opt.in_sample
    assert_same(model, twin_model)
    for a, b in zip(tr.posterior().variance, twin.posterior().variance, strict=True):
        assert torch.equal(a, b)
    # clipping acted (max_grad_norm=0.5 is below the gradients' norm), so it was on the sample's gradient
    unclipped_model, _ = plain_loop(max_norm=float("inf"))
    assert not torch.equal(unclipped_model.lm_head.weight, model.lm_head.weight)
    # a stock Trainer with NGVICallback is the same run
    stock_model, _, _ = trained(tmp_path, trainer=Trainer)
    assert_same(stock_model, model)


def test_gradient_accumulation_4_x_4_is_one_batch_of_16(tmp_path):
    one, _, _ = trained(tmp_path, per_device_train_batch_size=16, max_steps=3)
    four, opt, _ = trained(
        tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=4, max_steps=3
    )
    assert opt.num_steps == 3
    for p, q in zip(one.parameters(), four.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # float32 summation order only


def test_save_and_resume_is_bit_identical(tmp_path):
    kwargs = dict(save_strategy="steps", save_steps=2, max_steps=4, save_only_model=False)
    whole, opt, _ = trained(tmp_path / "a", **kwargs)
    # the same run, stopped after the checkpoint of step 2, resumed from it by a fresh trainer and optimizer
    trained(tmp_path / "b", **{**kwargs, "max_steps": 2})
    model = gpt2()
    twin = ivon(model)
    tr = VariationalTrainer(
        model=model, args=arguments(tmp_path / "b", **kwargs), train_dataset=Data(), optimizers=(twin, None)
    )
    tr.train(resume_from_checkpoint=str(tmp_path / "b" / "out" / "checkpoint-2"))
    assert twin.num_steps == opt.num_steps == 4  # the resumed optimizer took steps 3 and 4
    assert_same(whole, model)
    rngs = opt.state_dict()["ngvi"]["rng"], twin.state_dict()["ngvi"]["rng"]
    assert rngs[0].keys() == rngs[1].keys() and len(rngs[0]) == 1
    assert all(torch.equal(rngs[0][k], rngs[1][k]) for k in rngs[0])  # the noise goes on the same
    for a, b in zip(opt.posterior().variance, twin.posterior().variance, strict=True):
        assert torch.equal(a, b)


def test_an_error_in_a_forward_pass_restores_the_mean_and_the_trainer_goes_on(tmp_path):
    model = gpt2()
    opt = ivon(model)
    calls = {"n": 0}

    def fail_on_third(module, args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")

    handle = model.transformer.register_forward_pre_hook(fail_on_third)
    tr = VariationalTrainer(
        model=model, args=arguments(tmp_path), train_dataset=Data(), optimizers=(opt, None)
    )
    mean_after_two = {}

    class Snapshot(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            mean_after_two.update({n: p.detach().clone() for n, p in model.named_parameters()})

    tr.add_callback(Snapshot())
    with pytest.raises(RuntimeError, match="boom"):
        tr.train()
    assert opt.num_steps == 2 and not opt.in_sample and opt.accumulator.count == 0
    for name, p in model.named_parameters():
        assert torch.equal(p, mean_after_two[name]), name  # μ, not the failed step's sample
    handle.remove()
    tr.train()  # usable: a fresh run of 4 steps on the same optimizer
    assert opt.num_steps == 6 and not opt.in_sample


def test_lora_leaves_the_base_weights_untouched_and_stateless(tmp_path):
    base = gpt2()
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True)
    model = peft.get_peft_model(base, config)
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in lora:  # lora_B starts at 0: move it so that the adapters change the outputs
        nn.init.normal_(p, std=0.05)
    opt = ngvi.IVON(model.parameters(), N, lr=0.05, seed=0)  # the frozen base is passed too
    tr = VariationalTrainer(
        model=model, args=arguments(tmp_path), train_dataset=Data(), optimizers=(opt, None)
    )
    start = [p.detach().clone() for p in lora]
    tr.train()
    assert opt.num_steps == 4
    for n, p in base.named_parameters():
        if "lora_" not in n:
            key = n.replace("base_layer.", "")
            assert torch.equal(p, before[key]), n
    assert set(opt.state) == set(lora)  # no state for the frozen base
    assert tr.posterior().mean[0].numel() + tr.posterior().mean[1].numel() == sum(p.numel() for p in lora)
    assert all(not torch.equal(p, q) for p, q in zip(lora, start, strict=True))


def test_bf16_autocast_runs(tmp_path):
    model, opt, _ = trained(tmp_path, bf16=True, max_steps=2)
    assert opt.num_steps == 2 and all(torch.isfinite(p).all() for p in model.parameters())


def test_more_samples_per_step_and_hooked_rules_with_accumulation_are_refused(tmp_path):
    model = gpt2()
    opt = ngvi.IVON(model.parameters(), N, mc_samples=2, seed=0)
    tr = VariationalTrainer(
        model=model, args=arguments(tmp_path), train_dataset=Data(), optimizers=(opt, None)
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"IVON\(mc_samples=2\) under the Hugging Face.*pass mc_samples=1"):
        tr.train()
    assert not opt.in_sample and opt.num_steps == 0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    vogn = ngvi.VOGN(nn.Sequential(nn.Linear(2, 2)), N)
    with pytest.raises(ValueError, match=r"VOGN .* set gradient_accumulation_steps=1 \(got 4\)"):
        check_training(vogn, 4)
    check_training(vogn, 1)
    with pytest.raises(TypeError, match="AcceleratedOptimizer is not an ngvi optimizer and wraps none"):
        Trainer(
            model=gpt2(), args=arguments(tmp_path), train_dataset=Data(), callbacks=[NGVICallback()]
        ).train()


def test_the_trainer_hands_the_model_to_rules_that_hook_it(tmp_path):
    for cls, kwargs, hooked in [
        (ngvi.NoisyAdam, {"data_size": N, "curvature": "ef"}, True),
        (ngvi.NoisyAdam, {"data_size": N}, False),
        (ngvi.VOGN, {"data_size": N}, True),
    ]:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        tr = VariationalTrainer(
            model=model, args=arguments(tmp_path, max_steps=1), optimizer_cls_and_kwargs=(cls, kwargs)
        )
        opt = tr.create_optimizer()
        assert isinstance(opt, cls) and (opt.model is model) == hooked, (cls, kwargs)


def test_trainer_weight_decay_is_ivons_prior_or_refused(tmp_path):
    args = dict(weight_decay=0.01, max_steps=1)
    model = gpt2()
    tr = VariationalTrainer(
        model=model,
        args=arguments(tmp_path, **args),
        train_dataset=Data(),
        optimizer_cls_and_kwargs=(ngvi.IVON, {"data_size": N, "seed": 0}),
    )
    tr.train()
    opt = tr.ngvi_optimizer
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.01
    for cls, kwargs, match in [
        (ngvi.IVON, {"data_size": N, "prior_prec": 1.0}, "both set the prior"),
        (ngvi.Vadam, {"data_size": N}, r"weight_decay=0.01\) has no meaning for Vadam: its prior is prior_p"),
    ]:
        bad = VariationalTrainer(
            model=gpt2(),
            args=arguments(tmp_path, **args),
            train_dataset=Data(),
            optimizer_cls_and_kwargs=(cls, kwargs),
        )
        with pytest.raises(ValueError, match=match):
            bad.train()
    # weight_decay=0.0 (the default) keeps the optimizer's own prior
    tr = VariationalTrainer(
        model=gpt2(),
        args=arguments(tmp_path, max_steps=1),
        train_dataset=Data(),
        optimizer_cls_and_kwargs=(ngvi.IVON, {"data_size": N, "weight_decay": 3e-3}),
    )
    tr.train()
    assert tr.ngvi_optimizer.param_groups[0]["weight_decay"] == 3e-3
    # a stock Trainer's groups override IVON's prior: NGVICallback says so
    stock = Trainer(
        model=gpt2(),
        args=arguments(tmp_path, max_steps=1),
        train_dataset=Data(),
        optimizer_cls_and_kwargs=(ngvi.IVON, {"data_size": N}),
        callbacks=[NGVICallback()],
    )
    with pytest.warns(UserWarning, match=r"IVON's parameter groups \[0, 1\] carry weight_decay \[0.0\]"):
        stock.train()


def test_eval_samples_is_the_bayesian_model_average(tmp_path):
    model, opt, tr = trained(tmp_path)
    tr.eval_samples = 3
    data = Data()
    eval_args = dict(eval_dataset=data, metric_key_prefix="eval")
    tr.args.per_device_eval_batch_size = N
    start = opt.noise_source.checkpoint()
    loss = tr.evaluate(**eval_args)["eval_loss"]
    opt.noise_source.rollback(start)  # the same three draws, by hand
    logits = ngvi.predict(model, tr.optimizer, {"input_ids": SEQS}, 3)  # [3, N, T, V]; a wrapped optimizer
    bma = torch.logsumexp(torch.log_softmax(logits, -1), 0) - torch.log(torch.tensor(3.0))
    manual = -bma[:, :-1].gather(-1, SEQS[:, 1:, None]).mean()
    assert loss == pytest.approx(float(manual), rel=1e-5)
    tr.eval_samples = 0
    at_mean = tr.evaluate(**eval_args)["eval_loss"]
    count = torch.tensor(SEQS.numel()) / 1  # the Trainer's token count (see plain_loop)
    own = model(input_ids=SEQS, labels=SEQS, num_items_in_batch=count).loss.detach()
    assert at_mean == pytest.approx(float(own), rel=1e-5)
    assert at_mean != pytest.approx(loss, rel=1e-4)


def test_predict_takes_mapping_batches_model_outputs_and_wrapped_optimizers(tmp_path):
    model, opt, tr = trained(tmp_path, max_steps=2)
    assert type(tr.optimizer).__name__ == "AcceleratedOptimizer" and ngvi.unwrap(tr.optimizer) is opt
    assert ngvi.unwrap(opt) is opt
    with pytest.raises(TypeError, match="not an ngvi optimizer and wraps none"):
        ngvi.unwrap(torch.optim.SGD(model.parameters(), lr=0.1))
    x = {"input_ids": SEQS[:4]}
    start = opt.noise_source.checkpoint()
    out = ngvi.predict(model, tr.optimizer, x, 2)
    opt.noise_source.rollback(start)
    manual = []
    for _ in range(2):
        with opt.sampled_params():
            manual.append(model(**x).logits.detach())
    assert torch.equal(out, torch.stack(manual))
    at_mean = ngvi.predict(model, opt, x, 0, output="logits")
    assert torch.equal(at_mean[0], model(**x).logits)
    assert torch.equal(ngvi.predict(model, opt, x, 0, output=lambda o: o.logits[:, -1])[0], at_mean[0, :, -1])
    with pytest.raises(ValueError, match="has no 'scores'"):
        ngvi.predict(model, opt, x, 0, output="scores")
    vec = ngvi.predict(model, opt, x, 2, vectorize=True, generator=torch.Generator().manual_seed(0))
    assert vec.shape == out.shape and torch.isfinite(vec).all()


def test_token_level_metrics_mask_padding_and_ignored_labels(tmp_path):
    model, opt, _ = trained(tmp_path, max_steps=2)
    ids = SEQS[:4].clone()
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # padding at the end of one sequence
    x = {"input_ids": ids, "attention_mask": mask}
    y = next_token_labels(ids, mask)
    assert (y[:, -1] == -100).all() and (y[1, 9:] == -100).all() and int((y != -100).sum()) == 4 * 15 - 6
    ev = ngvi.evaluate_classifier(model, opt, x, y, samples=2, batch_size=3)
    keep = (y != -100) & mask.bool()
    assert ev.probs_mean.shape == (int(keep.sum()), len(CHARS))
    probs = torch.softmax(model(**x).logits.double(), -1)[keep]
    torch.testing.assert_close(ev.probs_mean, probs)
    nll = -probs.gather(1, y[keep][:, None]).log().mean()
    assert ev.mean["nll"] == pytest.approx(float(nll), rel=1e-12)
    assert ev.mean["ece"] == ngvi.metrics.ece(probs, y[keep]) and 0 <= ev.bma["ece"] <= 1
    with pytest.raises(ValueError, match=r"need labels shaped \[N, T\] = \[4, 16\], got \[4\]"):
        ngvi.evaluate_classifier(model, opt, x, y[:, 0], samples=1)


def test_the_lora_example_runs_quick():
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "hf_lora.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IVON-LoRA (BMA)" in out.stdout and "AdamW-LoRA" in out.stdout


def test_importing_ngvi_does_not_import_transformers():
    code = "import sys, ngvi; sys.exit('transformers' in sys.modules or 'ngvi.integrations' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(REPO / "src")}).returncode == 0
