r"""Pure update cores: each rule's maths as a function on lists of tensors, as ``torch.optim.adam()`` is.

A core takes the parameter-shaped lists it reads and writes (plain lists or :class:`TensorList`), mutates the
state lists and μ **in place**, and takes every hyperparameter as a keyword. The rules' ``_update`` /
``_precision`` gather their state lists and call :func:`run_core`; the tests call the cores directly.

**Two ways to run a core.**

* *Eager* (``compile=False``, the default): hyperparameters are Python floats (per-tensor values such as bias
  corrections are lists of floats) and the core runs the same ``torch._foreach_*`` kernels, in the same order,
  as the rules did before the cores existed — bit for bit (``tests/test_golden.py``). Where two rules share a
  block but used different op sequences, the block takes the sequence as a parameter (see
  :func:`adam_moments_`, :func:`adam_step_`, :func:`riemannian_ema_`).
* *Captured* (``compile=True``): :func:`run_core` turns every number into a 0-dim float64 tensor on the
  parameters' device (lists of numbers into lists of such tensors) and calls a ``torch.compile``-d copy of
  the core. Dynamo then never specialises on lr, the betas or the step count, so an LR scheduler or the
  growing step count causes no recompile. Only the structure (how many tensors, their shapes, strides,
  dtypes, devices) and the non-numeric options (``None`` / bool flags) select a compiled function; each
  structure gets its own copy of the core's code object, so dynamo's per-code cache limit (8) is never
  shared between structures. Compiled functions live in a module-level cache, never on an optimizer (so
  optimizers still pickle and deepcopy). Inductor fuses each core into a few loops; results agree with eager
  to float round-off (reassociation), not bitwise.

Cores written with :class:`TensorList` run unchanged on tensor scalars, except where a ``torch._foreach_*``
overload only takes Python numbers (``alpha=``, the ``value`` of addcdiv/addcmul, clamp bounds) or where
inductor mishandles a tensor scalar (``_foreach_add(list, Tensor)``): the private helpers of
:mod:`._capture` then use an equivalent formulation on captured scalars and the original kernel on floats.

Modules: :mod:`._capture` (:func:`run_core` and those helpers), :mod:`.blocks` (shared blocks),
:mod:`.updates` (one update core per rule), :mod:`.precisions` (precision cores and :func:`diagonal_sigma`),
:mod:`.kfac` (noisy K-FAC's per-layer cores).

Equation numbers: Khan et al. 2018 ("Fast and scalable Bayesian deep learning by weight-perturbation in Adam",
Fig. 1, eqs. 7–14, App. D–F); Zhang et al. 2018 ("Noisy natural gradient as variational inference", Alg. 1–2,
eqs. 12–13); Shen et al. 2024 ("Variational learning is effective for large deep networks", IVON Alg. 1);
BADAM ("Adam as a Laplace approximation", Alg. 1, eq. 12); Blundell et al. 2015 (Bayes by Backprop).
"""

from __future__ import annotations

from ._capture import run_core
from .blocks import (
    adam_moments_,
    adam_step_,
    bias_corrections,
    natural_sq_length,
    riemannian_ema_,
    scale_,
    summed,
    trust_region,
)
from .kfac import kfac_factor_ema, kfac_natural_step
from .precisions import (
    diagonal_sigma,
    exp_precision,
    identity_precision,
    laplace_precision,
    scaled_precision,
    shifted_precision,
)
from .updates import (
    badam_update_,
    bbvi_update_,
    ivon_update_,
    noisy_adam_update_,
    vadagrad_update_,
    vadam_update_,
    vogn_update_,
    von_update_,
    vprop_update_,
)

__all__ = [
    "adam_moments_",
    "adam_step_",
    "badam_update_",
    "bbvi_update_",
    "bias_corrections",
    "diagonal_sigma",
    "exp_precision",
    "identity_precision",
    "ivon_update_",
    "kfac_factor_ema",
    "kfac_natural_step",
    "laplace_precision",
    "natural_sq_length",
    "noisy_adam_update_",
    "riemannian_ema_",
    "run_core",
    "scale_",
    "scaled_precision",
    "shifted_precision",
    "summed",
    "trust_region",
    "vadagrad_update_",
    "vadam_update_",
    "vogn_update_",
    "von_update_",
    "vprop_update_",
]
