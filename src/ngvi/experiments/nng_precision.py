"""``ngvi nng-precision``: NNG's Fig. 1, the normalised precision matrices of the four NNG posteriors.

Zhang et al. 2018, Fig. 1: "Normalized precision matrices for Gaussian variational posteriors trained using
noisy natural gradient. We used a network with 2 hidden layers of 15 units each, trained on the Boston
housing dataset." Here the same network (13-15-15-1, ReLU, 466 weights) is trained on Boston's split 0 with
each of NNG-full (:class:`ngvi.NNGFull`), NNG-FFG (noisy Adam), NNG-MVG (noisy K-FAC) and NNG-BlkTri,
under the settings of ``ngvi uci-nng`` (learned observation noise, η = 1, the true Fisher; one training
particle; the step sizes at 0.3×, see ``SLOW``), and the dense posterior precision Λ = Σ⁻¹ of each is
shown normalised to a correlation-like scale, Λᵢⱼ/√(ΛᵢᵢΛⱼⱼ), in parameter order (W₁ row by row, b₁,
W₂, b₂, W₃, b₃; lines mark the layers).

What each family can represent is what the picture shows: FFG a diagonal; MVG one Kronecker-structured
block per layer; BlkTri a dense precision whose inverse (the covariance) is block tridiagonal; full
everything. ``table.md`` lists the mean |normalised precision| within layers and between layers, and the
test metrics of each fit. The precision matrices are kept as ``precision-<method>.npy`` in ``--out``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ngvi

from .core import args as arg_types
from .core import models, training
from .core.methods import METHODS as REGISTRY
from .core.report import markdown_table
from .core.runner import Experiment, Job, Run
from .data import load_uci
from .uci_nng.methods import KFAC_STYLE
from .uci_nng.noise import GammaNoise

#: method -> (label in the figure, trainer options besides data_size, prior_prec, seed)
#: ``ngvi uci-nng``'s settings with the step sizes at 0.3×: at α = 10⁻³ (momentum 0.9) NNG-full's mean ran
#: away after ~120 epochs on this two-hidden-layer net (as its F̄ decays from I towards the data Fisher, the
#: posterior widens towards the prior in the directions the data leave free); 3·10⁻⁴ trains all four
SLOW = {"lr": 3e-4}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "nng_full": ("NNG-full", {**KFAC_STYLE, **SLOW, "curvature": "fisher", "likelihood": "gaussian"}),
    "noisy_adam": ("NNG-FFG (noisy Adam)", {"lr": 3e-3, "betas": (0.9, 0.999), "damping": 0.0}),
    "noisy_kfac": (
        "NNG-MVG (noisy K-FAC)",
        {**KFAC_STYLE, **SLOW, "curvature": "fisher", "likelihood": "gaussian"},
    ),
    "nng_blktri": ("NNG-BlkTri", {**KFAC_STYLE, **SLOW, "curvature": "fisher", "likelihood": "gaussian"}),
}
HIDDEN = [15, 15]
BATCH = 10


def normalised(precision: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.diag(precision))
    return precision / d[:, None] / d[None, :]


def layer_slices(model: torch.nn.Module) -> list[slice]:
    """Where each Linear layer's parameters (weight, then bias) sit in the flattened parameter vector."""
    out, start = [], 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            size = m.weight.numel() + m.bias.numel()
            out.append(slice(start, start + size))
            start += size
    return out


def block_means(norm: np.ndarray, layers: list[slice]) -> dict[str, float]:
    """Mean |normalised precision| off the diagonal within each layer and between each pair of layers."""
    out = {}
    for i, a in enumerate(layers):
        block = np.abs(norm[a, a])
        n = block.shape[0]
        out[f"layer {i + 1}"] = float((block.sum() - np.trace(block)) / (n * n - n))
        for j in range(i + 1, len(layers)):
            out[f"layers {i + 1}–{j + 1}"] = float(np.abs(norm[a, layers[j]]).mean())
    return out


class NNGPrecision(Experiment):
    name = "nng-precision"
    requires = ("tqdm", "matplotlib", "scipy")
    help = "NNG's Fig. 1: normalised precision matrices of NNG-full, FFG, MVG and BlkTri on Boston"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        arg_types.add_count(parser, "--epochs", None, "epochs (default 300; --quick: 2)")
        arg_types.add_quick(parser, "2 epochs: a smoke run (options given explicitly win)")
        parser.add_argument("--seed", type=arg_types.non_negative_int, default=0)
        arg_types.add_data_dir(parser, "UCI data folder")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            **arg_types.with_quick(args, {"epochs": 300}, {"epochs": 2}),  # an explicit option wins
            "seed": args.seed,
            "hidden": HIDDEN,
            "batch": BATCH,
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        spec = {**self.config(args), "data_dir": args.data_dir, "out": str(run.out.path)}
        return [Job(name, {**spec, "method": name}) for name in FAMILIES]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        torch.manual_seed(spec["seed"])
        split = load_uci("bostonHousing", 0, spec["data_dir"])
        std, scaler = split.standardized()
        x = torch.as_tensor(std.x_train, dtype=torch.float64)
        y = torch.as_tensor(std.y_train, dtype=torch.float64).unsqueeze(1)
        model = models.mlp(x.shape[1], HIDDEN, 1).double()
        n = x.shape[0]
        options = {**FAMILIES[spec["method"]][1], "prior_prec": 1.0, "seed": spec["seed"]}
        trainer = REGISTRY[spec["method"]].build(model, n, **options)
        noise = GammaNoise(n)
        fisher = options.get("curvature") == "fisher"

        def after_step(loss: float) -> None:
            noise.update(2.0 * loss / noise.mean())
            if fisher:
                trainer.curvature_estimator.likelihood.precision = noise.mean()

        if fisher:
            trainer.curvature_estimator.likelihood.precision = noise.mean()
        training.train(
            model, trainer, x, y, lambda out, t: 0.5 * noise.mean() * ((out - t) ** 2).mean(),
            epochs=spec["epochs"], batch_size=BATCH, generator=torch.Generator().manual_seed(spec["seed"]),
            after_step=after_step,
        )  # fmt: skip
        from ngvi.posterior import dense_covariance

        precision = torch.linalg.inv(dense_covariance(trainer.posterior())).numpy()
        np.save(Path(spec["out"]) / f"precision-{spec['method']}.npy", precision.astype(np.float32))
        norm = normalised(precision)
        x_test = torch.as_tensor(std.x_test, dtype=torch.float64)
        out = ngvi.predict(model, trainer, x_test, samples=100)[..., 0] * scaler.y_std + scaler.y_mean
        y_test = torch.as_tensor(split.y_test, dtype=torch.float64)
        return {
            "params": int(precision.shape[0]),
            "blocks": block_means(norm, layer_slices(model)),
            "test_rmse": float((out.mean(0) - y_test).square().mean().sqrt()),
            "noise_std": float(scaler.y_std / math.sqrt(noise.mean())),
            "seconds": time.perf_counter() - start,
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        runs = run.results["runs"]
        names = [n for n in FAMILIES if n in runs]
        keys = list(runs[names[0]]["blocks"])
        rows = [
            [FAMILIES[n][0], *(f"{runs[n]['blocks'][k]:.3f}" for k in keys), f"{runs[n]['test_rmse']:.2f}",
             f"{runs[n]['seconds']:.0f}"]
            for n in names
        ]  # fmt: skip
        cfg = run.results["config"]
        text = (
            "# NNG's Fig. 1: normalised precision matrices (Boston, 13-15-15-1)\n\n"
            f"Boston housing split 0, {cfg['epochs']} epochs in minibatches of {cfg['batch']}, one training "
            "particle, learned observation noise (Gamma(6, 6) prior), η = 1, the true Fisher (noisy Adam: "
            "its ĝ²). Mean |Λᵢⱼ/√(ΛᵢᵢΛⱼⱼ)| off the diagonal, within and between the three layers:\n\n"
            + markdown_table(["posterior", *keys, "test RMSE", "seconds"], rows)
        )
        (run.out / "table.md").write_text(text)
        self._figure(run, names)
        print(text)
        print(f"wrote {run.out / 'table.md'}, {run.out / 'precision.png'} and {run.out / 'results.json'}")

    @staticmethod
    def _figure(run: Run, names: list[str]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        torch.manual_seed(0)
        model = models.mlp(13, HIDDEN, 1)
        layers = layer_slices(model)
        fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.7))
        image = None
        for ax, name in zip(np.atleast_1d(axes), names, strict=True):
            norm = normalised(np.load(run.out / f"precision-{name}.npy").astype(np.float64))
            image = ax.imshow(np.abs(norm), cmap="Greys", vmin=0.0, vmax=0.5, interpolation="nearest")
            for s in layers[1:]:
                ax.axhline(s.start - 0.5, color="tab:red", lw=0.6)
                ax.axvline(s.start - 0.5, color="tab:red", lw=0.6)
            ax.set_title(FAMILIES[name][0], fontsize=10)
            ax.set_xlabel("weight index (W₁, b₁ | W₂, b₂ | W₃, b₃)", fontsize=7)
            ax.tick_params(labelsize=7)
        np.atleast_1d(axes)[0].set_ylabel("weight index", fontsize=8)
        fig.suptitle(
            "Normalised posterior precision |Λᵢⱼ| / √(Λᵢᵢ Λⱼⱼ), 13-15-15-1 MLP on Boston", fontsize=10
        )
        cbar = fig.colorbar(image, ax=list(np.atleast_1d(axes)), shrink=0.8, extend="max")
        cbar.ax.tick_params(labelsize=7)
        fig.savefig(run.out / "precision.png", dpi=130, bbox_inches="tight")
        plt.close(fig)


EXPERIMENT = NNGPrecision()
