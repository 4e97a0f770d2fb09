"""Every trainer's trajectory stays bitwise what it was recorded as, computed with pinned numerics in a child
process (see ``tests/golden/trajectories.py``). Two recordings: the default paths' (re-recorded when the flat
buffers drew one ε per bucket instead of one per parameter, a new random stream) and the one before them
(main before the architecture refactor), which the per-tensor path (``flat=False``) must still compute bit for
bit: fed the same ε, the old engine and the new one agree (``tests/optim/test_flat.py`` checks the flat path
against the per-tensor one directly).

Bits are checked wherever this CPU type's numerics were recorded (its fingerprint, or the same digests). On a
CPU type never recorded, the final values are compared with the recorded ones to |got − recorded| ≤ ATOL +
RTOL·|recorded| (RTOL = 2e-3, ATOL = 2e-5) and a warning says that bits could not be checked. Measured: the
golden UCI run (40 epochs) moved by at most 7.9e-6 relative between the two CPU types recorded (an AMD EPYC
and the machine of the first recording), and a harsher change of numerics on one machine (ATen's AVX-512
kernels and MKL's default path instead of the pinned ones) moved the 40 trajectories by at most 0.39 of that
tolerance (noisy_adam/conv's mean: 9.5e-4 relative, 4.6e-5 absolute). A change to an update rule, a random
stream or a default moves them by far more.
"""

from __future__ import annotations

import json
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("golden")))
import trajectories as golden

RECORDED = json.loads(golden.FILE.read_text())
RECORDED_PER_TENSOR = json.loads(golden.PER_TENSOR_FILE.read_text())
RECORDED_UCI = json.loads(golden.UCI_FILE.read_text())


@cache
def computed() -> dict:
    return json.loads(golden.run_pinned())


@cache
def computed_per_tensor() -> dict:
    return json.loads(golden.run_pinned("--per-tensor"))


def check_against_recordings(key: str, digests: dict, values: dict, fingerprint: str, recorded: dict) -> None:
    """Bitwise where this CPU type (fingerprint) or these digests were recorded, else to tolerance, warned."""
    machines = recorded["digests"]
    if fingerprint in machines:
        assert digests == machines[fingerprint][key], f"{key}: not bitwise what was recorded on this CPU type"
        return
    if any(digests == m[key] for m in machines.values()):
        return
    bad = golden.value_mismatches(values, recorded["values"][key], golden.RTOL, golden.ATOL)
    assert not bad, f"{key}: values moved beyond rtol={golden.RTOL}: {bad[:3]}"
    warnings.warn(
        f"{key}: no recording for this CPU type's numerics ({fingerprint}): checked to rtol={golden.RTOL}, "
        "not bitwise (record it at the reference commit with tests/golden/trajectories.py --add-machine)",
        stacklevel=2,
    )


@pytest.mark.parametrize("case", golden.all_cases(), ids=lambda c: golden.case_id(*c))
def test_trajectory_is_bitwise_unchanged(case):
    key, got = golden.case_id(*case), computed()
    check_against_recordings(key, got["digests"][key], got["values"][key], got["fingerprint"], RECORDED)


@pytest.mark.parametrize("case", golden.all_cases(), ids=lambda c: golden.case_id(*c))
def test_the_per_tensor_path_is_bitwise_the_recording_before_flat_buffers(case):
    key, got = golden.case_id(*case), computed_per_tensor()
    check_against_recordings(
        key, got["digests"][key], got["values"][key], got["fingerprint"], RECORDED_PER_TENSOR
    )


@pytest.mark.parametrize("recorded", [RECORDED, RECORDED_PER_TENSOR], ids=["default", "per_tensor"])
def test_every_recorded_case_is_run(recorded):
    cases = {golden.case_id(*c) for c in golden.all_cases()}
    assert set(recorded["values"]) == cases
    assert all(set(m) == cases for m in recorded["digests"].values())


def test_value_tolerance_catches_a_real_change():
    """The fallback is not vacuous: one ulp passes, a change of 1% in one weight does not."""
    values = RECORDED["values"]["vadam/linear"]
    nudged = {k: list(v) for k, v in values.items()}
    largest = max(range(len(values["mean"])), key=lambda i: abs(values["mean"][i]))
    nudged["mean"][largest] *= 1 + 2**-23
    assert golden.value_mismatches(nudged, values, golden.RTOL, golden.ATOL) == []
    nudged["mean"][largest] *= 1.01
    assert golden.value_mismatches(nudged, values, golden.RTOL, golden.ATOL)


def test_an_unrecorded_cpu_type_is_checked_to_tolerance_and_warned():
    key = "vadam/linear"
    values = RECORDED["values"][key]
    legacy = next(m[key] for m in RECORDED["digests"].values())
    check_against_recordings(
        key, legacy, values, "another-cpu", RECORDED
    )  # recorded digests: bitwise, silent
    with pytest.warns(UserWarning, match="not bitwise"):
        check_against_recordings(key, {"mean": "?"}, values, "another-cpu", RECORDED)
    moved = {k: [1.01 * v for v in vs] for k, vs in values.items()}
    with pytest.raises(AssertionError, match="beyond rtol"):
        check_against_recordings(key, {"mean": "?"}, moved, "another-cpu", RECORDED)


@pytest.mark.data("uci")
def test_uci_yacht_split0_is_bitwise_unchanged(tmp_path, data_dir):
    """`ngvi uci --tune none` on yacht's split 0: RMSE, log-likelihood and curve, to the bit."""
    golden.run_pinned("--uci", str(tmp_path), "--data-dir", str(data_dir))
    values = golden.uci_values(str(tmp_path))
    digests, fingerprint = golden.uci_digests(values), (tmp_path / "fingerprint.txt").read_text()
    assert set(values) == set(RECORDED_UCI["values"])
    for key in values:
        check_against_recordings(key, digests[key], values[key], fingerprint, RECORDED_UCI)
