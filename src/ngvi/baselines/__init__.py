"""Baselines that share ngvi's model and prior conventions, and exact references to test against.

* :class:`BBVI` — Bayes by Backprop (mean-field Gaussian, reparameterisation + local reparameterisation).
* :class:`MCDropout` and :func:`mc_dropout_mlp` — MC dropout (Gal & Ghahramani 2016).
* :class:`MAP` — Adam on the MAP objective f(θ) + (λ/2N)‖θ‖².
* :class:`DeepEnsemble` — K MAP networks from independent inits (Lakshminarayanan et al. 2017): the
  reference a user would pick instead of a posterior; it costs K× MAP in memory and compute.
* :class:`KFAC` — K-FAC (Martens & Grosse 2015) on the same objective: noisy K-FAC without the noise.
* :func:`nuts_posterior` — the exact posterior of a small torch model sampled by pyro-ppl's NUTS, with R-hat
  and effective sample sizes (:mod:`ngvi.baselines.nuts`; pyro is imported only when it is called).
* :mod:`ngvi.baselines.exact` — exact posteriors of Bayesian linear regression and the exact mean-field
  Gaussian of Bayesian logistic regression.

Every baseline has ``step(closure)``, ``sampled_params(train=False)`` (so :func:`ngvi.predict` works),
``state_dict``/``load_state_dict``; the closure returns the **mean** NLL of the minibatch, ``data_size`` N
scales it to the data set, and the prior is N(0, I/λ) with λ = ``prior_prec``.
"""

from . import exact
from .bbvi import BBVI
from .ensemble import DeepEnsemble
from .exact import (
    linear_regression_elbo,
    linear_regression_mean_field,
    linear_regression_posterior,
    logistic_regression_elbo,
    logistic_regression_mean_field,
)
from .kfac import KFAC
from .map import MAP
from .mc_dropout import MCDropout, mc_dropout_mlp, mc_dropout_weight_decay
from .nuts import NUTSPosterior, nuts_posterior

__all__ = [
    "BBVI",
    "KFAC",
    "MAP",
    "DeepEnsemble",
    "MCDropout",
    "NUTSPosterior",
    "exact",
    "linear_regression_elbo",
    "linear_regression_mean_field",
    "linear_regression_posterior",
    "logistic_regression_elbo",
    "logistic_regression_mean_field",
    "mc_dropout_mlp",
    "mc_dropout_weight_decay",
    "nuts_posterior",
]
