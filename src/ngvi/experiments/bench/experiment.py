from __future__ import annotations

import argparse
from typing import Any

import torch

from ..core import args as types
from ..core.runner import Experiment, Job, Run
from .flops import kfac_flops, matmul_rate
from .measure import DEFAULT_MODELS, environment, problems, run_problem, sweep_problem
from .methods import KFAC_CYCLE, REFERENCES, availability, methods
from .report import SWEEP_METHODS, plot_scaling, table
from .state_memory import measure as measure_state_memory
from .state_memory import table as state_memory_table


def _default_device() -> torch.device:
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return acc if acc is not None else torch.device("cpu")


#: the options that --quick sets (when not given), with their defaults; --quick also shrinks the models
DEFAULTS = {"sweep": [100, 300, 1000, 3000], "warmup": 5, "rounds": 6, "steps": 10}
QUICK = {"sweep": [16, 48], "warmup": 2, "rounds": 2, "steps": 2}


class Bench(Experiment):
    name = "bench"
    help = "step time and peak memory of every optimizer against torch.optim.Adam and the floor (~15 min)"
    parallel = False  # timings: one job after another, in this process

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--device",
            type=types.device,
            default=None,
            help="cpu, cuda, ... (default: the accelerator if any)",
        )
        types.add_quick(parser, "tiny models and few steps: a smoke run (options given explicitly win)")
        parser.add_argument(
            "--methods",
            type=types.names(methods(noise_variants=True)),
            default=None,
            help=f"comma-separated subset of: {', '.join(methods(noise_variants=True))}",
        )
        parser.add_argument(
            "--models",
            type=types.names(("mlp", "cnn", "chain", "lm")),
            default=None,
            help="mlp, cnn, chain (many small tensors), lm (a GPT-style model: scaled down on the CPU, the "
            "full 91M weights on an accelerator); default mlp,cnn,chain",
        )
        parser.add_argument(
            "--sweep",
            type=lambda text: [types.positive_int(w) for w in text.split(",") if w.strip()],
            default=None,
            help="MLP widths for the scaling plot (default 100,300,1000,3000; --quick: 16,48; '' for none)",
        )
        types.add_count(parser, "--warmup", None, "untimed steps first (default 5; --quick: 2)")
        types.add_count(parser, "--rounds", None, "interleaved rounds (default 6; --quick: 2)")
        types.add_count(parser, "--steps", None, "timed steps per method per round (default 10; --quick: 2)")
        types.add_count(parser, "--threads", None, "torch threads (default: torch's)")
        parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
        parser.add_argument("--noise-variants", action="store_true", help="also time noise='antithetic'")

    def _settings(self, args: argparse.Namespace) -> dict[str, Any]:
        all_methods = methods(args.noise_variants)
        names = args.methods or [
            n for n in all_methods if not n.endswith("-antithetic") or args.noise_variants
        ]
        names = [*REFERENCES, *[n for n in names if n not in REFERENCES]]  # the references first
        quick = args.quick
        return {
            "quick": quick,
            "methods": names,
            "models": args.models or list(DEFAULT_MODELS),
            **types.with_quick(args, DEFAULTS, QUICK),  # an explicit option wins over --quick
            "device": str(torch.device(args.device) if args.device else _default_device()),
            "threads": args.threads or torch.get_num_threads(),
            "memory": not args.no_memory,
            "noise_variants": args.noise_variants,
        }

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return self._settings(args)

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        settings = self._settings(args)
        jobs = [Job(f"problem/{key}", {**settings, "problem": key}) for key in settings["models"]]
        jobs += [Job(f"sweep/{width}", {**settings, "width": width}) for width in settings["sweep"]]
        if settings["memory"]:  # the state per weight for float32 and bfloat16 parameters (fp32_state)
            jobs.append(Job("state_memory", {**settings, "state_memory": True}))
        return jobs

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Every chosen method on one problem, timed in interleaved rounds (and its memory, if asked)."""
        torch.set_num_threads(spec["threads"])  # the runner restores its own setting afterwards
        all_methods = methods(spec["noise_variants"])
        chosen = {n: all_methods[n] for n in spec["methods"] if availability(all_methods[n]) is None}
        device = torch.device(spec["device"])
        if spec.get("state_memory"):
            return measure_state_memory(spec["quick"])
        if "problem" in spec:
            problem = problems(spec["quick"], full_lm=device.type != "cpu")[spec["problem"]]
            result = run_problem(
                problem, chosen, device, spec["warmup"], spec["rounds"], spec["steps"], spec["memory"], None,
                count=True,
            )  # fmt: skip
            if any(n.split("-")[0] in KFAC_CYCLE for n in chosen):  # K-FAC's FLOP floor, same process
                x, _ = problem.data(device)
                flops = kfac_flops(problem.model(device), x, inv_every=max(KFAC_CYCLE.values()))
                result["kfac_flops"] = flops.terms()
                result["matmul_flops_per_second"] = matmul_rate(device=device)
            return result
        sweep = {n: m for n, m in chosen.items() if n in SWEEP_METHODS}
        batch = 16 if spec["quick"] else 256
        return run_problem(
            sweep_problem(spec["width"], batch), sweep, device, max(2, spec["warmup"] // 2), spec["rounds"],
            max(2, spec["steps"] // 2), False, None,
        )  # fmt: skip

    def report(self, args: argparse.Namespace, run: Run) -> None:
        settings = self._settings(args)
        all_methods = methods(args.noise_variants)
        runs = run.results["runs"]
        results = {
            "environment": environment(torch.device(settings["device"])) | {"threads": settings["threads"]},
            "problems": {k: runs[f"problem/{k}"] for k in settings["models"]},
            "sweep": {str(w): runs[f"sweep/{w}"] for w in settings["sweep"]},
            "missing": {n: why for n in settings["methods"] if (why := availability(all_methods[n]))},
        }
        run.results["environment"] = results["environment"]
        run.save()
        text = table(results)
        if "state_memory" in runs:
            text += "\n" + state_memory_table(runs["state_memory"]) + "\n"
        (run.out / "table.md").write_text(text)
        written = [run.out / "table.md", run.out / "results.json"]
        if results["sweep"]:
            plot_scaling(results, run.out / "scaling.png")
            written.insert(1, run.out / "scaling.png")
        print((run.out / "table.md").read_text())
        print("wrote " + ", ".join(map(str, written)))


EXPERIMENT = Bench()
