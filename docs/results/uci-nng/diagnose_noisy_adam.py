"""Yacht noisy Adam under NNG's protocol: which factor moves the learned noise and RMSE (split 0).

Each variant changes one thing in `uci_nng.protocol.fit`'s noisy Adam fit and prints one JSON line (README,
"Why noisy Adam's yacht fit is off"). Run from the repository root:

    NGVI_DATA=... PYTHONPATH=src .venv/bin/python docs/results/uci-nng/diagnose_noisy_adam.py \
        baseline,grad2xM,kl0.1,lr1e-3,tau_fixed_kfac 300
"""

import json
import math
import sys
import time

import torch

from ngvi.curvature.estimators import GradientSquares
from ngvi.experiments.core import methods as core_methods
from ngvi.experiments.data import load_uci
from ngvi.experiments.uci_nng import protocol as P
from ngvi.experiments.uci_nng.methods import NNGMethod
from ngvi.experiments.uci_nng.noise import GammaNoise

torch.set_num_threads(1)
captured = {}
_build = core_methods.Method.build


def build(self, model, n, **o):  # keeps the trainer, to read its posterior after the fit
    t = _build(self, model, n, **o)
    captured["t"] = t
    return t


core_methods.Method.build = build


class ScaledGrad2(GradientSquares):
    """ĝ²·M: with noise-dominated gradients E[ĝ²] ≈ F/M, so this estimates the per-example Fisher."""

    def __init__(self, m):
        self.m = m

    def estimate(self, s):
        return s.grads.square().mul_(self.m)


class FrozenNoise(GammaNoise):
    """q(τ) concentrated at τ (shape and rate 10⁶ times τ and 1), never updated."""

    def __init__(self, n, tau):
        super().__init__(n)
        self.log_params = [math.log(1e6 * tau), math.log(1e6)]

    def update(self, r):
        pass


base = {"lr": 1e-2, "betas": (0.9, 0.999), "damping": 0.0}
VARIANTS = {
    "baseline": (base, None),
    "lr1e-3": ({**base, "lr": 1e-3}, None),
    "kl0.1": ({**base, "kl_weight": 0.1}, None),
    "grad2xM": ({**base, "curvature": ScaledGrad2(10)}, None),
    "tau_fixed_kfac": (base, "kfac"),
}
split = load_uci("yacht", 0)
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
for name in sys.argv[1].split(","):
    opts, noise = VARIANTS[name]
    P.GammaNoise = GammaNoise
    if noise == "kfac":  # E_q[τ] of noisy K-FAC's split-0 fit, noise s.d. 3.613 in target units
        tau = (float(split.y_train.std()) / 3.613) ** 2
        P.GammaNoise = lambda n, tau=tau: FrozenNoise(n, tau)
    m = NNGMethod("noisy_adam", lambda n, o=opts: dict(o))
    t0 = time.time()
    r = P.fit(m, "yacht", split, P.Protocol(epochs=epochs), 0)
    post = captured["t"].posterior()
    sd = torch.cat([v.sqrt().flatten() for v in post.variance])
    q = torch.quantile(sd, torch.tensor([0.1, 0.5, 0.9])).tolist()
    out = {
        "variant": name,
        "epochs": epochs,
        **{k: r[k] for k in ("rmse", "loglik", "noise_std", "final_loss")},
        "sigma_q10_50_90": q,
        "wall": time.time() - t0,
    }
    print(json.dumps(out), flush=True)
