"""torch.distributed semantics (ngvi.distributed), with 2 gloo processes on CPU in float64.

* ``rank_noise="shared"`` + DDP: 2 ranks × batch B take exactly the steps of 1 process × batch 2B
  (Vadam; IVON, whose Price curvature reads ε; rules with rank-local curvature averaged by the engine: a toy
  one, VOGN's per-example sums and noisy K-FAC's Kronecker factors; NNG-BlkTri, whose draw must not depend on
  the arbitrary eigenbasis of degenerate factors, to 1e-10).
* a checkpoint written by rank 0 mid-run resumes on 2 ranks and finishes as the uninterrupted run.
* ``rank_noise="independent"``: ranks draw different θ but keep identical μ and state.

All scenarios run in one spawn of 2 processes (spawning dominates the cost).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ngvi
from ngvi._tensorlist import TensorList

KINDS = ("vadam", "ivon", "local", "vogn", "noisy_kfac", "nng_blktri")
B = 8  # per-rank batch
STEPS = 6
RESUME_AT = 3
N = 100


class LocalSquares(ngvi.curvature.estimators.CurvatureEstimator):
    """VOGN's curvature for Vadam: the mean over the *local* batch of per-example squared gradients, which
    the closure leaves in ``per_example_sq``. A rank sees only its shard, so the engine must average it over
    ranks (``local``)."""

    name = "grad2"
    local = True

    def __init__(self):
        self.per_example_sq: dict = {}

    def estimate(self, sample):
        return TensorList(self.per_example_sq[p].clone() for p in sample.params)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2)).double()


def data(world: int = 2):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(world * B, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(world * B, 2, generator=gen, dtype=torch.float64)
    return x, y


def make_opt(kind: str, model: nn.Module, **kw):
    params = model.parameters()
    kw = {"seed": 3, **kw}
    if kind == "vadam":
        return ngvi.Vadam(params, N, lr=0.05, init_prec=40.0, **kw)
    if kind == "ivon":
        return ngvi.IVON(params, N, lr=0.1, hess_init=0.5, mc_samples=2, **kw)
    if kind == "vogn":  # per-example squared gradients from hooks, a rank-local statistic
        return ngvi.VOGN(model, N, lr=0.05, beta=0.1, init_prec=40.0, **kw)
    if kind == "noisy_kfac":  # Kronecker factors from hooks, rank-local; inverses every 2 steps
        return ngvi.NoisyKFAC(model, N, lr=0.05, beta=0.1, damping=1e-2, inv_every=2, **kw)
    if kind == "nng_blktri":  # the joint draw ΞᵀRε; Ψ^S S Ψ^Sᵀ of the first layer has rank 2 < 6
        return ngvi.NNGBlkTri(model, N, lr=0.05, beta=0.1, damping=1e-2, inv_every=1, **kw)
    return ngvi.Vadam(params, N, lr=0.05, init_prec=40.0, curvature=LocalSquares(), **kw)


def loss_fn(out, y):
    return 0.5 * ((out - y) ** 2).sum(1).mean()


def per_example_sq(model: nn.Module, x, y) -> dict:
    """(1/M) Σᵢ gᵢ² by brute force (torch.func), keyed by parameter."""
    names = dict(model.named_parameters())

    def one(params, xi, yi):
        return loss_fn(torch.func.functional_call(model, params, (xi[None],)), yi[None])

    grads = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(
        {k: v.detach() for k, v in names.items()}, x, y
    )
    return {names[k]: g.square().mean(0) for k, g in grads.items()}


def train(kind, model, opt, x, y, steps, ddp_model=None):
    net = ddp_model or model
    for _ in range(steps):

        def closure():
            opt.zero_grad()
            if kind == "local":
                opt.curvature_estimator.per_example_sq = per_example_sq(model, x, y)
            loss = loss_fn(net(x), y)
            loss.backward()
            return loss

        opt.step(closure)


def snapshot(model, opt):
    post = opt.posterior()
    return {"mean": [m.clone() for m in post.mean], "var": [v.clone() for v in post.variance]}


def _worker(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        x, y = data(world)
        xs, ys = x[rank * B : (rank + 1) * B], y[rank * B : (rank + 1) * B]
        results = {}
        for kind in KINDS:
            model = make_model()
            ddp = nn.parallel.DistributedDataParallel(model)
            opt = make_opt(kind, model)
            train(kind, model, opt, xs, ys, STEPS, ddp)
            results[kind] = snapshot(model, opt)

        # resume: rank 0 saves mid-run, both ranks load and finish
        model = make_model()
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = make_opt("vadam", model)
        train("vadam", model, opt, xs, ys, RESUME_AT, ddp)
        ckpt = f"{out}.ckpt"
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
        dist.barrier()
        model = make_model()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # a different start: everything must come from the checkpoint
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = make_opt("vadam", model, seed=rank + 100)  # another seed: the checkpoint's must win
        opt.load_state_dict(state["opt"])
        train("vadam", model, opt, xs, ys, STEPS - RESUME_AT, ddp)
        results["resumed"] = snapshot(model, opt)

        # independent noise, no DDP: the engine averages ĝ and ĥ itself
        model = make_model()
        opt = make_opt("vadam", model, rank_noise="independent")
        with opt.sampled_params():
            results["independent_sample"] = [p.detach().clone() for p in model.parameters()]
        train("vadam", model, opt, xs, ys, STEPS)
        results["independent"] = snapshot(model, opt)
        torch.save(results, f"{out}.rank{rank}.part")
        os.replace(f"{out}.rank{rank}.part", f"{out}.rank{rank}")  # present means complete
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Skip interpreter finalisation: gloo's worker threads can abort the process there (SIGABRT, "terminate
    # called without an active exception"; described in pytorch/pytorch#179291), seen once in CI.
    os._exit(0)


def _spawn(out: str, store: str) -> None:
    """Two ranks; a rank killed by a signal *after* writing its complete result is a teardown crash inside
    torch, reported as a warning, not a failure of the semantics under test."""
    try:
        mp.spawn(_worker, args=(2, store, out), nprocs=2, join=True)
    except mp.ProcessExitedException as err:
        if err.signal_name is None or not all(os.path.exists(f"{out}.rank{r}") for r in range(2)):
            raise
        warnings.warn(f"a rank crashed in torch.distributed teardown after finishing: {err}", stacklevel=2)


def test_two_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    out = str(tmp_path / "result")
    _spawn(out, str(tmp_path / "store"))
    ranks = [torch.load(f"{out}.rank{r}", weights_only=True) for r in range(2)]
    x, y = data(2)

    def close(a, b, tol=1e-6):
        for key in ("mean", "var"):
            for u, v in zip(a[key], b[key], strict=True):
                torch.testing.assert_close(u, v, rtol=tol, atol=tol)

    for kind in KINDS:
        model = make_model()
        opt = make_opt(kind, model)
        train(kind, model, opt, x, y, STEPS)
        single = snapshot(model, opt)
        for r in ranks:
            close(r[kind], single, tol=1e-10 if kind == "nng_blktri" else 1e-6)
        assert not torch.equal(single["mean"][0], make_model()[0].weight)  # it did train

    model = make_model()
    opt = make_opt("vadam", model)
    train("vadam", model, opt, x, y, STEPS)
    for r in ranks:
        close(r["resumed"], snapshot(model, opt))

    # independent noise: different samples on the two ranks, yet identical posteriors (to round-off)
    assert not torch.equal(ranks[0]["independent_sample"][0], ranks[1]["independent_sample"][0])
    close(ranks[0]["independent"], ranks[1]["independent"], tol=1e-12)
