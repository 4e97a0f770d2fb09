"""Blocks shared by several rules: Adam's moments and step, the Riemannian curvature EMA, the trust region."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..._tensorlist import TensorList
from ._capture import Num, Nums, Tensors, _add, _add_, _addcdiv_, _addcmul_, _div


def adam_moments_(
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    grads: Tensors,
    sq_grads: Tensors | None = None,
    *,
    beta1: Num,
    beta2: Num,
) -> None:
    r"""Adam's two moments in place: :math:`m \leftarrow \beta_1 m + (1-\beta_1)g`,
    :math:`v \leftarrow \beta_2 v + (1-\beta_2)\,g^2`.

    ``sq_grads`` is what v averages: ĝ² of the MC samples (Vadam eq. 90, NNG Alg. 1's f) or g² of the
    gradient itself (BADAM). With ``sq_grads=None`` v is updated as ``torch.optim.Adam`` does,
    v·β₂ + (1−β₂)·g⊙g (mul, then addcmul: BBVI's sequence), which rounds differently from the lerp form."""
    m, v, g = TensorList(exp_avg), TensorList(exp_avg_sq), TensorList(grads)
    m.lerp_(g, 1 - beta1)
    if sq_grads is not None:
        v.lerp_(TensorList(sq_grads), 1 - beta2)
    else:
        v.mul_(beta2)
        _addcmul_(v, g, g, 1 - beta2)


def adam_step_(
    params: Tensors,
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    *,
    lr: Num,
    bias1: Nums,
    bias2: Nums,
    eps: Num,
    correct_inside_sqrt: bool = True,
) -> None:
    r"""The bias-corrected Adam step in place:
    :math:`x \leftarrow x - \alpha\,\hat m/(\sqrt{\hat v} + \epsilon)`
    with :math:`\hat m = m/(1-\beta_1^t)`, :math:`\hat v = v/(1-\beta_2^t)`.

    ``bias1``, ``bias2`` are 1−β₁ᵗ and 1−β₂ᵗ, one per tensor (steps may differ between parameters). ``eps`` is
    Adam's ε, or λ̃ for Vadam (eq. 93: √ŝ + λ̃). ``correct_inside_sqrt`` picks the rounding order:
    √(v/b₂) (Vadam, BADAM) or √v/√b₂ (``torch.optim.Adam``'s order, used by BBVI)."""
    x, m, v = TensorList(params), TensorList(exp_avg), TensorList(exp_avg_sq)
    if correct_inside_sqrt:
        denom = _add_(_div(v, bias2).sqrt_(), eps)
    else:
        denom = _add_(v.sqrt().div_([b**0.5 for b in bias2]), eps)
    _addcdiv_(x, m, denom, [-lr / b for b in bias1])


def riemannian_ema_(
    hess: Tensors,
    hess_hat: Tensors,
    *,
    beta: Num,
    damping: Num,
    coef: Num | None = None,
) -> None:
    r"""The curvature EMA with the Riemannian-gradient correction (Lin, Schmidt & Khan 2020; IVON Alg. 1):

    .. math::
        h \leftarrow (1-\beta)\,h + \beta\,\hat h + \tfrac12\beta^2\,(\hat h - h)^2/(h + \delta)

    with δ = ``damping`` (λ̃ for VON, the weight decay for IVON). The correction keeps h + δ > 0 for any ĥ.
    ``coef`` is the factor ½β² as the caller computes it: VON passes nothing (0.5·β·β), IVON its own
    0.5·(1−β₂)² (the same number, rounded its own way: kept so IVON's trajectory stays bitwise).
    (ĥ − h)² is bitwise (h − ĥ)², so the operand order of the difference does not matter."""
    h, h_hat = TensorList(hess), TensorList(hess_hat)
    if coef is None:
        coef = 0.5 * beta * beta
    riemann = (h_hat - h).square_().div_(_add(h, damping)).mul_(coef)
    h.lerp_(h_hat, beta).add_(riemann)


def bias_corrections(beta: float, states: list[dict]) -> list[float]:
    """1 − βᵗ for each parameter's step t (Adam's bias corrections; Python floats, as eager)."""
    return [1 - beta ** st["step"] for st in states]


def trust_region(m: Tensor, *, lr: Num, kappa: Num) -> Tensor:
    r"""ν = min(1, √(κ/(α²m))), m = Σ uᵢ²/Pᵢ (:func:`natural_sq_length`): m·α² is the squared length, in the
    diagonal metric P that preconditions it, of the natural step αu/P (Ba, Grosse & Martens 2017's KL
    clipping, as the K-FAC family's ``kl_clip``). With P in per-example units (ngvi's starts: P₀ = 1) the
    first step is ‖Δμ‖ ≤ √κ whatever the loss's scale. A 0-dim tensor, so no host read; exactly 1.0 where
    the cap does not bind, so the step it scales is then bitwise the uncapped one. m = 0 gives ν = 1; a
    non-finite m a non-finite ν (the step's own check catches it)."""
    return torch.rsqrt(m * (lr * lr) / kappa).clamp_(max=1.0)


#: the rows a CPU sum is cut into: each row is reduced by one thread, so the result does not depend on how
#: many there are (torch's flat ``sum`` splits by the thread count: 75,750 float32 values summed with 1 and
#: 2 threads differ in the last bit)
SUM_BLOCK = 4096


def summed(tensors: Tensors, weights: Nums | None = None) -> Tensor:
    """Σᵢ wᵢ Σ tensorᵢ, a 0-dim tensor in their dtype. On the CPU each sum is taken in rows of
    :data:`SUM_BLOCK`, then over the rows' sums, so a step is bitwise the same for any thread count
    (``noise="chunked"``'s promise)."""
    sums = [_sum_by_rows(t) if t.device.type == "cpu" else t.sum() for t in tensors]
    if weights is not None:
        sums = [x * w for x, w in zip(sums, weights, strict=True)]
    return sum(sums)


def natural_sq_length(numer: Tensors, denom: Tensors, weights: Nums | None = None) -> Tensor:
    """m = Σᵢ wᵢ Σ uᵢ²/Pᵢ for :func:`trust_region`, as ⟨u, u/P⟩: one temporary per tensor (:func:`summed`)."""
    return summed(sq_terms(numer, denom), weights)


def sq_terms(numer: Tensors, denom: Tensors) -> TensorList:
    """The terms uᵢ²/Pᵢ of the squared natural length, as ⟨u, u/P⟩: one new tensor per tensor."""
    return _div(TensorList(numer), denom).mul_(numer)


def _sum_by_rows(t: Tensor) -> Tensor:
    t = t.reshape(-1)
    while t.numel() > SUM_BLOCK:
        t = _first_level(t)
    return t.sum()


def scale_(tensors: Tensors, nu: Tensor) -> None:
    """Each tensor in place by the 0-dim ν (a loop: the foreach overloads do not broadcast a 0-dim tensor
    on every device, and Inductor would fold a captured one into a constant)."""
    for t in tensors:
        t.mul_(nu.to(t.dtype))


# ------------------------------------------------------------------------------------------------------------
# The trust region of a whole parameter group, however its update is cut into pieces
# ------------------------------------------------------------------------------------------------------------
@dataclass
class RegionTerm:
    """What a core with a trust region yields before it moves μ: the element-wise terms whose total is the
    squared natural length m (``products``: uᵢ²/Pᵢ, or Δᵢuᵢ), with its lr and κ. It is sent back ν. The
    engine empties ``products`` once it has their sum, so a core holds them only through this object."""

    products: list[Tensor]
    lr: Num
    kappa: Num


RegionCore = Generator[RegionTerm, Tensor, None]


def region_core(steps: Callable[..., RegionCore]) -> Callable[..., None]:
    """A core whose trust region is taken over the tensors it is given, made from the generator form
    ``steps`` (``nu = yield RegionTerm(...)``). ``core.deferred`` is that form: the engine runs every piece
    of a parameter group to its ``yield``, takes one ν for the group (:func:`region_nu`) and sends it to
    each piece, so a step does not depend on how the group was cut (CPU pieces, buckets, ranks)."""

    @functools.wraps(steps)
    def core(*args: Any, **kwargs: Any) -> None:
        run_locally(steps(*args, **kwargs))

    core.deferred = steps  # type: ignore[attr-defined]
    return core


def run_locally(steps: RegionCore) -> None:
    """Drive one core on its own: ν from its own terms."""
    try:
        term = next(steps)
    except StopIteration:
        return
    nu = trust_region(total_length([term.products]), lr=term.lr, kappa=term.kappa)
    try:
        steps.send(nu)
    except StopIteration:
        return
    raise RuntimeError("a trust-region core yields once")


def total_length(parts: list[list[Tensor]]) -> Tensor:
    """m = Σ of every element of ``parts`` (lists of tensors, in the group's order), as :class:`LengthSum`."""
    total = LengthSum()
    for part in parts:
        total.add(part)
    return total.total()


class LengthSum:
    """m = Σ of the elements of the tensors added, in order, with the bits :func:`summed` gives on their
    concatenation as one flat vector on the CPU: whole rows of :data:`SUM_BLOCK` are reduced as they arrive
    (so a piece's terms can be freed at once), the rest carried to the next piece. A group cut into pieces
    (the flat buckets' CPU pieces, a parameter at a time) and the group as one tensor give the same bits."""

    def __init__(self) -> None:
        self.rows: list[Tensor] = []  # the first level of _sum_by_rows, or per-tensor sums off the CPU
        self.carry: list[Tensor] = []  # elements not yet in a whole row
        self.carried = 0
        self.flushed = False

    def add(self, tensors: Tensors) -> None:
        for t in tensors:
            t = t.reshape(-1)
            if t.device.type != "cpu":
                self.rows.append(t.sum().reshape(1))
                continue
            self.carry.append(t)
            self.carried += t.numel()
            if self.carried > SUM_BLOCK:
                self._flush(final=False)

    def _flush(self, final: bool) -> None:
        joined = torch.cat(self.carry) if len(self.carry) > 1 else self.carry[0]
        whole = joined.numel() - joined.numel() % SUM_BLOCK
        if whole:
            self.rows.append(joined[:whole].view(-1, SUM_BLOCK).sum(1))
        rest = joined[whole:]
        if final and rest.numel():
            self.rows.append(rest.sum().reshape(1))
        self.carry = [rest.clone()] if rest.numel() and not final else []  # a copy: the piece is freed
        self.carried, self.flushed = rest.numel() if not final else 0, True

    def total(self) -> Tensor:
        if self.rows and not self.carry and not self.flushed:  # off the CPU: the per-tensor sums
            return sum(self.rows[1:], self.rows[0]).reshape(())
        if not self.flushed:  # at most one row's worth in all: one sum, as _sum_by_rows takes it
            return torch.cat(self.carry).sum() if self.carry else torch.zeros(())
        if self.carry:
            self._flush(final=True)
        return _sum_by_rows(torch.cat(self.rows) if len(self.rows) > 1 else self.rows[0])


def _first_level(t: Tensor) -> Tensor:
    """The rows' sums of ``t`` and the sum of its last, partial row: :func:`_sum_by_rows`' first pass."""
    whole = t.numel() - t.numel() % SUM_BLOCK
    rows = t[:whole].view(-1, SUM_BLOCK).sum(1)
    return torch.cat([rows, t[whole:].sum().reshape(1)]) if whole < t.numel() else rows
