"""``ngvi hmc``: NNG §5.3, Table 4 (agreement of predictive variances with HMC), and the small-data BNN
setting it shares with ``ngvi active`` (:mod:`.protocol`)."""

from .experiment import EXPERIMENT, HMC

__all__ = ["EXPERIMENT", "HMC"]
