"""The papers' experiments, on one harness (:mod:`.core`): each is one :class:`~.core.Experiment` in its
own module, and a command of the ``ngvi`` CLI that writes a results folder.

Adding an experiment: write a module with an ``EXPERIMENT`` object (its arguments, jobs, ``run_job`` and
``report``) and name the module here.
"""

from __future__ import annotations

import importlib
from typing import Any

#: command -> module under ngvi.experiments holding ``EXPERIMENT`` (or, for ``list``, ``COMMAND``)
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "uci": "uci",
    "uci-nng": "uci_nng",
    "nng-precision": "nng_precision",
    "bench": "bench",
    "logreg": "logreg",
    "convergence": "convergence",
    "minima": "minima",
    "classify": "vision",
    "hmc": "hmc",
    "active": "active",
    "bandits": "bandits",
    "list": "listing",
    "prune": "prune",
    "rl": "rl",
    "vime": "vime",
    "charlm": "charlm",
    "calibration": "calibration",
    "continual": "continual",
    "merging": "merging",
}


def command(name: str) -> Any:
    """The experiment (or command) object of ``ngvi <name>``."""
    module = importlib.import_module(f"{__name__}.{COMMANDS[name]}")
    return getattr(module, "EXPERIMENT", None) or module.COMMAND
