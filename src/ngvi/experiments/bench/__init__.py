"""``ngvi bench``: step time and peak memory of every optimizer against torch.optim.Adam, in one run.

Models: the MLP 784-1000-1000-10 (batch 256), a small CNN (conv 32 → pool → conv 64 → pool → 128 → 10 on
1×28×28, batch 256), and a sweep of MLPs 784-h-h-10 (0.1M–11M parameters) for the scaling plot. Data are
random; every method trains its own copy of the same initial weights on the same batch.

**Time.** After a warm-up, the methods take turns: each round times ``--steps`` consecutive steps of each
method, so that slow drifts of a shared machine hit all of them alike. A step is what a training loop does:
zero_grad, forward, loss, backward and the update (``opt.step(closure)`` for ngvi). We report the median step
and the ratio to Adam's median from the same run. Noisy K-FAC is reported by its mean over whole
``inv_every`` cycles (its amortised cost: cheap steps plus one with the factor inversions).

**Memory.** The peak of live tensor bytes from building the model and optimizer through three steps, as the
allocator reports it to ``torch.profiler`` (``profile_memory=True``): parameters, gradients, optimizer state,
activations and every temporary. Python objects and allocator caches are not counted. On an accelerator,
``torch.accelerator`` peak-memory counters are used instead.

**The floor** is an Adam step plus one standard-normal draw per weight, timed in the same rounds: the least a
weight-perturbation step can cost. The "× floor" column is every method's step over it; ``<rule>-compiled``
rows time ``compile=True`` (compiled during the warm-up steps).

**Beyond forward + backward.** ``fwd_bwd`` is the same closure with no optimizer, timed in the same rounds
(``adam``, ``floor`` and ``fwd_bwd`` are always timed, first in each round): "over fwd+bwd" is a method's
step minus its time. After the rounds, untimed steps of each method are counted (:mod:`.counting`): the
ATen ops dispatched beyond forward + backward's (on CUDA the kernel launches torch.profiler records instead)
and the host syncs (``.item()`` and kin; on the CPU every read of a value, on an accelerator reads of device
tensors).

**References** (optional, found if importable): ``ivon-opt`` (the IVON authors' optimizer) and BackPACK's
``SumGradSquared`` extension (per-example squared gradients, the VOGN curvature) followed by an Adam step.
VOGN, noisy K-FAC and BBVI appear when this build has them (``ngvi.VOGN``, ``ngvi.NoisyKFAC``,
``ngvi.baselines.BBVI``).
"""

from .experiment import EXPERIMENT, Bench

__all__ = ["EXPERIMENT", "Bench"]
