"""``ngvi calibration``: every posterior rule with its defaults against a deep ensemble (issue 32, item 2)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
