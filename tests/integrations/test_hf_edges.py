"""The Hugging Face integration's edges (issue 31, items 12-16): weight decay on every path, a resume whose
hyperparameters differ from the checkpoint's, a second NGVICallback, the trainers that take the model, and
next_token_labels' dtype. The tiny GPT-2 and its data are test_hf.py's."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ngvi
import ngvi.baselines

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_hf import CHARS, SEQS, Data, N, arguments, gpt2, ivon
from transformers import Trainer

from ngvi.baselines import BBVI, MAP, MCDropout
from ngvi.integrations.hf import NGVICallback, VariationalTrainer, next_token_labels

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_next_token_labels_are_int64_whatever_the_ids_dtype(dtype):
    ids = SEQS[:2, :6].to(dtype)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    y = next_token_labels(ids, mask)
    assert y.dtype == torch.int64 and (y < len(CHARS)).all()
    assert y[0, :-1].tolist() == ids[0, 1:].long().tolist() and y[0, -1] == -100  # −100, not 156 for uint8
    assert y[1].tolist() == [*ids[1, 1:4].long().tolist(), -100, -100, -100]
    with pytest.raises(TypeError, match=r"must be token ids \(an integer tensor\), got torch.float32"):
        next_token_labels(ids.float())


# -- a tiny classifier whose forward returns the Trainer's dict (loss, logits) -------------------------------
M = 32
X = torch.randn(M, 3, generator=torch.Generator().manual_seed(1))
Y = (X.sum(1) > 0).long()


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(dropout), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return M

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": X[i], "labels": Y[i]}


def test_the_trainer_builds_bbvi_and_mc_dropout_from_the_model(tmp_path):
    # BBVI (hooks the Linear layers: the local reparameterisation) is, bit for bit, its plain loop
    model = Net()
    tr = VariationalTrainer(
        model=model,
        args=arguments(tmp_path, max_steps=3),
        train_dataset=Points(),
        optimizer_cls_and_kwargs=(BBVI, {"data_size": M, "lr": 0.01, "seed": 0}),
    )
    tr.train()
    opt = tr.ngvi_optimizer
    assert isinstance(opt, BBVI) and opt.num_steps == 3 and not opt.in_sample
    twin_model = Net()
    twin = BBVI(twin_model, M, lr=0.01, seed=0)
    for k in range(3):
        with twin.sampled_params(train=True):
            twin.zero_grad()
            twin_model(X[8 * k : 8 * k + 8], Y[8 * k : 8 * k + 8])["loss"].backward()
            torch.nn.utils.clip_grad_norm_(twin_model.parameters(), 0.5)
        twin.step()
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q)
    for a, b in zip(opt.posterior().variance, twin.posterior().variance, strict=True):
        assert torch.equal(a, b)
    # MC dropout takes the model (its dropout modules); MAP takes its trainable parameters
    for cls, net in [(MCDropout, Net(dropout=0.2)), (MAP, Net())]:
        start = [p.detach().clone() for p in net.parameters()]
        tr = VariationalTrainer(
            model=net,
            args=arguments(tmp_path, max_steps=2),
            train_dataset=Points(),
            optimizer_cls_and_kwargs=(cls, {"data_size": M, "lr": 0.01}),
        )
        tr.train()
        opt = tr.ngvi_optimizer
        assert type(opt) is cls and not opt.in_sample
        assert all(int(st["step"]) == 2 for st in opt.state.values()) and len(opt.state) == 4
        assert all(not torch.equal(p, q) for p, q in zip(net.parameters(), start, strict=True))
    # every exported trainer whose first argument is the model says so (what the Trainer passes it)
    trainers = {getattr(m, n) for m in (ngvi, ngvi.baselines) for n in m.__all__}
    trainers = {c for c in trainers if isinstance(c, type) and hasattr(c, "builds_from_model")}
    assert {BBVI, MCDropout, MAP, ngvi.VOGN, ngvi.IVON, ngvi.baselines.KFAC} <= trainers
    for cls in trainers:
        first = list(inspect.signature(cls.__init__).parameters)[1]
        assert cls.builds_from_model() == (first == "model"), cls


def test_a_second_ngvi_callback_is_refused_at_train(tmp_path):
    def fresh(trainer=VariationalTrainer, callbacks=None):
        model = gpt2()
        opt = ivon(model)
        args = arguments(tmp_path, max_steps=1)
        return trainer(
            model=model, args=args, train_dataset=Data(), optimizers=(opt, None), callbacks=callbacks
        )

    tr = fresh(callbacks=[NGVICallback()])
    before = [p.detach().clone() for p in tr.model.parameters()]
    with pytest.raises(ValueError, match=r"own NGVICallback, and 1 more was given .* pass no NGVICallback"):
        tr.train()
    assert tr.ngvi_callback._opt is None  # refused before the run began: nothing sampled, nothing stepped
    assert all(torch.equal(p, q) for p, q in zip(tr.model.parameters(), before, strict=True))
    tr.pop_callback(NGVICallback)  # the given one (it comes first): the trainer's own is left, and it runs
    tr.train()
    assert tr.ngvi_optimizer.num_steps == 1
    tr.remove_callback(tr.ngvi_callback)
    with pytest.raises(ValueError, match=r"add it back with trainer.add_callback\(trainer.ngvi_callback\)"):
        tr.train()
    # a stock Trainer given two
    stock = fresh(Trainer, callbacks=[NGVICallback(), NGVICallback()])
    with pytest.raises(ValueError, match=r"this Trainer has two NGVICallbacks, .*: keep one"):
        stock.train()
    assert not ngvi.unwrap(stock.optimizer).in_sample and ngvi.unwrap(stock.optimizer).num_steps == 0
    stock.pop_callback(NGVICallback)
    stock.train()  # one left: the mark of the failed run is gone with its TrainerState
    assert ngvi.unwrap(stock.optimizer).num_steps == 1


def test_weight_decay_with_a_given_optimizer_is_carried_or_refused_as_with_a_class(tmp_path):
    def run(trainer, make, weight_decay):
        model = gpt2()
        opt = make(model)
        extra = {"callbacks": [NGVICallback()]} if trainer is Trainer else {}
        args = arguments(tmp_path, max_steps=1, weight_decay=weight_decay)
        tr = trainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None), **extra)
        tr.train()
        return opt

    vadam = lambda m: ngvi.Vadam(m.parameters(), N, seed=0)  # noqa: E731
    map_ = lambda m: MAP(m.parameters(), N)  # noqa: E731
    for trainer in (VariationalTrainer, Trainer):
        for make, match in [
            (
                ivon,
                r"=0.1\) would be dropped: .* given IVON .* weight_decay \[0.0001\]; build it",
            ),
            (vadam, r"weight_decay=0.1\) has no meaning for Vadam: its prior is prior_prec="),
            (map_, r"weight_decay=0.1\) has no meaning for MAP: its prior is prior_prec="),
        ]:
            with pytest.raises(ValueError, match=match):
                run(trainer, make, 0.1)
        # the prior IVON was built with is the Trainer's: it is carried
        opt = run(trainer, lambda m: ivon(m, weight_decay=0.1), 0.1)
        assert opt.num_steps == 1 and opt.param_groups[0]["weight_decay"] == 0.1
        assert run(trainer, vadam, 0.0).num_steps == 1  # 0.0, the default, asks for nothing
    # nothing stepped or sampled when refused
    model = gpt2()
    opt = ivon(model)
    args = arguments(tmp_path, max_steps=1, weight_decay=0.1)
    tr = VariationalTrainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None))
    with pytest.raises(ValueError, match="would be dropped"):
        tr.train()
    assert opt.num_steps == 0 and not opt.in_sample
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), gpt2().parameters(), strict=True))
    # a stock Trainer's own groups carry it (and NGVICallback warns that they replaced IVON's prior)
    stock = Trainer(
        model=gpt2(),
        args=args,
        train_dataset=Data(),
        optimizer_cls_and_kwargs=(ngvi.IVON, {"data_size": N}),
        callbacks=[NGVICallback()],
    )
    with pytest.warns(UserWarning, match=r"IVON's parameter groups \[0, 1\] carry weight_decay \[0.0, 0.1\]"):
        stock.train()


def test_a_resume_whose_hyperparameters_differ_from_the_checkpoints_is_refused_naming_each(tmp_path):
    save = dict(save_strategy="steps", save_steps=2, save_only_model=False, lr_scheduler_type="linear")
    kwargs = {"data_size": 16, "lr": 0.05, "seed": 0}

    def trainer(max_steps, **given):
        args = arguments(tmp_path, max_steps=max_steps, **save)
        ivon_kwargs = (ngvi.IVON, {**kwargs, **given})
        return VariationalTrainer(
            model=gpt2(), args=args, train_dataset=Data(), optimizer_cls_and_kwargs=ivon_kwargs
        )

    trainer(2).train()
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    message = (
        r"checkpoint-2': the checkpoint's IVON hyperparameters would replace the given ones "
        r"\(data_size given 1000, checkpoint 16\); pass the checkpoint's values to resume, or start a new run"
    )
    with pytest.raises(ValueError, match=message):
        trainer(4, data_size=1000).train(resume_from_checkpoint=checkpoint)
    each = r"\(hess_init given 0.5, checkpoint 1.0; lr given 0.1, checkpoint 0.05\)"
    with pytest.raises(ValueError, match=each):
        trainer(4, lr=0.1, hess_init=0.5).train(resume_from_checkpoint=checkpoint)
    # a given optimizer too
    model = gpt2()
    opt = ngvi.IVON(model.parameters(), 1000, lr=0.05, seed=0)
    args = arguments(tmp_path, max_steps=4, **save)
    tr = VariationalTrainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None))
    with pytest.raises(ValueError, match=r"data_size given 1000, checkpoint 16"):
        tr.train(resume_from_checkpoint=checkpoint)
    # the same hyperparameters resume (the scheduled lr of step 2 is the scheduler's, not a difference)
    tr = trainer(4)
    tr.train(resume_from_checkpoint=checkpoint)
    assert tr.ngvi_optimizer.num_steps == 4 and tr.ngvi_optimizer.param_groups[0]["data_size"] == 16
