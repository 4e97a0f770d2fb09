"""``ngvi classify``: image classification, calibration, out-of-distribution detection and shift
(:mod:`.experiment`), its models (:mod:`.models`), transforms (:mod:`.transforms`) and report
(:mod:`.report`)."""

from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
