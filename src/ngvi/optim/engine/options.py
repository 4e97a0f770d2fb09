"""The engine options most users never set, behind one keyword (issue 42, item 5).

Every ngvi optimizer takes the papers' hyperparameters by name (``data_size``, ``lr``, ``prior_prec``,
``init_prec``, ``mc_samples``, ...), ``seed``, ``skip_nonfinite`` and ``empirical_bayes``; how the engine runs
the step is one keyword::

    ngvi.IVON(model.parameters(), data_size=N, engine=ngvi.EngineOptions(flat=False, noise="chunked"))
    ngvi.IVON(model.parameters(), data_size=N, engine={"finite_check": "host"})

The same names given as keywords of the optimizer still work until 0.3.0, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["EngineOptions"]

#: the release in which the options given as keywords of an optimizer stop being accepted
REMOVED_IN = "0.3.0"


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a step; the defaults suit nearly every user.

    Attributes:
        noise: ``"normal"``, ``"antithetic"`` (pairs ε, −ε: half the noise cost, one buffer more) or
            ``"chunked"`` (ε keyed by its place in the parameter, drawn in seeded chunks on several threads:
            the same at any number of FSDP2 ranks); None: the rule's own (Vprop: antithetic, else normal), and
            ``"chunked"`` for FSDP2-sharded parameters.
        noise_dtype: dtype of ε (``torch.float32`` for float64 parameters draws ~4× faster on the CPU).
        rank_noise: ``"shared"`` (one ε on every ``torch.distributed`` rank) or ``"independent"``.
        fp32_state: float32 state and master μ for bfloat16/float16 parameters.
        finite_check: where a non-finite step is decided: ``"host"`` (one value read back per step),
            ``"device"`` (no read: the update is masked on the device and the error comes at the next step or
            ``check_finite()``), or ``"auto"`` (``"device"`` on an accelerator, ``"host"`` on the CPU and for
            the K-FAC family).
        flat: None (default) or True: element-wise rules keep μ, θ, the state and the sums of each group in
            flat buffers, one kernel per pass; False: one tensor per parameter (the reference path, as
            torch.optim's ``foreach=False``).
        compile: run the rule's update core through ``torch.compile`` (agrees with eager to float round-off).
    """

    noise: str | None = None
    noise_dtype: torch.dtype | None = None
    rank_noise: str = "shared"
    fp32_state: bool = True
    finite_check: str = "auto"
    flat: bool | None = None
    compile: bool = False


NAMES = frozenset(f.name for f in dataclasses.fields(EngineOptions))


def resolve(
    owner: str, engine: EngineOptions | Mapping[str, Any] | None, legacy: dict[str, Any]
) -> EngineOptions:
    """The options of ``owner(..., engine=engine, **legacy)``: ``legacy`` holds the engine options given as
    keywords (deprecated: one ``DeprecationWarning`` each); any other keyword is a TypeError, as Python
    gives for an unknown keyword, and an option given both ways a ValueError."""
    unknown = sorted(set(legacy) - NAMES)
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(engine, EngineOptions):
        given = {name: getattr(engine, name) for name in NAMES}
    elif isinstance(engine, Mapping):
        bad = sorted(set(engine) - NAMES, key=str)
        if bad:
            raise ValueError(f"{owner}: engine= has no option {bad[0]!r}; the options are {sorted(NAMES)}")
        given = dict(engine)
    elif engine is None:
        given = {}
    else:
        raise TypeError(
            f"{owner}: engine= takes an ngvi.EngineOptions or a dict, not {type(engine).__name__}"
        )
    twice = sorted(set(legacy) & set(given))
    if twice:
        raise ValueError(f"{owner}: {twice[0]} is given in engine= and as a keyword; give it in engine= only")
    for name in sorted(legacy):
        warnings.warn(
            f"{owner}({name}=...) is deprecated and is refused from {REMOVED_IN}: pass "
            f"engine={{{name!r}: ...}} (or engine=ngvi.EngineOptions({name}=...))",
            DeprecationWarning,
            stacklevel=4,
        )
    return EngineOptions(**{**given, **legacy})
