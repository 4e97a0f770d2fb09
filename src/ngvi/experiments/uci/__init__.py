"""``ngvi uci``: the UCI regression benchmark of Khan et al. 2018 (Table 1) and Zhang et al. 2018 (Table 1).

Protocol (Khan et al. 2018, App. J.1; Zhang et al. 2018, §5.1): Gal & Ghahramani's splits (20 per data set,
5 for protein), one hidden layer of 50 ReLU units (100 for protein), 40 epochs, minibatches of 32 on the four
small sets and 128 on the others, inputs and targets standardised with training statistics, 100 posterior
samples at test time, RMSE and log-likelihood in the targets' units. λ and τ are tuned by Bayesian
optimisation (see :mod:`.tuning`); ``--tune none`` uses cached or shipped values.
"""

from .experiment import EXPERIMENT, STANDARD_SETS, UCI

__all__ = ["EXPERIMENT", "STANDARD_SETS", "UCI"]
