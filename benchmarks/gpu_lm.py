"""The GPU step bench (issue 30): ms per step of every rule on the language model, beside AdamW (fused).

One run of this script makes ``docs/results/bench/gpu/`` (results.json, table.md). The methods run
interleaved in rounds on one GPU, each on its own copy of the model, so every ratio compares steps taken
minutes apart on the same card; kernel launches per step come from torch.profiler, host reads per step from
a TorchDispatchMode (``aten._local_scalar_dense`` and kin, reads of tensors on the GPU); both counters are
the bench's (``ngvi.experiments.bench.counting``). Each ngvi rule runs with its defaults, twice:
``finite_check="host"`` (one value read back per step) and ``"device"`` (nothing read back; what the
default ``"auto"`` picks on a GPU for all but the K-FAC family). ivon-opt runs where it imports (``pip
install ivon-opt``). ``benchmarks/gpu_run.sh`` runs it with the GPU checks and the FSDP2 example.

    PYTHONPATH=src python benchmarks/gpu_lm.py --out docs/results/bench/gpu      # on a GPU, ~2 minutes
    PYTHONPATH=src python benchmarks/gpu_lm.py --small --device cpu --rounds 2    # a smoke run on the CPU
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import ngvi
from ngvi.baselines import KFAC
from ngvi.experiments.bench.counting import OpCounter, kernel_launches
from ngvi.experiments.bench.lm import FULL, SMALL, LanguageModel, lm_batch, lm_loss


def methods(n: int, compiled: bool) -> dict:
    """label → (builder(model) → optimizer, kind): "torch" steps after backward, "ngvi" takes the closure.

    Each element-wise rule runs on the flat buffers (the default) with either finiteness check; IVON and
    Vadam also on the per-tensor path (``flat=False``, the engine before the buffers) for a before/after in
    one run, and with ``compiled`` through ``torch.compile`` (device check: nothing read back)."""
    out = {
        "AdamW (fused)": (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True), "torch"),
        "forward + backward": (None, "none"),
    }
    for check in ("host", "device"):
        for name in ("IVON", "Vadam", "Vprop", "NoisyAdam", "BAdam"):
            cls = getattr(ngvi, name)
            out[f"{name} ({check})"] = (
                lambda m, cls=cls, check=check: cls(
                    [p for p in m.parameters() if p.requires_grad],
                    data_size=n,
                    engine={"finite_check": check},
                ),
                "ngvi",
            )
        out[f"VOGN ({check})"] = (
            lambda m, check=check: ngvi.VOGN(m, data_size=n, engine={"finite_check": check}),
            "ngvi",
        )
    for name in ("IVON", "Vadam"):
        cls = getattr(ngvi, name)
        out[f"{name} (host, per-tensor)"] = (
            lambda m, cls=cls: cls(
                [p for p in m.parameters() if p.requires_grad], data_size=n, engine={"flat": False}
            ),
            "ngvi",
        )
        if compiled:
            out[f"{name} (device, compiled)"] = (
                lambda m, cls=cls: cls(
                    [p for p in m.parameters() if p.requires_grad],
                    data_size=n,
                    engine={"finite_check": "device", "compile": True},
                ),
                "ngvi",
            )
    for check in ("host", "device"):
        out[f"K-FAC ({check})"] = (
            lambda m, check=check: KFAC(m, data_size=n, engine={"finite_check": check}),
            "ngvi",
        )
        out[f"NoisyKFAC ({check})"] = (
            lambda m, check=check: ngvi.NoisyKFAC(m, data_size=n, engine={"finite_check": check}),
            "ngvi",
        )
    try:
        import ivon

        out["ivon-opt IVON"] = (
            lambda m: ivon.IVON([p for p in m.parameters() if p.requires_grad], lr=0.1, ess=n, hess_init=1.0),
            "ivon",
        )
    except ImportError:
        print("ivon-opt not installed: left out", file=sys.stderr)
    return out


def make_step(kind, opt, model, x, y, device):
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    params = [p for p in model.parameters() if p.requires_grad]

    def forward_backward():
        for p in params:
            p.grad = None
        with autocast:
            logits = model(x)
        loss = lm_loss(logits, y)
        return loss, logits

    if kind == "none":
        return lambda: forward_backward()[0].backward()
    if kind == "torch":

        def step():
            loss, _ = forward_backward()
            loss.backward()
            opt.step()

        return step
    if kind == "ivon":

        def step():
            with opt.sampled_params(train=True):
                loss, _ = forward_backward()
                loss.backward()
            opt.step()

        return step

    def closure():
        loss, logits = forward_backward()
        opt.backward(loss, logits)
        return loss

    return lambda: opt.step(closure)


def state_bytes(opt) -> int:
    if opt is None:
        return 0
    entries = [st for st in opt.state.values() if isinstance(st, dict)]
    return sum(v.numel() * v.element_size() for st in entries for v in st.values() if torch.is_tensor(v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="the CPU's scaled-down model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="steps per method per round")
    ap.add_argument("--only", default="", help="labels separated by ';' (default: all)")
    ap.add_argument("--out", default="docs/results/bench/gpu")
    ap.add_argument("--no-mask", action="store_true", help="diagnostic: the device path without its mask")
    ap.add_argument("--top", default="", help="print the host-time profile of this label's step")
    ap.add_argument("--compile", action="store_true", help="also IVON and Vadam with compile=True")
    args = ap.parse_args()
    if args.no_mask:  # what the mask costs (a bad step would then corrupt the state: a measurement only)
        import contextlib

        import ngvi.optim.engine.optimizer as engine

        engine.masked = lambda *args, **kwargs: contextlib.nullcontext()
    device = torch.device(args.device)
    config = SMALL if args.small else FULL
    torch.manual_seed(0)
    base = LanguageModel(config).to(device)
    x, y = lm_batch(config, device)
    table = methods(n=100_000, compiled=args.compile)
    if args.only:
        table = {k: v for k, v in table.items() if k in args.only.split(";")}
    runs, rows = {}, collections.OrderedDict()
    failed = {}  # label → the error that stopped it (the others still run: one lent run, no second)
    for label, (build, kind) in table.items():
        model = copy.deepcopy(base)
        try:
            opt = build(model) if build else None
        except Exception as err:
            failed[label] = f"{type(err).__name__}: {err}"
            continue
        runs[label] = (make_step(kind, opt, model, x, y, device), opt, model)
        print(f"built {label}", flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    first_s = {}  # the first step's seconds: a compiled rule's compile time
    for label, (step, _, _) in runs.items():  # warm-up (allocator, cuBLAS plans, the first diagnostics)
        t0 = time.perf_counter()
        try:
            step()
            sync()
            first_s[label] = time.perf_counter() - t0
            for _ in range(2):
                step()
            sync()
        except Exception as err:
            failed[label] = f"{type(err).__name__}: {err}"
            print(f"FAILED {label}: {failed[label]}", flush=True)
            continue
        print(
            f"warm {label}: first step {first_s[label]:.1f} s, {time.perf_counter() - t0:.1f} s", flush=True
        )
    for label in failed:
        runs.pop(label, None)
    times, host = collections.defaultdict(list), collections.defaultdict(list)
    for r in range(args.rounds):
        for label, (step, _, _) in runs.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                t1 = time.perf_counter()
                step()
                host[label].append(1000 * (time.perf_counter() - t1))  # until the host returns
            sync()
            times[label].append(1000 * (time.perf_counter() - t0) / args.steps)
        print(f"round {r + 1}/{args.rounds}", flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for label, (step, opt, _) in runs.items():
        reads = OpCounter()  # the reads of a value on the device: a sync each (on the CPU: every read)
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
        with reads:
            step()
        sync()
        # what one step allocates beyond what was resident before it (gradients, θ, temporaries)
        step_peak = (torch.cuda.max_memory_allocated() - resident) / 2**20 if device.type == "cuda" else None
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(2):
                step()
            sync()
        launches = kernel_launches(prof) / 2
        if label == args.top:
            profile = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
            print(profile, flush=True)
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "profile.txt").write_text(
                f"# {label}: 2 steps under torch.profiler\n{profile}\n"
            )
        rows[label] = {
            "ms": statistics.median(times[label]),
            "ms_rounds": times[label],
            # the host's time in step() (no sync): ≈ ms/step when the host, not the GPU, sets the pace
            "host_ms": statistics.median(host[label]),
            "kernel_launches": launches,
            "host_reads": reads.reads[device.type],
            "state_MiB": state_bytes(opt) / 2**20,
            "step_peak_MiB": step_peak,
            "first_step_s": first_s[label],
        }
    ref = rows["AdamW (fused)"]["ms"]
    fb = rows["forward + backward"]["ms"]
    ivon_ref = rows.get("ivon-opt IVON", {}).get("ms")
    kfac = rows.get("K-FAC (host)", {}).get("ms")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
    weights = sum(p.numel() for p in base.parameters() if p.requires_grad) / 1e6
    lines = [
        f"# GPU step bench: {name}",
        "",
        f"torch {torch.__version__}; model {config}; {weights:.1f}M trainable weights; bf16 autocast, "
        f"float32 parameters; median of {args.rounds} interleaved rounds of {args.steps} steps. Command: "
        f"`PYTHONPATH=src python benchmarks/gpu_lm.py {' '.join(sys.argv[1:])}`",
        "",
        "| method | ms/step | × AdamW (fused) | ms over fwd+bwd | host ms/step | × ivon-opt | × K-FAC "
        "| kernel launches/step | host reads/step | state MiB | step peak MiB | first step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(ms: float, ref_ms: float | None) -> str:
        return f"{ms / ref_ms:.2f}" if ref_ms else "–"

    for label, row in rows.items():
        ms, peak = row["ms"], row["step_peak_MiB"]
        lines.append(
            f"| {label} | {ms:.1f} | {ms / ref:.3f} | {ms - fb:.1f} | {row['host_ms']:.1f} | "
            f"{ratio(ms, ivon_ref)} | "
            f"{ratio(ms, kfac) if 'K-FAC' in label or 'KFAC' in label else '–'} | "
            f"{row['kernel_launches']:.0f} | {row['host_reads']} | {row['state_MiB']:.0f} | "
            f"{'–' if peak is None else f'{peak:.0f}'} | "
            f"{row['first_step_s']:.1f} |"
        )
    lines += [f"\n{label} failed: {err}" for label, err in failed.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    meta = {
        "torch": torch.__version__,
        "device": str(device),
        "config": config.__dict__,
        "argv": sys.argv[1:],
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "failed": failed}, indent=1))


if __name__ == "__main__":
    main()
