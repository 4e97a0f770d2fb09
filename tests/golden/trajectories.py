"""Golden trajectories: digests of every trainer's posterior after a dozen seeded steps.

Recorded on main before the architecture refactor (``python tests/golden/trajectories.py --record``) and
checked by ``tests/test_golden.py``: refactors must keep every trajectory **bitwise** identical. A change that
is meant to alter a trajectory (a new random stream, a fixed bug) re-records the file in the same commit and
says why in its message.

The digests are taken in a child process with CPU-independent numerics (:data:`PINNED_ENV`: ATen's scalar
kernels, MKL's reproducible mode, one thread, no oneDNN), so that they are the same on every x86 machine: with
the default vectorised kernels the last bits of a float32 trajectory depend on the CPU's instruction set.

Each case trains a small float32 model (Linear or Conv2d) with one configuration of one trainer for
``STEPS`` steps from fixed seeds, then hashes the bytes of the posterior means and variances (the parameters
for trainers without a Gaussian posterior) and of the returned losses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
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
UCI_FILE = FILE.with_name("uci_yacht_split0.json")
UCI_COMMAND = (
    "uci --datasets yacht --methods vadam,bbvi,mc_dropout,vogn,noisy_kfac --splits 1 --tune none --jobs 1"
)
#: numerics that do not depend on the CPU model (read by ATen and MKL at start-up, hence a child process)
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def run_pinned(*args: str) -> str:
    """Run this script with ``args`` in a child process with :data:`PINNED_ENV`; return its stdout."""
    env = {**os.environ, **PINNED_ENV}
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode:
        raise RuntimeError(f"golden run {args} failed:\n{done.stderr[-4000:]}")
    return done.stdout


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
    # noisy K-FAC as recorded: Alg. 2's shared weight draw (the default is now sampling="auto")
    "noisy_kfac": (
        lambda m, k: ngvi.NoisyKFAC(m, N, lr=1e-2, beta=0.1, inv_every=5, seed=3, sampling="weights"),
        "backward",
    ),
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
            sampling="weights",
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


def run_uci(out: str, data_dir: str) -> None:
    """``ngvi {UCI_COMMAND}`` into ``out``."""
    from ngvi.experiments.cli import main as cli

    if cli([*UCI_COMMAND.split(), "--data-dir", data_dir, "--out", out]):
        raise SystemExit("the golden UCI run failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="write the digests (and UCI with --data-dir)")
    parser.add_argument("--uci", metavar="OUT", help=f"run `ngvi {UCI_COMMAND}` into OUT")
    parser.add_argument("--data-dir", help="the benchmark data (for --uci and --record)")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in PINNED_ENV.items()):
        print(run_pinned(*sys.argv[1:]), end="")
        return
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False  # oneDNN picks kernels by instruction set
    if args.uci:
        run_uci(args.uci, args.data_dir)
        return
    digests = {case_id(*c): run_case(*c) for c in all_cases()}
    if not args.record:
        print(json.dumps(digests, indent=1, sort_keys=True))
        return
    FILE.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(digests)} digests to {FILE}")
    if args.data_dir:
        import tempfile

        with tempfile.TemporaryDirectory() as out:
            run_uci(out, args.data_dir)
            runs = json.loads((Path(out) / "results.json").read_text())["runs"]
        got = {k: {m: v[m] for m in ("curve", "loglik", "rmse")} for k, v in runs.items()}
        UCI_FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {UCI_FILE}")


if __name__ == "__main__":
    main()
