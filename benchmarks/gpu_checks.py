"""GPU checks of what CI can only test on the CPU (one short run on a lent GPU; prints one line per check).

    PYTHONPATH=src python benchmarks/gpu_checks.py          # (cpu: a smoke run of the script itself)

1. ``finite_check="device"``: no host synchronisation in steady steps (CUDA runtime calls counted with
   torch.profiler: cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize and device-to-host
   copies), eager and compiled (``compile=True``), a NaN step masked (μ bitwise unchanged) and reported
   at the next step.
2. The flat buffers on CUDA: fed the same ε (``noise="chunked"`` keys it by parameter on both paths), the
   flat path's μ after 5 steps against the per-tensor path's (``flat=False``), largest difference printed.
3. The K-FAC family: host synchronisations per step between inversions and at an inversion, either check.
4. A posterior saved from CUDA and loaded back (the artefact of issue 32), and a deep ensemble's predict.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import ngvi
from ngvi.baselines import KFAC, DeepEnsemble

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def syncs(opt, closure, n: int) -> float:
    """Host synchronisations per ``opt.step(closure)`` (blocking runtime calls and device-to-host copies)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            opt.step(closure)
    count = 0
    for e in prof.events():
        if e.name in SYNC_CALLS or (e.name.startswith("cudaMemcpy") and "Async" not in e.name):
            count += 1
    return count / n


def mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    ).to(device)


def closure_for(opt, model, x, y, poison=None):
    def closure():
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.backward(loss, out)
        if poison is not None:
            poison()
        return loss

    return closure


def main() -> None:
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")  # "cpu": a smoke run
    x, y = torch.randn(64, 32, device=device), torch.randn(64, 1, device=device)
    for name in ("IVON", "Vadam", "Vprop", "NoisyAdam", "BAdam"):
        extra = [("device", True)] if name in ("IVON", "Vadam") else []  # compiling costs lent seconds
        for check, compiled in [("host", False), ("device", False), *extra]:
            model = mlp(device)
            opt = getattr(ngvi, name)(
                model.parameters(), data_size=1000, engine={"finite_check": check, "compile": compiled}
            )
            closure = closure_for(opt, model, x, y)
            for _ in range(3):
                opt.step(closure)
            torch.accelerator.synchronize() if device.type != "cpu" else None
            label = f"finite_check={check}" + (", compiled" if compiled else "")
            print(f"{name:9s} {label:26s}: {syncs(opt, closure, 5):.1f} syncs/step", flush=True)
    for check in ("host", "device"):
        model = mlp(device)
        opt = ngvi.VOGN(model, data_size=1000, engine={"finite_check": check})
        closure = closure_for(opt, model, x, y)
        for _ in range(3):
            opt.step(closure)
        print(f"VOGN      finite_check={check:6s}: {syncs(opt, closure, 5):.1f} syncs/step", flush=True)

    for name in ("IVON", "Vadam", "Vprop", "NoisyAdam", "BAdam", "VON", "VadaGrad"):
        means = []
        for flat in (True, False):
            model = mlp(device)
            engine = {"noise": "chunked", "flat": flat}
            opt = getattr(ngvi, name)(model.parameters(), data_size=1000, engine=engine)
            for _ in range(5):
                opt.step(closure_for(opt, model, x, y))
            means.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        diff = (means[0] - means[1]).abs().max().item()
        print(
            f"{name:9s} flat vs per-tensor on {device.type}, same ε, 5 steps: max |Δμ| = {diff:.3g}",
            flush=True,
        )
    model = mlp(device)
    opt = ngvi.IVON(model.parameters(), data_size=1000, engine={"finite_check": "device"})
    opt.step(closure_for(opt, model, x, y))
    before = [p.detach().clone() for p in model.parameters()]
    opt.step(closure_for(opt, model, x, y, poison=lambda: model[4].bias.grad.fill_(float("nan"))))
    masked = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    try:
        opt.step(closure_for(opt, model, x, y))
        raised = "no error"
    except ngvi.NonFiniteGradientError as err:
        raised = str(err).split(". That")[0]
    print(f"NaN step on CUDA: μ unchanged = {masked}; next step: {raised}")

    for cls in (KFAC, ngvi.NoisyKFAC):
        for check in ("host", "device"):
            model = mlp(device)
            opt = cls(model, data_size=1000, inv_every=5, engine={"finite_check": check})
            closure = closure_for(opt, model, x, y)
            opt.step(closure)  # step 1 inverts; steps 2–5 do not, step 6 does
            between = syncs(opt, closure, 4)
            torch.accelerator.synchronize() if device.type != "cpu" else None
            at = syncs(opt, closure, 1)
            print(
                f"{cls.__name__} finite_check={check}: {between:.1f} syncs/step between inversions, "
                f"{at:.0f} at an inversion",
                flush=True,
            )

    model = mlp(device)
    opt = ngvi.Vadam(model.parameters(), data_size=1000)
    for _ in range(3):
        opt.step(closure_for(opt, model, x, y))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "posterior.safetensors"
        ngvi.save_posterior(model, opt, path)
        loaded = ngvi.load_posterior(path, model=model)
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(opt.posterior().mean, loaded.mean, strict=True))
    print(f"posterior saved from CUDA and loaded: means equal = {same}")
    model = mlp(device)
    ens = DeepEnsemble(model, data_size=1000, members=3, seed=0)
    for _ in range(3):
        ens.step(closure_for(ens, model, x, y))
    draws = ngvi.predict(model, ens, x, samples=6)
    print(
        f"deep ensemble on CUDA: predict {tuple(draws.shape)} on {draws.device}, members differ = "
        f"{not torch.equal(draws[0], draws[1])}"
    )


if __name__ == "__main__":
    main()
