"""``ngvi.optim.base``, where the engine's class lived before :mod:`ngvi.optim.engine`: kept importable."""

from .engine.optimizer import NOISES, NonFiniteGradientError, VariationalOptimizer, initial_curvature

__all__ = ["NOISES", "NonFiniteGradientError", "VariationalOptimizer", "initial_curvature"]
