"""Deprecated module path: ``PosteriorOptimizer`` and ``unwrap`` live in :mod:`ngvi.protocol` since 0.2.0.

Reading either name from here still works in 0.2.0 and warns (``DeprecationWarning``); this module goes in
0.3.0.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("PosteriorOptimizer", "unwrap")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"ngvi.optim.protocol.{name} moved to ngvi.protocol.{name} (also ngvi.{name}); the old path goes "
            "in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        from .. import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
