"""Protein split 0 under NNG's protocol: noisy K-FAC's factor eigenvalues and weights, step by step.

Prints, every 500 steps and at every step with a loss above 5, per layer: the smallest and largest
eigenvalue of the Kronecker factors A and S and the largest |μ| (README, "protein"). Variants change one
setting: ``base`` (the protocol), ``beta1e-2`` (factor EMA step 10⁻²), ``damp<γ>`` (extrinsic damping).

    NGVI_DATA=... PYTHONPATH=src .venv/bin/python docs/results/uci-nng/diagnose_protein.py base 14
"""

import json
import sys
import time

import torch

from ngvi.experiments.core import training
from ngvi.experiments.data import load_uci
from ngvi.experiments.uci_nng import protocol as P
from ngvi.experiments.uci_nng.methods import KFAC_STYLE, NNGMethod, _fisher

torch.set_num_threads(1)
_train = training.train


def _eig(m: torch.Tensor) -> tuple[float, float]:
    e = torch.linalg.eigvalsh(m.double())
    return float(e.min()), float(e.max())


def train(model, trainer, *args, after_step=None, **kwargs):
    step = [0]

    def wrapped(loss):
        after_step(loss)
        step[0] += 1
        if loss > 5 or step[0] % 500 == 0:
            rec = {"step": step[0], "loss": loss}
            layers = [(p, trainer.state[p]) for p in model.parameters() if "factor_A" in trainer.state[p]]
            for i, (p, st) in enumerate(layers):
                rec[f"L{i}"] = [*_eig(st["factor_A"]), *_eig(st["factor_S"]), float(p.detach().abs().max())]
            print(json.dumps(rec), flush=True)

    return _train(model, trainer, *args, after_step=wrapped, **kwargs)


P.training.train = train
variant, epochs = sys.argv[1], int(sys.argv[2])
opts = {**KFAC_STYLE, "sampling": "local"}
if variant == "beta1e-2":
    opts["beta"] = 1e-2
elif variant.startswith("damp"):
    opts["damping"] = float(variant[4:])
method = NNGMethod("noisy_kfac", _fisher(opts), copies=True, true_fisher=True)
start = time.time()
try:
    split = load_uci("protein", 0)
    r = P.fit(method, "protein-tertiary-structure", split, P.Protocol(epochs_large=epochs), 0)
    print(json.dumps({k: r[k] for k in ("rmse", "loglik", "noise_std", "final_loss", "steps")}))
except FloatingPointError as err:
    print("DIVERGED", err)
print("wall", time.time() - start)
