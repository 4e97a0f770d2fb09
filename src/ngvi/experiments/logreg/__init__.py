"""``ngvi logreg``: Bayesian logistic regression against its exact mean-field posterior (Khan et al.
2018, §6.1, App. I, Fig. 2). See :mod:`.protocol` for the settings and :mod:`.experiment` for the jobs."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
