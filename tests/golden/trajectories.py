"""Golden trajectories: digests of every trainer's posterior after a dozen seeded steps.

Recorded on main before the architecture refactor (``python tests/golden/trajectories.py --record``) and
checked by ``tests/test_golden.py``: refactors must keep every trajectory **bitwise** identical. A change that
is meant to alter a trajectory (a new random stream, a fixed bug) re-records the file in the same commit and
says why in its message.

Each case trains a small float32 model (Linear or Conv2d) with one configuration of one trainer for
``STEPS`` steps from fixed seeds, then hashes the bytes of the posterior means and variances (the parameters
for trainers without a Gaussian posterior) and of the returned losses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import ngvi
from ngvi.baselines import BBVI, MAP, MCDropout

STEPS = 12
N = 64  # data_size
FILE = Path(__file__).with_name("trajectories.json")


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def conv_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.Tanh(), nn.Conv2d(3, 2, 3, stride=2), nn.Flatten(), nn.Linear(8, 3)
    )


def dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Dropout(0.2), nn.Linear(6, 2))


def batch(kind: str):
    gen = torch.Generator().manual_seed(1)
    if kind == "conv":
        x = torch.randn(16, 1, 5, 5, generator=gen)
        return x, torch.randint(0, 3, (16,), generator=gen)
    x = torch.randn(16, 4, generator=gen)
    return x, torch.stack([x[:, :2].sum(1).sin(), x[:, 2:].prod(1)], 1)


def nll(kind: str, out, y):
    return F.cross_entropy(out, y) if kind == "conv" else 0.5 * (out - y).square().sum(1).mean()


LIKELIHOOD = {"linear": "gaussian", "conv": "categorical"}

# name -> (factory(model, kind), closure style): "backward", "graph" (create_graph), "output" (fisher)
CASES: dict[str, tuple[Callable, str]] = {
    "vadam": (lambda m, k: ngvi.Vadam(m.parameters(), N, lr=1e-2, init_prec=50.0, seed=3), "backward"),
    "vadam_defaults": (lambda m, k: ngvi.Vadam(m.parameters(), N, seed=3), "backward"),
    "vadam_mc3_antithetic": (
        lambda m, k: ngvi.Vadam(
            m.parameters(), N, lr=1e-2, init_prec=50.0, mc_samples=3, noise="antithetic", seed=3
        ),
        "backward",
    ),
    "vadam_groups": (
        lambda m, k: ngvi.Vadam(
            [{"params": list(m.parameters())[:2], "lr": 3e-2}, {"params": list(m.parameters())[2:]}],
            N,
            lr=1e-2,
            init_prec=50.0,
            seed=3,
        ),
        "backward",
    ),
    "vprop": (lambda m, k: ngvi.Vprop(m.parameters(), N, lr=1e-2, init_prec=50.0, seed=3), "backward"),
    "vadagrad": (lambda m, k: ngvi.VadaGrad(m.parameters(), lr=1e-2, init_prec=100.0, seed=3), "backward"),
    "von_price": (
        lambda m, k: ngvi.VON(m.parameters(), N, lr=1e-2, beta=0.05, init_prec=50.0, seed=3),
        "backward",
    ),
    "von_hutchinson_mc2": (
        lambda m, k: ngvi.VON(
            m.parameters(),
            N,
            lr=1e-2,
            beta=0.05,
            init_prec=50.0,
            curvature="hutchinson",
            mc_samples=2,
            seed=3,
        ),
        "graph",
    ),
    "ivon": (lambda m, k: ngvi.IVON(m.parameters(), N, lr=0.05, seed=3), "backward"),
    "ivon_clip_mc2": (
        lambda m, k: ngvi.IVON(m.parameters(), N, lr=0.05, clip_radius=1e-3, mc_samples=2, seed=3),
        "backward",
    ),
    "noisy_adam": (lambda m, k: ngvi.NoisyAdam(m.parameters(), N, lr=1e-2, damping=1e-3, seed=3), "backward"),
    "badam": (lambda m, k: ngvi.BAdam(m.parameters(), N, lr=1e-2, prior_prec=1.0, seed=3), "backward"),
    "vogn": (lambda m, k: ngvi.VOGN(m, N, lr=1e-2, beta=0.05, init_prec=50.0, seed=3), "backward"),
    "vogn_fisher_momentum": (
        lambda m, k: ngvi.VOGN(
            m,
            N,
            lr=1e-2,
            beta=0.05,
            momentum=0.5,
            init_prec=50.0,
            curvature="fisher",
            likelihood=LIKELIHOOD[k],
            seed=3,
        ),
        "output",
    ),
    "noisy_kfac": (lambda m, k: ngvi.NoisyKFAC(m, N, lr=1e-2, beta=0.1, inv_every=5, seed=3), "backward"),
    "noisy_kfac_fisher_momentum": (
        lambda m, k: ngvi.NoisyKFAC(
            m,
            N,
            lr=1e-2,
            beta=0.1,
            momentum=0.5,
            stats_every=2,
            inv_every=3,
            mc_samples=2,
            curvature="fisher",
            likelihood=LIKELIHOOD[k],
            seed=3,
        ),
        "output",
    ),
    "bbvi": (lambda m, k: BBVI(m, N, lr=1e-2, init_prec=50.0, mc_samples=2, seed=3), "backward"),
    "map": (lambda m, k: MAP(m, N, lr=1e-2), "backward"),
    "mc_dropout": (lambda m, k: MCDropout(m, N, lr=1e-2), "backward"),
}
MODELS = {"linear": linear_model, "conv": conv_model}


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def run_case(name: str, kind: str, manual: bool = False) -> dict[str, str]:
    """Train case ``name`` on model ``kind`` and return the digests (``manual``: the sampled_params form)."""
    factory, style = CASES[name]
    model = dropout_model() if name == "mc_dropout" else MODELS[kind]()
    data = "linear" if name == "mc_dropout" else kind
    torch.manual_seed(7)  # for MC dropout's masks (the other trainers own their generator)
    opt = factory(model, kind)
    x, y = batch(data)

    def closure():
        opt.zero_grad()
        out = model(x)
        loss = nll(data, out, y)
        if style == "output":
            return loss, out
        loss.backward(create_graph=style == "graph")
        return loss

    losses = []
    for _ in range(STEPS):
        if manual:
            for _ in range(getattr(opt, "mc_samples", 1)):
                with opt.sampled_params(train=True):
                    losses.append(closure().detach())
            opt.step()
        else:
            losses.append(opt.step(closure).detach())
    try:
        post = opt.posterior()
        means, variances = post.mean, post.variance
    except NotImplementedError:  # MC dropout: no Gaussian posterior
        means, variances = [p.detach() for p in model.parameters()], []
    return {"mean": _digest(means), "variance": _digest(variances), "loss": _digest(losses)}


def all_cases() -> list[tuple[str, str, bool]]:
    cases = []
    for name in CASES:
        kinds = ["linear"] if name == "mc_dropout" else ["linear", "conv"]
        cases += [(name, kind, False) for kind in kinds]
    cases += [("vadam", "linear", True), ("ivon", "conv", True), ("bbvi", "linear", True)]
    return cases


def case_id(name: str, kind: str, manual: bool) -> str:
    return f"{name}/{kind}" + ("/manual" if manual else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=f"write {FILE.name}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    digests = {case_id(*c): run_case(*c) for c in all_cases()}
    if args.record:
        FILE.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(digests)} digests to {FILE}")
    else:
        print(json.dumps(digests, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
