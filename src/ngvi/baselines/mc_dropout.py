r"""MC dropout (Gal & Ghahramani 2016): dropout training read as variational inference.

Training is Adam on the mean NLL with dropout on, plus the weight decay that Gal's approximation of
KL(q‖p) gives. For a Linear layer whose input is dropped with rate p (keep probability 1−p), under the prior
N(0, I/λ) on its weights M and bias b,

.. math::
    \mathrm{KL}(q\,\|\,p) \approx \frac{\lambda(1-p)}{2}\lVert M\rVert^2 + \frac{\lambda}{2}\lVert b\rVert^2
    \quad\Rightarrow\quad
    \text{weight decay (Adam's, on the mean loss)} = \frac{\lambda(1-p)}{N}\ \text{for } M,\
    \frac{\lambda}{N}\ \text{for } b \text{ and every other parameter}.

**Relation to Gal's code.** Gal writes the prior through a length-scale l, p(M) = N(0, I/l²), so λ = l², and
minimises ½·mean squared error + reg·‖M‖² with reg = l²(1−p)/(2Nτ). Our closure returns the mean NLL
(τ/2)(y − ŷ)² + const, which is τ times his data term, and torch's ``weight_decay`` is the *gradient*
coefficient, twice the coefficient of ‖M‖²; so our weight decay λ(1−p)/N = 2τ·reg. Same objective, same
prior, with ``prior_prec`` keeping the meaning it has everywhere in ngvi. (Gal's code leaves biases
unregularised; we give them the prior like every other weight.)

**Which layers have dropped inputs.** In every ``nn.Sequential`` of the model, a Linear layer whose nearest
preceding module with parameters is separated from it by dropout modules (with only parameter-free modules
such as activations in between) gets that dropout rate; every other parameter gets p = 0, i.e. the plain
prior λ/N. :func:`mc_dropout_mlp` builds Gal's UCI network in that form.

**Prediction.** ``sampled_params()`` switches the model's dropout modules on (also in eval mode, where
:func:`ngvi.predict` runs), so each forward pass draws fresh masks: one sample of Gal's q. Masks come from
torch's global generator; ``torch.manual_seed`` makes predictions reproducible. Outside the block dropout
follows the module's own mode (off in eval mode). ``posterior()`` raises: q is a mixture, not a Gaussian.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .map import MAP

__all__ = ["MCDropout", "mc_dropout_mlp", "mc_dropout_weight_decay"]

_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def mc_dropout_weight_decay(prior_prec: float, data_size: int, p: float) -> float:
    """λ(1−p)/N: Adam's weight decay for the weights of a layer whose input is dropped with rate p.

    Args:
        prior_prec: λ of the prior N(0, I/λ).
        data_size: N.
        p: the dropout rate of the layer's input, in [0, 1).

    Returns:
        The weight decay λ(1−p)/N.

    Raises:
        ValueError: λ < 0, N not a positive int, or p outside [0, 1).
    """
    check.nonnegative("prior_prec", prior_prec)
    check.data_size(data_size)
    check.unit_interval("p", p)
    return prior_prec * (1.0 - p) / data_size


class MCDropout(MAP):
    """Adam with dropout and Gal's prior-derived weight decay; ``sampled_params`` turns dropout on.

    Args:
        model: a network with dropout modules (e.g. from :func:`mc_dropout_mlp`).
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr, betas, eps: Adam's.
        prior_prec: λ of the prior N(0, I/λ) (Gal's l²).
        mc_samples: dropout masks per ``step(closure)``: the closure runs that many times and Adam takes the
            mean gradient (the MC estimate of the dropout objective's gradient with several masks).

    The parameter groups are split by the dropout rate of the layer's input, stored in each group as
    ``dropout``; ``weight_decay`` = λ(1 − dropout)/N (see the module docstring).

    Raises:
        ValueError: for a bad argument, or a model without dropout modules.
    """

    #: its samples are dropout masks: predict(vectorize=True) repeats the input instead of drawing weights
    dropout_masks = True
    deterministic = False

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """True: MC dropout takes the model, to find its dropout modules."""
        return True

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        eps: float = 1e-8,
        mc_samples: int = 1,
    ):
        check.model(model, "MCDropout", "so that it can find its dropout modules")
        self._dropouts = [m for m in model.modules() if isinstance(m, _DROPOUT)]
        if not self._dropouts:
            raise ValueError(
                "model has no dropout modules, so MC dropout would draw identical samples; add nn.Dropout "
                "before its Linear layers or build it with ngvi.baselines.mc_dropout_mlp"
            )
        rates = _input_dropout_rates(model)
        groups: dict[float, list[Tensor]] = {}
        for p in model.parameters():
            if p.requires_grad:
                groups.setdefault(rates.get(p, 0.0), []).append(p)
        if not groups:
            raise ValueError("model has no trainable parameters")
        param_groups = [{"params": ps, "dropout": rate} for rate, ps in groups.items()]
        super().__init__(param_groups, data_size, lr=lr, betas=betas, prior_prec=prior_prec, eps=eps)
        self.mc_samples = check.positive_int("mc_samples", mc_samples)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_dropouts": self._dropouts, "mc_samples": self.mc_samples}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Adam's step; with ``mc_samples`` > 1 the closure runs once per mask and the gradients are averaged.
        Returns the mean loss."""
        if closure is None or self.mc_samples == 1:
            return super().step(closure)
        losses: list[Any] = []
        sums: dict[Tensor, Tensor] = {}  # the gradients added over masks, by parameter
        for _ in range(self.mc_samples):
            with torch.enable_grad():
                result = closure()
            losses.append((result[0] if isinstance(result, tuple | list) else result).detach())
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        sums[p] = p.grad.clone() if p not in sums else sums[p].add_(p.grad)
        for p, total in sums.items():
            p.grad = total.div_(self.mc_samples)
        super().step()
        return torch.stack(losses).mean()

    def _weight_decay(self, group: dict[str, Any]) -> float:
        return mc_dropout_weight_decay(group["prior_prec"], group["data_size"], group.get("dropout", 0.0))

    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """Dropout is on inside the block (fresh masks at every forward pass); modes are restored on exit."""
        modes = [m.training for m in self._dropouts]
        try:
            for m in self._dropouts:
                m.train()
            yield
        finally:
            for m, mode in zip(self._dropouts, modes, strict=True):
                m.training = mode

    def posterior(self):
        raise NotImplementedError(
            "MC dropout's approximate posterior is a mixture over dropout masks, not a Gaussian; draw from "
            "it with sampled_params() or ngvi.predict(model, opt, x, samples=S)"
        )


def _input_dropout_rates(model: nn.Module) -> dict[Tensor, float]:
    """The dropout rate of each Linear weight's input, read off the order of ``nn.Sequential`` children."""
    rates: dict[Tensor, float] = {}
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        rate = 0.0  # probability that a unit is dropped by the dropouts since the last parameterised module
        for child in seq:
            if isinstance(child, _DROPOUT):
                rate = child.p if rate == 0.0 else 1.0 - (1.0 - rate) * (1.0 - child.p)
            elif isinstance(child, nn.Linear):
                rates[child.weight] = rate
                rate = 0.0
            elif any(True for _ in child.parameters()):
                rate = 0.0
    return rates


def mc_dropout_mlp(
    in_features: int,
    out_features: int = 1,
    hidden: int | Sequence[int] = 50,
    p: float = 0.05,
    activation: type[nn.Module] = nn.ReLU,
    *,
    input_dropout: bool = True,
) -> nn.Sequential:
    """Gal's UCI network: ``Dropout(p) → Linear → activation`` per hidden layer, then ``Dropout(p) → Linear``.

    With the defaults this is the 1-hidden-layer, 50-unit ReLU net of Gal & Ghahramani (2016) and
    Khan et al. (2018, App. J.1), dropout before every Linear layer as in Gal's code.

    Args:
        in_features: the input dimension.
        out_features: the output dimension.
        hidden: the width of the hidden layer, or a sequence of widths.
        p: the dropout rate.
        activation: the activation module's class.
        input_dropout: False leaves the inputs undropped.

    Returns:
        The network as an ``nn.Sequential``.

    Raises:
        ValueError: a width that is not a positive int, or p outside [0, 1).
    """
    check.positive_int("in_features", in_features)
    check.positive_int("out_features", out_features)
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    for i, h in enumerate(widths):
        check.positive_int(f"hidden[{i}]", h)
    check.unit_interval("p", p)
    layers: list[nn.Module] = []
    fan_in = in_features
    for i, width in enumerate(widths):
        if i > 0 or input_dropout:
            layers.append(nn.Dropout(p))
        layers += [nn.Linear(fan_in, width), activation()]
        fan_in = width
    if widths or input_dropout:
        layers.append(nn.Dropout(p))
    layers.append(nn.Linear(fan_in, out_features))
    return nn.Sequential(*layers)
