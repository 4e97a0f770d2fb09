"""tools/check_api_docs.py, the docs build's check of the public API: its parts on small known inputs."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="the docs extra (griffe comes with mkdocstrings[python])")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import check_api_docs  # noqa: E402
import griffe_rst  # noqa: E402

SOURCE = '''
def documented(model, data_size, *args, _private=None, **engine_kwargs):
    """Train.

    Args:
        model: the net.
        data_size: N.
        **engine_kwargs: the engine's options.
    """

def half(x, y):
    """Uses ``x`` only; ``y_other`` and ``x.y`` name other things."""

class Thing:
    """A thing."""
    def __init__(self, width):
        """``width``: how wide."""
'''


def test_undocumented_args_finds_exactly_the_unnamed_ones():
    with griffe.temporary_visited_module(SOURCE) as module:
        assert check_api_docs._undocumented_args(module["documented"]) == []  # *args, _private exempt
        assert check_api_docs._undocumented_args(module["half"]) == ["y"]
        assert check_api_docs._undocumented_args(module["Thing"]) == []  # named in __init__'s docstring


def test_inventory_reads_the_object_names(tmp_path):
    body = "ngvi.predict.predict py:function 1 reference/predict.html#$ -\nngvi py:module 1 x.html -\n"
    header = b"# Sphinx inventory version 2\n# Project: ngvi\n# Version: 0\n# zlib\n"
    (tmp_path / "objects.inv").write_bytes(header + zlib.compress(body.encode()))
    assert check_api_docs._inventory(tmp_path) == {"ngvi.predict.predict", "ngvi"}


def test_rst_constructs_become_markdown():
    text = "See :class:`~ngvi.optim.vadam.Vadam` and :func:`ngvi.predict`. Example::\n\n    x = 1\n"
    assert griffe_rst.rst_to_markdown(text) == "See `Vadam` and `ngvi.predict`. Example:\n\n    x = 1\n"
    block = griffe_rst.rst_to_markdown(".. math::\n    a &= b \\\\\n    c &= d\n\nafter")
    assert "<math" in block and "<mtable" in block and block.rstrip().endswith("after")
