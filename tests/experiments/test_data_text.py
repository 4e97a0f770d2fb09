"""The text of `ngvi charlm`: checksummed, with clear errors for a missing or corrupted file."""

from __future__ import annotations

import shutil

import pytest

import ngvi.experiments.data as nd
from ngvi.experiments.data._files import clear_verification_cache

needs_kjv = pytest.mark.data("text/kjv.txt")


@needs_kjv
def test_kjv_is_the_checksummed_text(data_dir):
    text = nd.load_text("kjv", data_dir)
    assert len(text) == nd.TEXTS["kjv"] == 4137850
    assert text.startswith("In the beginning God created the heaven and the earth.\n")
    assert text.count("\n") == 31102 and len(set(text)) == 63  # MANIFEST.md §5: verses, characters


def test_unknown_text_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown text 'war_and_peace'; choose from kjv"):
        nd.load_text("war_and_peace", tmp_path)


def test_missing_file_says_where_and_what_to_do(tmp_path):
    with pytest.raises(nd.DataNotFoundError, match=r"Data file 'text/kjv.txt' .* was not found in"):
        nd.load_text("kjv", tmp_path)


@needs_kjv
def test_corrupted_file_fails_verification(tmp_path, data_dir):
    (tmp_path / "text").mkdir()
    copy = tmp_path / "text" / "kjv.txt"
    shutil.copyfile(data_dir / "text" / "kjv.txt", copy)
    data = bytearray(copy.read_bytes())
    data[100] ^= 1  # same size, other content
    copy.write_bytes(bytes(data))
    clear_verification_cache()
    with pytest.raises(nd.ChecksumError, match="failed verification: its sha256 is"):
        nd.load_text("kjv", tmp_path)
    copy.write_bytes(bytes(data[:-1]))
    with pytest.raises(nd.ChecksumError, match="it has 4137849 bytes, expected 4137850"):
        nd.load_text("kjv", tmp_path)
