"""The engine's parts on their own: the noise source, the sample accumulator, sample-scope plugins, and the
engine's vocabulary (renamed keywords, aliases)."""

from __future__ import annotations

import contextlib
import pickle

import pytest
import torch
from torch import nn

import ngvi
from ngvi.optim._accumulator import SampleAccumulator
from ngvi.optim._noise import NoiseSource


def params(*shapes, dtype=torch.float64):
    return [torch.zeros(s, dtype=dtype) for s in shapes]


# -- NoiseSource -------------------------------------------------------------------------------------
def test_noise_is_the_seeded_standard_normal_stream():
    ps = params((3, 4), (5,))
    source = NoiseSource(7, "normal", None, "shared", keep=False)
    gen = torch.Generator().manual_seed(7)
    for p in ps:  # parameter by parameter, in order, from one generator seeded with the seed
        assert torch.equal(source.fresh(p), torch.empty_like(p).normal_(generator=gen))
    a, b = NoiseSource(7, "normal", None, "shared", True), NoiseSource(7, "normal", None, "shared", True)
    assert torch.equal(a.into(ps[0].clone()), b.fresh(ps[0]))  # drawing into p is the same draw


def test_rollback_restores_the_stream_and_the_draw_count():
    p = params((100,))[0]
    source = NoiseSource(3, "normal", None, "shared", keep=False)
    source.fresh(p)
    checkpoint = source.checkpoint()
    source.begin_draw([p])
    discarded = source.fresh(p).clone()
    source.end_draw(False)
    assert source.num_draws == 1
    source.rollback(checkpoint)
    assert source.num_draws == 0 and torch.equal(source.fresh(p), discarded)


def test_antithetic_pairs_negate_and_survive_pickling_mid_pair():
    p = params((50,))[0]
    source = NoiseSource(11, "antithetic", None, "shared", keep=False)
    assert source.keep  # the pair's ε is kept for its second half
    reuse = source.begin_draw([p])
    first = source.draw(p, reuse).clone()
    source.end_draw(reuse)
    copy = pickle.loads(pickle.dumps(source))  # mid pair: the buffer is not pickled, it is redrawn
    copy.redraw_pair([p])
    for s in (source, copy):
        reuse = s.begin_draw([p])
        assert reuse and torch.equal(s.draw(p, reuse), -first)
        s.end_draw(reuse)
        assert s.pair_start is None


def test_float32_noise_for_float64_parameters():
    p = params((1000,))[0]
    eps = NoiseSource(0, "normal", torch.float32, "shared", keep=False).fresh(p)
    gen = torch.Generator().manual_seed(0)
    assert eps.dtype == torch.float32
    assert torch.equal(eps, torch.empty(1000, dtype=torch.float32).normal_(generator=gen))


def test_noise_state_dict_round_trip():
    p = params((20,))[0]
    source = NoiseSource(5, "normal", None, "shared", keep=False)
    source.fresh(p)
    restored = NoiseSource(0, "normal", None, "shared", keep=False)
    restored.load_state_dict(source.state_dict(), [p])
    assert restored.seed == 5 and torch.equal(restored.fresh(p), source.fresh(p))


def test_bad_noise_arguments_name_themselves():
    for kwargs, name in [({"mode": "uniform"}, "noise"), ({"dtype": torch.int64}, "noise_dtype"),
                         ({"rank_noise": "x"}, "rank_noise"), ({"seed": 1.5}, "seed")]:  # fmt: skip
        args = {"seed": 0, "mode": "normal", "dtype": None, "rank_noise": "shared", **kwargs}
        with pytest.raises(ValueError, match=name):
            NoiseSource.configured(args["seed"], args["mode"], args["dtype"], args["rank_noise"], keep=False)


# -- SampleAccumulator -------------------------------------------------------------------------------
class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))


def test_accumulator_means_are_the_sample_means():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0)
    acc = SampleAccumulator()
    grads = [torch.randn(3), torch.randn(3), torch.randn(3)]
    for g in grads:
        model.a.grad, model.b.grad = g.clone(), None  # b has no gradient: it is not accumulated
        acc.add_sample(opt, keep_grad_refs=False)
    (sums,) = acc.sums(opt.param_groups)
    assert sums.params == [model.a] and acc.count == 3
    acc.mean_([sums])
    torch.testing.assert_close(sums.grads[0], torch.stack(grads).mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(sums.curvs[0], torch.stack(grads).square().mean(0), rtol=0, atol=1e-6)


def test_accumulator_keeps_the_first_gradient_by_reference_only_when_asked():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0)
    for keep in (True, False):
        acc = SampleAccumulator()
        model.a.grad, model.b.grad = torch.ones(3), torch.ones(2)
        acc.add_sample(opt, keep_grad_refs=keep)
        assert (acc.grads[model.a].data_ptr() == model.a.grad.data_ptr()) == keep  # a view of p.grad


def test_accumulator_names_the_nonfinite_parameter():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0)
    acc = SampleAccumulator()
    model.a.grad, model.b.grad = torch.ones(3), torch.tensor([1.0, float("inf")])
    acc.add_sample(opt, keep_grad_refs=False)
    sums = acc.sums(opt.param_groups)
    assert not acc.all_finite(sums, torch.tensor(1.0))
    assert acc.nonfinite_places(sums, opt.param_groups) == ["param_groups[0]['params'][1] (shape (2,))"]


# -- plugins -----------------------------------------------------------------------------------------
class Recorder:
    """A sample-scope plugin that records what it sees."""

    def __init__(self, model: nn.Module, opt_ref: list):
        self.model, self.opt_ref, self.events = model, opt_ref, []

    @contextlib.contextmanager
    def scope(self, *, train: bool):
        weight = self.model.weight.detach().clone()
        mean = self.opt_ref[0].mean_of(self.model.weight).clone()
        self.events.append(("enter", train, not torch.equal(weight, mean)))  # entered after the draw
        try:
            yield
        finally:
            pending = self.opt_ref[0].accumulator.count
            self.events.append(("exit", pending))


def test_plugins_are_entered_after_the_draw_and_left_after_accumulation():
    model = nn.Linear(3, 1)
    ref: list = []
    recorder = Recorder(model, ref)
    opt = ngvi.Vadam(model.parameters(), 10, init_prec=20.0, mc_samples=2, seed=0)
    opt.plugins = (*opt.plugins, recorder)
    ref.append(opt)
    x = torch.randn(4, 3)

    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    opt.step(closure)
    with opt.sampled_params():
        pass
    # two training samples (each sample is accumulated before the plugin exits), then one prediction
    assert recorder.events == [("enter", True, True), ("exit", 1), ("enter", True, True), ("exit", 2),
                               ("enter", False, True), ("exit", 0)]  # fmt: skip


# -- the engine's vocabulary ------------------------------------------------------------------------
def test_old_keyword_spellings_warn_and_keep_working():
    model = nn.Linear(2, 1)
    with pytest.warns(DeprecationWarning, match="hessian= is deprecated"):
        opt = ngvi.VON(model.parameters(), 10, hessian="hutchinson")
    assert opt.curvature == "hutchinson" and opt.hessian == "hutchinson"
    with pytest.raises(ValueError, match="not both"):
        ngvi.VON(model.parameters(), 10, curvature="price", hessian="price")
    with pytest.raises(ValueError, match=r"beta=0\.001"):  # the old decay meaning of Vprop's beta
        ngvi.Vprop(model.parameters(), 10, beta=0.999)


def test_vocabulary_aliases_are_the_same_optimizer():
    """prior_prec everywhere: NoisyAdam's prior_var = 1/prior_prec, IVON's weight_decay = prior_prec/N
    (values chosen exactly representable, so the trajectories agree bitwise)."""
    x = torch.randn(8, 2)

    def run(make):
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        opt = make(model)

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            opt.backward(loss)
            return loss

        for _ in range(3):
            opt.step(closure)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    pairs = [
        (lambda m: ngvi.NoisyAdam(m.parameters(), 16, prior_var=0.25, seed=0),
         lambda m: ngvi.NoisyAdam(m.parameters(), 16, prior_prec=4.0, seed=0)),
        (lambda m: ngvi.NoisyKFAC(m, 16, prior_var=0.5, seed=0),
         lambda m: ngvi.NoisyKFAC(m, 16, prior_prec=2.0, seed=0)),
        (lambda m: ngvi.IVON(m.parameters(), 16, weight_decay=0.125, seed=0),
         lambda m: ngvi.IVON(m.parameters(), 16, prior_prec=2.0, seed=0)),
    ]  # fmt: skip
    for paper_name, shared_name in pairs:
        assert torch.equal(run(paper_name), run(shared_name))


def test_every_optimizer_accepts_the_shared_vocabulary():
    model = nn.Linear(2, 1)
    for make in (
        lambda: ngvi.Vadam(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.Vprop(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.VON(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.IVON(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.NoisyAdam(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.BAdam(model.parameters(), 8, prior_prec=2.0, mc_samples=1),
        lambda: ngvi.VadaGrad(model.parameters(), data_size=8, prior_prec=0.0, mc_samples=2),
        lambda: ngvi.VOGN(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.NoisyKFAC(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.baselines.BBVI(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.baselines.MAP(model, 8, prior_prec=2.0, mc_samples=1),
    ):
        assert isinstance(make(), ngvi.PosteriorOptimizer)
    with pytest.raises(ValueError, match="mc_samples must be 1"):
        ngvi.BAdam(model.parameters(), 8, mc_samples=2)
    with pytest.raises(ValueError, match="prior_prec must be 0"):
        ngvi.VadaGrad(model.parameters(), prior_prec=1.0)
