"""The weight-perturbation engine (internal): :class:`VariationalOptimizer` and its parts.

The update rules (``ngvi.optim.vadam``, ...) sit beside this package and subclass
:class:`VariationalOptimizer`; nothing in here imports a rule. The parts: the noise (:mod:`.noise`), the draw
(:mod:`.perturbation`), the per-sample sums (:mod:`.accumulator`), the closure contract (:mod:`.closure`),
batch-norm buffers across samples (:mod:`.buffers`), the prior's starting precision (:mod:`.prior`), float32
state for low-precision parameters (:mod:`.mixed_precision`) and ``load_state_dict``'s checks
(:mod:`.state_checks`). docs/ARCHITECTURE.md draws them. This ``__init__`` imports nothing, so
importing one part (``from .engine import mixed_precision``) loads only that part.
"""
