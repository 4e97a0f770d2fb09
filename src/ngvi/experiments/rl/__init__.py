"""``ngvi rl``: parameter-space exploration in DDPG by VadaGrad and Vadam (Khan et al. 2018, App. K)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
