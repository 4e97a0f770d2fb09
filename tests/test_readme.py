"""The README's Python examples run as pasted, one after the other (the quickstart is the front door)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    torch.manual_seed(0)
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["samples"].shape == (32, 100, 1)
    assert (namespace["samples"].std(0) > 0).all()  # posterior draws differ
    assert namespace["opt"].num_steps == 5 * 8 + 1
