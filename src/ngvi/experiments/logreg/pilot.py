"""The pilot that chose α₀ of the extra rows (IVON, VON, noisy Adam, BBVI) of ``ngvi logreg``.

On split 0 of each data set of Fig. 2b, every extra method runs with α₀ ∈ {0.3, 1, 3} × a base value for the
budget of Fig. 2b; the α₀ with the lowest training negative ELBO (the objective every method minimises) on
both data sets together is kept in :data:`.protocol.EXTRA_LR`. The symmetric KL to MF-Exact is printed for
information only: it played no part in the choice. Run::

    python -m ngvi.experiments.logreg.pilot [--steps 20000] [--data-dir DIR]
"""

from __future__ import annotations

import argparse

from ..core.report import markdown_table
from . import protocol
from .protocol import DATASETS, EXTRA_METHODS

BASE_LR = {"ivon": 0.1, "von": 0.1, "noisy_adam": 0.1, "bbvi": 0.03}
FACTORS = (0.3, 1.0, 3.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    rows, totals = [], {}
    for dataset, spec in DATASETS.items():
        split = protocol.load_split(dataset, 0, args.data_dir)
        reference, _ = protocol.mf_exact(split, spec.prior_prec)
        for name in EXTRA_METHODS:
            for factor in FACTORS:
                lr0 = BASE_LR[name] * factor
                rec = protocol.extra_recipe(name, split.data_size, spec.batch_size, lr0=lr0)
                q, _, seconds = protocol.fit(
                    name, split.x_train, split.y_train, spec.prior_prec, rec, args.steps, 0
                )
                m = protocol.metrics(q, split, spec.prior_prec, reference)
                totals[name, lr0] = totals.get((name, lr0), 0.0) + m["neg_elbo"]
                rows.append(
                    [
                        dataset,
                        name,
                        f"{lr0:g}",
                        f"{m['neg_elbo']:.4f}",
                        f"{m['sym_kl']:.2f}",
                        f"{seconds:.0f}",
                    ]
                )
                print(*rows[-1], flush=True)
    chosen = {
        name: min((lr for n, lr in totals if n == name), key=lambda lr: totals[name, lr])
        for name in EXTRA_METHODS
    }
    print(
        markdown_table(
            ["data set", "method", "α₀", "train neg. ELBO / N", "sym. KL (not used)", "CPU s"], rows
        )
    )
    print("chosen α₀ (lowest summed training negative ELBO):", chosen)


if __name__ == "__main__":
    main()
