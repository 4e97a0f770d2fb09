"""``ngvi charlm``: a character-level LSTM language model (Khan et al. 2018, App. M, Fig. 8; Wilson et al.
2017, Fig. 2b)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
