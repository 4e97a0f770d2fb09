"""``ngvi uci-nng``: the UCI regression benchmark under NNG's protocol (see :mod:`.experiment`)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
