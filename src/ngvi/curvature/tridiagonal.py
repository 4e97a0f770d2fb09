r"""Martens & Grosse's block-tridiagonal inverse of the Kronecker-factored Fisher (K-FAC, 2015, §4.3).

For a chain of layers i = 1…ℓ with weights W_i [o_i, d_i] (the bias as the last column, ā_i = (a_i, 1)), the
Kronecker-factored Fisher F̃ has blocks F̃_{i,j} = S_{i,j} ⊗ A_{i,j} with A_{i,j} = E[ā_i ā_jᵀ] and
S_{i,j} = E[g_i g_jᵀ] (g_i = ∂f/∂s_i; row-major vec, rows ↔ S, columns ↔ A; M&G write Ā_{i−1,j−1} ⊗ G_{i,j}
for column-stacked W_iᵀ). M&G approximate it by the F̂ that agrees with F̃ on the diagonal and first
off-diagonal blocks and whose inverse is block tridiagonal: the covariance of a directed Gaussian graphical
model running from the last layer back (§4.3),

.. math::
    w_\ell \sim \mathcal N(0, \Sigma_\ell),\qquad
    w_i = \Psi_{i,i+1}\, w_{i+1} + \epsilon_i,\quad \epsilon_i\sim\mathcal N(0, \Sigma_{i|i+1}),

with (M&G eqs. in §4.3, in our orientation)

.. math::
    \Psi_{i,i+1} = \tilde F_{i,i+1}\tilde F_{i+1,i+1}^{-1} = \Psi^S_i\otimes\Psi^A_i,\quad
        \Psi^S_i = S_{i,i+1}S_{i+1,i+1}^{-1},\ \Psi^A_i = A_{i,i+1}A_{i+1,i+1}^{-1},\\
    \Sigma_{i|i+1} = \tilde F_{i,i} - \Psi_{i,i+1}\tilde F_{i+1,i+1}\Psi_{i,i+1}^\top
        = S_{i,i}\otimes A_{i,i}
          - \Psi^S_i S_{i+1,i+1}\Psi^{S\top}_i \otimes \Psi^A_i A_{i+1,i+1}\Psi^{A\top}_i,
        \qquad \Sigma_\ell = S_{\ell,\ell}\otimes A_{\ell,\ell},

so that :math:`\hat F^{-1} = \Xi^\top\Lambda\,\Xi` with Λ = diag(Σ_{1|2}⁻¹, …, Σ_ℓ⁻¹) and Ξ block
upper-bidiagonal: I on the diagonal, −Ψ_{i,i+1} at block (i, i+1). Σ_{i|i+1} is a difference of two
Kronecker products; M&G (App. B) invert it through the generalised eigendecompositions of the two pairs
(X₁, X₂) = (S_{i,i}, Ψ^S S Ψ^{S⊤}) and (A_{i,i}, Ψ^A A Ψ^{A⊤}): K with KᵀX₁K = I and KᵀX₂K = diag(e) gives

.. math::
    \Sigma_{i|i+1}^{-1} = (K_S\otimes K_A)\,\operatorname{diag}\big(1/(1 - e_S\otimes e_A)\big)\,
        (K_S\otimes K_A)^\top ,

i.e. for a matrix Z, Σ⁻¹ vec(Z) = vec(K_S [(K_Sᵀ Z K_A) ⊘ (1 − e_S e_Aᵀ)] K_Aᵀ); for the last layer e = 0.
Damping (M&G §6.3): the diagonal blocks S_{i,i}, A_{i,i} are replaced by their π-split damped versions in all
of the formulas above (Ψ included). The damped F̃ stays positive definite (its blocks S_{i,j} ⊗ A_{i,j} form a
principal submatrix of the Kronecker product of two PSD matrices, plus damping on the diagonal blocks), so
every Σ_{i|i+1} is its Schur complement and positive definite: 0 ≤ e_S e_Aᵀ < 1.

The functions below act on lists of per-layer matrices [*, o_i, d_i] (any leading dims).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .._tensorlist import TensorList
from .estimators import CurvatureInput
from .layer import LayerCurvature

__all__ = ["ChainLayer", "TridiagonalFactors", "chain_factors", "generalized_eigh", "precondition"]


@dataclass(frozen=True)
class ChainLayer:
    """One layer's part of F̂⁻¹ = ΞᵀΛΞ: Λ_i = (K_S ⊗ K_A) diag(1/(1 − e_S e_Aᵀ)) (K_S ⊗ K_A)ᵀ, and the link
    Ψ_{i,i+1} = Ψ^S ⊗ Ψ^A to the next layer (None for the last)."""

    row_basis: Tensor  # K_S [o, o]
    col_basis: Tensor  # K_A [d, d]
    row_eig: Tensor  # e_S [o]
    col_eig: Tensor  # e_A [d]
    row_link: Tensor | None = None  # Ψ^S [o, o_next]
    col_link: Tensor | None = None  # Ψ^A [d, d_next]

    def weights(self) -> Tensor:
        """D = 1/(1 − e_S e_Aᵀ) [o, d] (clamped away from a zero denominator that rounding could give)."""
        denom = 1.0 - self.row_eig[:, None] * self.col_eig[None, :]
        return denom.clamp_min(torch.finfo(denom.dtype).eps).reciprocal()

    def to(self, dtype: torch.dtype) -> ChainLayer:
        def cast(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dtype)

        return ChainLayer(*(cast(t) for t in (self.row_basis, self.col_basis, self.row_eig, self.col_eig,
                                              self.row_link, self.col_link)))  # fmt: skip


def generalized_eigh(x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
    """(K, e) with Kᵀ x1 K = I and Kᵀ x2 K = diag(e), for symmetric x1 > 0 and x2 ≥ 0: K = L⁻ᵀE with
    x1 = LLᵀ and L⁻¹ x2 L⁻ᵀ = E diag(e) Eᵀ. Eigenvalues below zero (rounding) are clamped to 0."""
    lower = torch.linalg.cholesky(0.5 * (x1 + x1.mT))
    eye = torch.eye(x1.shape[-1], dtype=x1.dtype, device=x1.device)
    l_inv = torch.linalg.solve_triangular(lower, eye, upper=False)
    evals, evecs = torch.linalg.eigh(l_inv @ (0.5 * (x2 + x2.mT)) @ l_inv.mT)
    return l_inv.mT @ evecs, evals.clamp_min(0.0)


def chain_factors(
    row_diag: list[Tensor], col_diag: list[Tensor], row_cross: list[Tensor], col_cross: list[Tensor]
) -> list[ChainLayer]:
    """The ChainLayers of F̂⁻¹ from (already damped) diagonal factors S_{i,i} [o_i, o_i], A_{i,i} [d_i, d_i]
    and the cross factors S_{i,i+1} [o_i, o_{i+1}], A_{i,i+1} [d_i, d_{i+1}] (ℓ − 1 of each)."""
    out = []
    last = len(row_diag) - 1
    for i in range(last + 1):
        if i == last:
            k_s, e_s = generalized_eigh(row_diag[i], torch.zeros_like(row_diag[i]))
            k_a, e_a = generalized_eigh(col_diag[i], torch.zeros_like(col_diag[i]))
            out.append(ChainLayer(k_s, k_a, e_s, e_a))
            continue
        psi_s = torch.linalg.solve(row_diag[i + 1], row_cross[i].mT).mT  # S_{i,i+1} S_{i+1}⁻¹ (symmetric S)
        psi_a = torch.linalg.solve(col_diag[i + 1], col_cross[i].mT).mT
        k_s, e_s = generalized_eigh(row_diag[i], psi_s @ row_cross[i].mT)  # Ψ^S S_{i+1} Ψ^Sᵀ = Ψ^S S_{i,i+1}ᵀ
        k_a, e_a = generalized_eigh(col_diag[i], psi_a @ col_cross[i].mT)
        out.append(ChainLayer(k_s, k_a, e_s, e_a, psi_s, psi_a))
    return out


# ------------------------------------------------------------------------------------------------------------
# Products with Ξ, Ξᵀ, Ξ⁻ᵀ and Λ on lists of per-layer blocks [*, o_i, d_i]
# ------------------------------------------------------------------------------------------------------------
def xi(chain: list[ChainLayer], v: list[Tensor]) -> list[Tensor]:
    """(Ξv)_i = v_i − Ψ^S_i v_{i+1} Ψ^{A⊤}_i, (Ξv)_ℓ = v_ℓ."""
    return [
        v[i] if c.row_link is None else v[i] - c.row_link @ v[i + 1] @ c.col_link.mT
        for i, c in enumerate(chain)
    ]


def xi_t(chain: list[ChainLayer], y: list[Tensor]) -> list[Tensor]:
    """(Ξᵀy)_1 = y_1, (Ξᵀy)_{i+1} = y_{i+1} − Ψ^{S⊤}_i y_i Ψ^A_i."""
    out = [y[0]]
    for i in range(1, len(chain)):
        c = chain[i - 1]
        out.append(y[i] - c.row_link.mT @ y[i - 1] @ c.col_link)
    return out


def xi_t_solve(chain: list[ChainLayer], d: list[Tensor]) -> list[Tensor]:
    """y with Ξᵀy = d: y_1 = d_1, y_{i+1} = d_{i+1} + Ψ^{S⊤}_i y_i Ψ^A_i."""
    out = [d[0]]
    for i in range(1, len(chain)):
        c = chain[i - 1]
        out.append(d[i] + c.row_link.mT @ out[-1] @ c.col_link)
    return out


def lam(chain: list[ChainLayer], z: list[Tensor]) -> list[Tensor]:
    """Λz: per layer K_S [(K_Sᵀ z K_A) ⊙ D] K_Aᵀ."""
    return [c.row_basis @ ((c.row_basis.mT @ zi @ c.col_basis) * c.weights()) @ c.col_basis.mT
            for c, zi in zip(chain, z, strict=True)]  # fmt: skip


def orthogonal_factor(basis: Tensor) -> Tensor:
    """E of K = TE with T upper triangular (positive diagonal) and E orthogonal: generalized_eigh's
    K = L⁻ᵀE_eigh gives E = E_eigh. Unique, from a QR decomposition of KᵀP (P reverses the order)."""
    q, r = torch.linalg.qr(basis.mT.flip(-1))
    q = q * torch.diagonal(r, dim1=-2, dim2=-1).sign().unsqueeze(-2)
    return q.flip(-1).mT


def lam_sqrt(chain: list[ChainLayer], eps: list[Tensor]) -> list[Tensor]:
    """Rε with RRᵀ = Λ: per layer K_S [(E_Sᵀ ε E_A) ⊙ √D] K_Aᵀ, i.e. R = (K_S⊗K_A) diag(√D) (E_S⊗E_A)ᵀ with E
    the :func:`orthogonal_factor` of K. This R = L⁻ᵀ f(M) is a spectral function of M (the eigh'd matrix),
    so it does not depend on the basis eigh picks in a degenerate eigenspace (K √D alone would: ranks whose
    factors differ by round-off, or two runs, would then draw differently from the same ε)."""
    out = []
    for c, e in zip(chain, eps, strict=True):
        rows, cols = orthogonal_factor(c.row_basis), orthogonal_factor(c.col_basis)
        out.append(c.row_basis @ ((rows.mT @ e @ cols) * c.weights().sqrt()) @ c.col_basis.mT)
    return out


def precondition(chain: list[ChainLayer], v: list[Tensor]) -> list[Tensor]:
    """F̂⁻¹v = Ξᵀ Λ Ξ v."""
    return xi_t(chain, lam(chain, xi(chain, v)))


# ------------------------------------------------------------------------------------------------------------
# The estimator: diagonal and adjacent-layer factors from one forward/backward pass
# ------------------------------------------------------------------------------------------------------------
class TridiagonalFactors(LayerCurvature):
    """The factors of the tridiagonal blocks of F̃: per layer A_{i,i}, S_{i,i} and, to the next layer,
    A_{i,i+1} = E[ā_i ā_{i+1}ᵀ], S_{i,i+1} = E[g_i g_{i+1}ᵀ], from the same examples' recorded inputs and
    output gradients (every ``group["stats_every"]`` steps). The model must be a chain of nn.Linear layers
    (an MLP), each called once per forward pass on [batch, features] inputs, in the order the model
    registers them. They travel flattened with each layer's first parameter, as
    :class:`~ngvi.curvature.layer.KroneckerFactors` does."""

    owner = "NNGBlkTri"

    def __init__(self, model: nn.Module, targets: str = "ef", **kwargs: Any) -> None:
        super().__init__(model, targets, **kwargs)
        bad = [
            f"'{layer.name}' (nn.{type(layer.module).__name__})"
            for layer in self.hooks.layers
            if not isinstance(layer.module, nn.Linear) or layer.weight is None
        ]
        if bad:
            raise ValueError(
                "NNGBlkTri's block-tridiagonal posterior is defined for a chain of nn.Linear layers with "
                f"trained weights (an MLP); the model also has {', '.join(bad)}. Use ngvi.NoisyKFAC"
            )
        self.layer_of = {p: i for i, layer in enumerate(self.hooks.layers) for p in layer.params}

    def estimate(self, sample: CurvatureInput) -> TensorList | None:
        self.require_all(sample)
        self.mean_gradient_(sample.grads)
        self._check_chain()
        if sample.num_steps % sample.group["stats_every"] != 0:
            return None
        acts, grads = self._chain_records()
        batch = acts[0].shape[0]
        factors = []
        for i in range(len(acts)):
            parts = [acts[i].mT @ acts[i], grads[i].mT @ grads[i]]
            if i + 1 < len(acts):
                parts += [acts[i].mT @ acts[i + 1], grads[i].mT @ grads[i + 1]]
            factors.append(torch.cat([t.reshape(-1) for t in parts]).div_(batch))
        out = []
        for p in sample.params:
            i = self.layer_of[p]
            out.append(factors[i] if p is self.hooks.layers[i].params[0] else p.new_zeros(1))
        return TensorList(out)

    def _check_chain(self) -> None:
        """Every sample: the layers ran in registration order, once each, on [batch, features] inputs, and
        each layer's input reads the previous layer's output and no earlier layer's (through autograd's
        graph of this forward pass; inputs that carry no gradient are not seen)."""
        hooks = self.hooks
        if list(hooks._records) != list(range(len(hooks.layers))):
            names = [hooks.layers[i].name for i in hooks._records]
            raise RuntimeError(
                f"NNGBlkTri links each Linear layer to the next in the order the model registers them "
                f"({[layer.name for layer in hooks.layers]}), but the forward pass ran {names}"
            )
        records = []
        for i, layer in enumerate(hooks.layers):
            calls = hooks._calls(i)
            if len(calls) != 1 or calls[0].x.dim() != 2:
                shape = tuple(calls[0].x.shape) if calls else None
                raise RuntimeError(
                    f"NNGBlkTri needs each layer called once per forward pass on [batch, features] inputs; "
                    f"layer '{layer.name}' ran {len(calls)} time(s) (input {shape})"
                )
            records.append(calls[0])
        outputs = {r.out_node: i for i, r in enumerate(records)}
        for k in range(1, len(records)):
            reached = _upstream_layers(records[k].x_node, outputs)
            names = [hooks.layers[j].name for j in (k - 1, k)]
            if k - 1 not in reached:
                raise ValueError(_not_a_chain(*names, f"the input of '{names[1]}' does not read the output "
                                              f"of '{names[0]}'"))  # fmt: skip
            if len(reached) > 1:
                other = hooks.layers[min(reached)].name
                raise ValueError(_not_a_chain(other, names[1], f"the input of '{names[1]}' also reads the "
                                              f"output of '{other}', past '{names[0]}'"))  # fmt: skip

    def _chain_records(self) -> tuple[list[Tensor], list[Tensor]]:
        """Per layer, ā = (x, 1) [M, d'] and the per-example output gradients g [M, o] of this sample."""
        hooks = self.hooks
        scale = hooks._scale(hooks.batch_size())
        acts, grads = [], []
        for i, layer in enumerate(hooks.layers):
            calls = hooks._calls(i)
            dtype = layer.weight.dtype
            x, g = calls[0].x.to(dtype), calls[0].grad.to(dtype) * scale
            if layer.bias is not None:
                x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
            acts.append(x)
            grads.append(g)
        return acts, grads


def _upstream_layers(node: Any, outputs: dict[Any, int]) -> set[int]:
    """The layers (values of ``outputs``, keyed by their output's autograd node) whose outputs the tensor
    of ``node`` depends on directly, i.e. not through another of these layers."""
    found, seen, stack = set(), set(), [node]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in outputs:
            found.add(outputs[node])
        else:
            stack.extend(n for n, _ in node.next_functions)
    return found


def _not_a_chain(first: str, second: str, why: str) -> str:
    return (
        f"NNGBlkTri's block-tridiagonal posterior links each layer to the next (M&G's directed model), but "
        f"the model is not a chain: '{first}' and '{second}': {why}. Use ngvi.NoisyKFAC (block-diagonal) "
        "or ngvi.NNGFull"
    )
