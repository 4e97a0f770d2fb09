"""Golden trajectories: every trainer's posterior after a dozen seeded steps, pinned bit for bit.

Checked by ``tests/test_golden.py``: refactors must keep every trajectory **bitwise** identical. A change
that is meant to alter a trajectory (a new random stream, a fixed bug) re-records in the same commit
(``--record``) and says why in its message. The recording of the reference commit e6e6de6 (main before the
architecture refactor) is kept as ``trajectories_per_tensor.json``: the flat buffers of the element-wise rules
draw one ε per bucket (a new stream, so ``trajectories.json`` was re-recorded with them), and the per-tensor
path (``--per-tensor``: every optimizer as with ``flat=False``) must still compute the old recording.

Runs happen in a child process with pinned numerics (:data:`PINNED_ENV`: ATen's scalar kernels, MKL's
reproducible mode, one thread, no oneDNN). That makes them repeatable on one machine, but not identical
across CPU types: MKL's and glibc's code paths still differ in the last bit between, say, an Intel and an AMD
EPYC machine, and 12 steps carry that bit into every digest. So the file keeps one set of digests per
*numerics fingerprint* (a digest of a battery of the kernels the trainers use, computed in the same pinned
child): the check is bitwise wherever the machine's fingerprint, or the same digests, were recorded. On a
CPU type never recorded, the test compares the final values with the ones recorded here to a stated
tolerance instead, and warns that it could not check bits (see ``tests/test_golden.py``). ``--add-machine``
records a new CPU type's digests; run it only at the reference commit or after checking that the code
computes the same trajectories (it refuses when the values are outside that tolerance).

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
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import ngvi
from ngvi.baselines import BBVI, MAP, MCDropout

STEPS = 12
N = 64  # data_size
FILE = Path(__file__).with_name("trajectories.json")
#: the recording before the flat buffers (one draw per bucket changed the stream): the per-tensor path
#: (``--per-tensor``, every optimizer as with ``flat=False``) must still compute it bit for bit
PER_TENSOR_FILE = FILE.with_name("trajectories_per_tensor.json")
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

# name -> (factory(model, kind), closure style): "backward", "graph" (create_graph), "output" (fisher).
# Options whose defaults changed since the recording (ngvi 0.2: init_prec="auto", step_moment, Vprop's
# antithetic noise, the natural-gradient rules' momentum; issue 44: IVON's forget_start) are pinned to the
# recorded ones.
CASES: dict[str, tuple[Callable, str]] = {
    "vadam": (
        lambda m, k: ngvi.Vadam(m.parameters(), N, lr=1e-2, init_prec=50.0, step_moment="paper", seed=3),
        "backward",
    ),
    "vadam_defaults": (  # the defaults up to ngvi 0.1, pinned (the start at the prior and eq. 92's step)
        lambda m, k: ngvi.Vadam(m.parameters(), N, init_prec=None, step_moment="paper", seed=3),
        "backward",
    ),
    "vadam_mc3_antithetic": (
        lambda m, k: ngvi.Vadam(
            m.parameters(),
            N,
            lr=1e-2,
            init_prec=50.0,
            mc_samples=3,
            noise="antithetic",
            step_moment="paper",
            seed=3,
        ),
        "backward",
    ),
    "vadam_groups": (
        lambda m, k: ngvi.Vadam(
            [{"params": list(m.parameters())[:2], "lr": 3e-2}, {"params": list(m.parameters())[2:]}],
            N,
            lr=1e-2,
            init_prec=50.0,
            step_moment="paper",
            seed=3,
        ),
        "backward",
    ),
    "vprop": (
        lambda m, k: ngvi.Vprop(
            m.parameters(), N, lr=1e-2, init_prec=50.0, step_moment="paper", noise="normal", seed=3
        ),
        "backward",
    ),
    "vadagrad": (lambda m, k: ngvi.VadaGrad(m.parameters(), lr=1e-2, init_prec=100.0, seed=3), "backward"),
    "von_price": (
        lambda m, k: ngvi.VON(m.parameters(), N, lr=1e-2, beta=0.05, init_prec=50.0, momentum=0.0, seed=3),
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
            momentum=0.0,
            seed=3,
        ),
        "graph",
    ),
    "ivon": (lambda m, k: ngvi.IVON(m.parameters(), N, lr=0.05, forget_start=None, seed=3), "backward"),
    "ivon_clip_mc2": (
        lambda m, k: ngvi.IVON(
            m.parameters(), N, lr=0.05, clip_radius=1e-3, mc_samples=2, forget_start=None, seed=3
        ),
        "backward",
    ),
    "noisy_adam": (
        lambda m, k: ngvi.NoisyAdam(m.parameters(), N, lr=1e-2, damping=1e-3, init_prec=None, seed=3),
        "backward",
    ),
    "badam": (lambda m, k: ngvi.BAdam(m.parameters(), N, lr=1e-2, prior_prec=1.0, seed=3), "backward"),
    "vogn": (
        lambda m, k: ngvi.VOGN(m, N, lr=1e-2, beta=0.05, momentum=0.0, init_prec=50.0, seed=3),
        "backward",
    ),
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
        lambda m, k: ngvi.NoisyKFAC(
            m, N, lr=1e-2, beta=0.1, momentum=0.0, inv_every=5, init_prec=None, seed=3, sampling="weights"
        ),
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
            init_prec=None,
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


def _values(tensors) -> list[float]:
    return [float(v) for t in tensors for v in t.detach().reshape(-1)]


def run_case(name: str, kind: str, manual: bool = False) -> dict[str, dict[str, Any]]:
    """Train case ``name`` on model ``kind``: ``{"digests": ..., "values": ...}`` of the posterior mean,
    variance and the losses (``manual``: the sampled_params form)."""
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
    parts = {"mean": means, "variance": variances, "loss": losses}
    return {
        "digests": {k: _digest(v) for k, v in parts.items()},
        "values": {k: _values(v) for k, v in parts.items()},
    }


def numerics_fingerprint() -> str:
    """A digest of the kernels the trainers use (GEMM, convolution and its backward, the element-wise maths,
    the normal generator), computed under the current numerics: machines with the same fingerprint compute
    the same bits."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 29, generator=gen), torch.randn(29, 23, generator=gen)
    x = torch.randn(3, 2, 9, 9, generator=gen)
    w = torch.randn(4, 2, 3, 3, generator=gen, requires_grad=True)
    out = F.conv2d(x, w, stride=2, padding=1)
    (grad_w,) = torch.autograd.grad(out.square().sum(), w)
    pos = a.abs() + 0.1
    elementwise = [a.exp(), pos.log(), a.tanh(), pos.sqrt(), pos.rsqrt(), a.sin(), a.sigmoid(), F.softplus(a),
                   a.logsumexp(1), pos.pow(1.5), a.reciprocal()]  # fmt: skip
    elementwise.append(F.cross_entropy(a, torch.arange(37) % 29))
    draws = [torch.randn(100, generator=gen), torch.empty(50).normal_(generator=gen)]
    results = [a @ b, torch.addmm(b[0], a, b), out, grad_w, *elementwise, *draws,
               torch.linalg.cholesky(b.T @ b + torch.eye(23))]  # fmt: skip
    return f"torch-{torch.__version__}:{_digest(results)[:16]}"


def all_cases() -> list[tuple[str, str, bool]]:
    cases = []
    for name in CASES:
        kinds = ["linear"] if name == "mc_dropout" else ["linear", "conv"]
        cases += [(name, kind, False) for kind in kinds]
    cases += [("vadam", "linear", True), ("ivon", "conv", True), ("bbvi", "linear", True)]
    return cases


def case_id(name: str, kind: str, manual: bool) -> str:
    return f"{name}/{kind}" + ("/manual" if manual else "")


#: the λ, τ (and dropout) the golden UCI run fits with, pinned here: the shipped table may be retuned
#: (docs/results/uci), which changes the fits but not the library the golden run guards
UCI_HPARAMS = Path(__file__).with_name("uci_yacht_hparams.json")


def run_uci(out: str, data_dir: str) -> None:
    """``ngvi {UCI_COMMAND}`` into ``out``, with the pinned hyperparameters as the run's tuned cache."""
    from ngvi.experiments.cli import main as cli

    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "tuned.json").write_text(UCI_HPARAMS.read_text())
    if cli([*UCI_COMMAND.split(), "--data-dir", data_dir, "--out", out]):
        raise SystemExit("the golden UCI run failed")


def computed() -> dict[str, Any]:
    """This machine's fingerprint, digests and values of every case (run inside the pinned child)."""
    runs = {case_id(*c): run_case(*c) for c in all_cases()}
    return {
        "fingerprint": numerics_fingerprint(),
        "digests": {k: r["digests"] for k, r in runs.items()},
        "values": {k: r["values"] for k, r in runs.items()},
    }


def value_mismatches(got: dict, recorded: dict, rtol: float, atol: float) -> list[str]:
    """The entries of ``got`` (nested dicts/lists of floats) that differ from ``recorded`` beyond
    ``|g − r| ≤ atol + rtol·|r|``, or whose structure differs."""
    if isinstance(recorded, dict):
        if not isinstance(got, dict) or set(got) != set(recorded):
            return ["structure"]
        return [f"{k}/{m}" for k in recorded for m in value_mismatches(got[k], recorded[k], rtol, atol)]
    if isinstance(recorded, list):
        if not isinstance(got, list) or len(got) != len(recorded):
            return ["length"]
        bad = [
            i for i, (g, r) in enumerate(zip(got, recorded, strict=True)) if abs(g - r) > atol + rtol * abs(r)
        ]
        return [f"[{bad[0]}] {got[bad[0]]!r} vs {recorded[bad[0]]!r}"] if bad else []
    return [] if abs(got - recorded) <= atol + rtol * abs(recorded) else [f"{got!r} vs {recorded!r}"]


#: how far values may move between CPU types (``tests/test_golden.py`` states the measurements behind it)
RTOL, ATOL = 2e-3, 2e-5


def record(file: Path, entry_digests: dict, values: Any, fingerprint: str, add: bool) -> None:
    """Write this machine's recording: a fresh file (``add=False``), or one more CPU type (``add=True``,
    refused unless the values agree with the recorded ones to the tolerance)."""
    if add:
        stored = json.loads(file.read_text())
        bad = value_mismatches(values, stored["values"], RTOL, ATOL)
        if bad:
            raise SystemExit(f"refusing --add-machine: values differ beyond tolerance: {bad[:5]}")
        stored["digests"][fingerprint] = entry_digests
    else:
        stored = {"values_from": fingerprint, "values": values, "digests": {fingerprint: entry_digests}}
    file.write_text(_dump(stored))
    print(f"wrote {fingerprint} to {file}")


def _dump(stored: dict) -> str:
    """JSON with one line per case's values (the digests indented as usual)."""
    head = json.dumps({k: v for k, v in stored.items() if k != "values"}, indent=1, sort_keys=True)[:-2]
    cases = ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(stored["values"].items())
    )
    return head + ',\n "values": {\n' + cases + "\n }\n}\n"


def uci_values(out: str) -> dict:
    runs = json.loads((Path(out) / "results.json").read_text())["runs"]
    return {k: {m: v[m] for m in ("curve", "loglik", "rmse")} for k, v in runs.items()}


def uci_digests(values: dict) -> dict[str, str]:
    return {
        k: _digest([torch.tensor(v["curve"]), torch.tensor([v["loglik"], v["rmse"]])])
        for k, v in values.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="write this machine's recording (a new file)")
    parser.add_argument("--add-machine", action="store_true", help="add this CPU type's recording")
    parser.add_argument("--uci", metavar="OUT", help=f"run `ngvi {UCI_COMMAND}` into OUT")
    parser.add_argument("--data-dir", help="the benchmark data (for --uci and recording)")
    parser.add_argument("--per-tensor", action="store_true", help="every optimizer on its per-tensor path")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in PINNED_ENV.items()):
        print(run_pinned(*sys.argv[1:]), end="")
        return
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False  # oneDNN picks kernels by instruction set
    if args.per_tensor:  # as if each optimizer were built with flat=False
        from ngvi.optim.engine import flat

        flat.enabled = lambda opt: False
    if args.uci:
        run_uci(args.uci, args.data_dir)
        (Path(args.uci) / "fingerprint.txt").write_text(numerics_fingerprint())
        return
    got = computed()
    if not (args.record or args.add_machine):
        print(json.dumps(got, sort_keys=True))
        return
    record(
        PER_TENSOR_FILE if args.per_tensor else FILE,
        got["digests"],
        got["values"],
        got["fingerprint"],
        args.add_machine,
    )
    if args.data_dir:
        import tempfile

        with tempfile.TemporaryDirectory() as out:
            run_uci(out, args.data_dir)
            values = uci_values(out)
        record(UCI_FILE, uci_digests(values), values, got["fingerprint"], args.add_machine)


if __name__ == "__main__":
    main()
