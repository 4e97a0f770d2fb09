"""Every experiment that builds a member of the K-FAC family (NoisyKFAC, NNGBlkTri, NNGFull, baselines.KFAC)
passes the settings that shape its step, so its committed results do not move when the family's defaults do
(issue 23: the family's defaults changed to lr 0.1, β 10⁻³, momentum 0.5, factors from the identity)."""

from __future__ import annotations

import pytest

from ngvi.experiments.bench.methods import OPTIONS as BENCH
from ngvi.experiments.hmc.protocol import trainer_options
from ngvi.experiments.nng_precision import FAMILIES
from ngvi.experiments.uci_nng.methods import METHODS as UCI_NNG
from ngvi.experiments.vision.experiment import OPTIONS as VISION

STEP_SHAPING = {"lr", "beta", "momentum", "init_prec"}

PINNED = {
    "hmc/active nng_blktri": trainer_options("nng_blktri", 300),
    "hmc/active noisy_kfac": trainer_options("noisy_kfac", 300),
    "uci_nng nng_blktri": UCI_NNG["nng_blktri"].options(300),
    "uci_nng noisy_kfac": UCI_NNG["noisy_kfac"].options(300),
    **{f"nng_precision {name}": FAMILIES[name][1] for name in ("nng_full", "noisy_kfac", "nng_blktri")},
    "vision kfac": VISION["kfac"],
    "vision noisy_kfac": VISION["noisy_kfac"],
    "bench kfac": BENCH["kfac"],
}


@pytest.mark.parametrize("where", list(PINNED))
def test_experiments_pass_the_kronecker_familys_step_settings(where):
    missing = STEP_SHAPING - set(PINNED[where])
    assert not missing, f"{where} relies on the family's defaults for {sorted(missing)}"
