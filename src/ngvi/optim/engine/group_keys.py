"""Parameter-group keys that a rule does not read: a warning, once per key, instead of silence.

Frameworks build the groups: the Hugging Face Trainer gives each a ``weight_decay`` (0.0 by default), which
Vadam would otherwise ignore without a word while the user believes a prior was set.
"""

from __future__ import annotations

import warnings
from typing import Any

#: keys torch or LR schedulers put in groups, or that name a group (``"region"``: the group an
#: ``empirical_bayes="layer"`` split came from, whose trust region it shares); no rule reads them
GENERIC = frozenset({"params", "name", "initial_lr", "region"})


def warn_unknown(opt: Any, group: dict[str, Any]) -> None:
    """Warn once per optimizer and key for each key of ``group`` that ``opt``'s rule does not read (its
    ``defaults``)."""
    warned = opt.__dict__.setdefault("_warned_group_keys", set())
    for key in sorted(set(group) - set(opt.defaults) - GENERIC - warned, key=str):
        warned.add(key)
        known = ", ".join(sorted(opt.defaults))
        warnings.warn(
            f"{type(opt).__name__} ignores the parameter-group key {key!r}: it reads only {known} (a prior "
            "is prior_prec=, or weight_decay= for IVON; warned once per key)",
            UserWarning,
            stacklevel=4,
        )
