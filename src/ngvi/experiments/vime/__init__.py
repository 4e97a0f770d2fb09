"""``ngvi vime``: VIME's intrinsic reward with a BBB or an NNG-MVG dynamics model (NNG §5.4, Fig. 3)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
