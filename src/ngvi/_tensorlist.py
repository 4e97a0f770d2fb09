"""A list of tensors with element-wise arithmetic dispatched to ``torch._foreach_*`` kernels.

Update rules are written on :class:`TensorList` so that they read like the papers' vector pseudocode
(``s.lerp_(g * g, 1 - beta2)``) while running as multi-tensor kernels. Scalars may be a Python number or
a list with one number per tensor (for per-parameter bias corrections).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Union

import torch
from torch import Tensor

Scalar = Union[float, int, Sequence[float]]  # noqa: UP007 (kept readable in signatures)
Operand = Union["TensorList", float, int, Sequence[float]]


def _is_scalar_list(x: object) -> bool:
    return isinstance(x, list | tuple) and (len(x) == 0 or not isinstance(x[0], Tensor))


class TensorList:
    __slots__ = ("tensors",)

    def __init__(self, tensors: Iterable[Tensor]):
        self.tensors: list[Tensor] = list(tensors)

    # -- container protocol -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors)

    def __getitem__(self, i: int) -> Tensor:
        return self.tensors[i]

    def __repr__(self) -> str:
        return f"TensorList({[tuple(t.shape) for t in self.tensors]})"

    def _wrap(self, tensors: list[Tensor]) -> TensorList:
        return TensorList(tensors)

    @staticmethod
    def _arg(x: Operand):
        if isinstance(x, TensorList):
            return x.tensors
        if _is_scalar_list(x):
            return [float(v) for v in x]
        return x

    # -- out-of-place arithmetic -----------------------------------------------------------------------
    def __add__(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_add(self.tensors, self._arg(other)))

    __radd__ = __add__

    def __sub__(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_sub(self.tensors, self._arg(other)))

    def __rsub__(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_add(torch._foreach_neg(self.tensors), self._arg(other)))

    def __mul__(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_mul(self.tensors, self._arg(other)))

    __rmul__ = __mul__

    def __truediv__(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_div(self.tensors, self._arg(other)))

    def __rtruediv__(self, other: Operand) -> TensorList:
        out = torch._foreach_reciprocal(self.tensors)
        if not (isinstance(other, int | float) and other == 1):
            torch._foreach_mul_(out, self._arg(other))
        return self._wrap(out)

    def __neg__(self) -> TensorList:
        return self._wrap(torch._foreach_neg(self.tensors))

    def __pow__(self, exponent: float) -> TensorList:
        return self._wrap(torch._foreach_pow(self.tensors, exponent))

    def sqrt(self) -> TensorList:
        return self._wrap(torch._foreach_sqrt(self.tensors))

    def rsqrt(self) -> TensorList:
        # 1/√x as two correctly rounded steps (torch.rsqrt may round differently): sqrt, then in place
        out = torch._foreach_sqrt(self.tensors)
        torch._foreach_reciprocal_(out)
        return self._wrap(out)

    def reciprocal(self) -> TensorList:
        return self._wrap(torch._foreach_reciprocal(self.tensors))

    def abs(self) -> TensorList:
        return self._wrap(torch._foreach_abs(self.tensors))

    def square(self) -> TensorList:
        return self._wrap(torch._foreach_mul(self.tensors, self.tensors))

    def square_(self) -> TensorList:
        torch._foreach_mul_(self.tensors, self.tensors)
        return self

    def clone(self) -> TensorList:
        return self._wrap([t.clone() for t in self.tensors])

    def maximum(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_maximum(self.tensors, self._arg(other)))

    def minimum(self, other: Operand) -> TensorList:
        return self._wrap(torch._foreach_minimum(self.tensors, self._arg(other)))

    # -- in-place arithmetic (return self, like torch) ---------------------------------------------------
    def add_(self, other: Operand, alpha: float = 1.0) -> TensorList:
        if isinstance(other, TensorList):
            torch._foreach_add_(self.tensors, other.tensors, alpha=alpha)
        else:
            torch._foreach_add_(
                self.tensors, self._arg(other) if alpha == 1.0 else self._scaled(other, alpha)
            )
        return self

    def sub_(self, other: Operand, alpha: float = 1.0) -> TensorList:
        return self.add_(other, alpha=-alpha)

    def mul_(self, other: Operand) -> TensorList:
        torch._foreach_mul_(self.tensors, self._arg(other))
        return self

    def div_(self, other: Operand) -> TensorList:
        torch._foreach_div_(self.tensors, self._arg(other))
        return self

    def sqrt_(self) -> TensorList:
        torch._foreach_sqrt_(self.tensors)
        return self

    def reciprocal_(self) -> TensorList:
        torch._foreach_reciprocal_(self.tensors)
        return self

    def neg_(self) -> TensorList:
        torch._foreach_neg_(self.tensors)
        return self

    def lerp_(self, end: TensorList, weight: float) -> TensorList:
        """self ← self + weight·(end − self), i.e. (1−w)·self + w·end."""
        torch._foreach_lerp_(self.tensors, end.tensors, weight)
        return self

    def addcmul_(self, t1: TensorList, t2: TensorList, value: Scalar = 1.0) -> TensorList:
        torch._foreach_addcmul_(self.tensors, t1.tensors, t2.tensors, self._arg(value))
        return self

    def addcdiv_(self, t1: TensorList, t2: TensorList, value: Scalar = 1.0) -> TensorList:
        torch._foreach_addcdiv_(self.tensors, t1.tensors, t2.tensors, self._arg(value))
        return self

    def clamp_(self, min: float | None = None, max: float | None = None) -> TensorList:
        if min is not None:
            torch._foreach_clamp_min_(self.tensors, min)
        if max is not None:
            torch._foreach_clamp_max_(self.tensors, max)
        return self

    def copy_(self, other: TensorList) -> TensorList:
        torch._foreach_copy_(self.tensors, other.tensors)
        return self

    def zero_(self) -> TensorList:
        torch._foreach_zero_(self.tensors)
        return self

    # -- reductions -------------------------------------------------------------------------------------
    def all_finite(self) -> bool:
        """True when every element is finite, with one host sync in the common case.

        One number per tensor into which NaN and Inf propagate decides when all are finite: the sum on CPU,
        a fused 2-norm elsewhere. Not the 2-norm on CPU: squaring values below ~1e-19 (squared gradients
        often are) makes subnormals, which x86 computes ~20× slower. A sum or norm can overflow for large
        finite values, so a non-finite one is confirmed element-wise (max and min, which cannot overflow)
        before reporting False."""
        if not self.tensors:
            return True
        if self.tensors[0].device.type == "cpu":
            probes = [t.sum() for t in self.tensors]
        else:
            probes = list(torch._foreach_norm(self.tensors))
        if _flags_all(probes):
            return True
        extremes = [m for t in self.tensors if t.numel() for m in torch.aminmax(t.reshape(-1))]
        return _flags_all(extremes)

    def nonfinite_indices(self) -> list[int]:
        return [i for i, t in enumerate(self.tensors) if not bool(torch.isfinite(t).all())]

    @staticmethod
    def _scaled(other: Operand, alpha: float):
        if _is_scalar_list(other):
            return [float(v) * alpha for v in other]
        return float(other) * alpha


def _flags_all(values: list[Tensor]) -> bool:
    """All of ``values`` (scalars of any dtype and device) are finite: one host sync."""
    if not values:
        return True
    first = values[0]
    if all(v.dtype == first.dtype and v.device == first.device for v in values):
        return bool(torch.stack(values).isfinite().all())
    return bool(torch.stack([v.isfinite().to(first.device) for v in values]).all())
