"""``ngvi bandits``: contextual bandits with Thompson sampling (BADAM App. D.3, Table 1; Riquelme et al.).

- :mod:`.protocol`: one run of one agent on one data set (initial pulls, replay-buffer training, N, score);
- :mod:`.agents`: the agents (Thompson sampling with each method of the registry, greedy, uniform);
- :mod:`.experiment`: the harness's ``EXPERIMENT`` (jobs per data set, agent and run);
- :mod:`.report`, :mod:`.published`: our table beside BADAM Table 1, and the regret curves.
"""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
