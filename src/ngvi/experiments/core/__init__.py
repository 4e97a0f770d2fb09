"""The experiment harness: one method registry, shared models, one training loop, a runner (jobs, a
per-job result cache, resume, worker processes, clean interrupts), report helpers and BO tuning."""

from .methods import METHODS, Method
from .runner import Experiment, Interrupted, Job, Run, run

__all__ = ["METHODS", "Experiment", "Interrupted", "Job", "Method", "Run", "run"]
