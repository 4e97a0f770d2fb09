"""``ngvi convergence``: test log-loss against iterations (Khan et al. 2018, App. J.2, Fig. 3 left)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
