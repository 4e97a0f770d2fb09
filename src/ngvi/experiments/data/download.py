"""Fetch the benchmark data from pinned upstream sources into a data folder, verifying every checksum.

For users with a network; ngvi's loaders and tests never call it. Usage::

    python -m ngvi.experiments.data.download uci/yacht mnist --data-dir ~/ngvi-data
    export NGVI_DATA=~/ngvi-data

Groups: ``all``, ``uci``, ``uci/<name or alias>``, ``libsvm``, ``libsvm_australian_scale``,
``libsvm_breast_cancer_scale``, ``usps``, ``mnist``, ``bandits``, ``bandits/mushroom``,
``bandits/statlog_shuttle``, ``bandits/adult``.
Files changed after download in the staged folder (see MANIFEST.md) are changed the same way here, and the
upstream bytes are checked first where their hash is known: mushroom and adult lose an added header line;
MNIST's training images are re-gzipped (level 9, mtime 0) after their decompressed md5 is checked; USPS 3-vs-5
is derived from ``zip.train.gz`` and ``zip.test.gz``. Every result must match the embedded sha256.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ._checksums import CHECKSUMS
from ._files import ChecksumError, PathLike, verify_file
from ._sources import MNIST_TRAIN_IMAGES_MD5, file_source
from .uci import uci_name

Fetch = Callable[[str], bytes]
_ADULT_TEST_FIRST_LINE = b"|1x3 Cross validator\n"


def _urlopen_fetch(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "ngvi-data-download"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def files_in(group: str) -> list[str]:
    """The data files (paths relative to the data folder) of a download group, derived files last."""
    key = group.strip().strip("/")
    if key == "all":
        selected = list(CHECKSUMS)
    elif key == "libsvm":
        selected = [r for r in CHECKSUMS if r.startswith("libsvm_")]
    else:
        if key.startswith("uci/"):
            key = "uci/" + uci_name(key[4:])
        selected = [r for r in CHECKSUMS if r == key or r.startswith(key + "/")]
    if not selected:
        raise ValueError(
            f"unknown data group {group!r}; see `python -m ngvi.experiments.data.download --help`"
        )
    return sorted(selected, key=lambda r: (file_source(r).url is None, r))


def derive_usps_3vs5(train_gz: bytes, test_gz: bytes) -> bytes:
    """``usps_3vs5.txt.gz`` from the ESL zip files: rows of digit 3 or 5, train then test, right-stripped."""
    lines = []
    for blob in (train_gz, test_gz):
        for line in gzip.decompress(blob).decode("ascii").splitlines():
            if line.strip() and float(line.split()[0]) in (3.0, 5.0):
                lines.append(line.rstrip() + "\n")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="usps_3vs5.txt", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as f:
        f.write("".join(lines).encode("ascii"))
    return buf.getvalue()


def _dump_kjv() -> bytes:
    """``text/kjv.txt`` as MANIFEST.md §5 made it: Debian's ``bible`` dump, one verse a line, no reference."""
    if shutil.which("bible") is None:
        raise ChecksumError(
            "text/kjv.txt is dumped from Debian's Bible package: `apt-get install bible-kjv` (it brings "
            "bible-kjv-text 4.38), then run this download again"
        )
    dump = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, check=True).stdout
    lines = dump.decode("ascii").splitlines(keepends=True)
    return "".join(re.sub(r"^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ ", "", line) for line in lines).encode("ascii")


def _check_upstream(rel: str, raw: bytes, expected: str | None) -> None:
    if expected is not None and hashlib.sha256(raw).hexdigest() != expected:
        raise ChecksumError(f"the upstream copy of {rel!r} is not the expected one (sha256 differs)")


def _build(rel: str, root: Path, fetch: Fetch) -> bytes:
    src = file_source(rel)
    if src.fix == "usps_3vs5":
        train, test = (root / "usps/zip.train.gz").read_bytes(), (root / "usps/zip.test.gz").read_bytes()
        return derive_usps_3vs5(train, test)
    if src.fix == "debian_kjv":
        return _dump_kjv()
    assert src.url is not None
    raw = fetch(src.url)
    _check_upstream(rel, raw, src.upstream_sha256)
    if src.fix is None:
        return raw
    if src.fix == "drop_first_line":
        body = raw.split(b"\n", 1)[1] if b"\n" in raw else b""
        return body if body.endswith(b"\n") else body + b"\n"
    if src.fix == "adult_test_header":
        return _ADULT_TEST_FIRST_LINE + raw.split(b"\n", 1)[1]
    if src.fix == "regzip":
        images = gzip.decompress(raw)
        if hashlib.md5(images, usedforsecurity=False).hexdigest() != MNIST_TRAIN_IMAGES_MD5:
            raise ChecksumError(f"{src.url} does not decompress to LeCun's train-images-idx3-ubyte")
        return gzip.compress(images, compresslevel=9, mtime=0)
    raise ValueError(f"unknown fix {src.fix!r} for {rel!r}")


def download(
    group: str, data_dir: PathLike, *, overwrite: bool = False, fetch: Fetch | None = None
) -> list[Path]:
    """Fetch a group of data files into ``data_dir`` and verify them; returns the files written.

    Files already present with the right checksum are kept unless ``overwrite``. ``fetch(url) -> bytes``
    replaces the network call (for mirrors or tests). Nothing is written for a file that fails verification.
    """
    fetch = fetch or _urlopen_fetch
    root = Path(data_dir).expanduser()
    written = []
    for rel in files_in(group):
        path = root / rel
        if path.is_file() and not overwrite:
            try:
                verify_file(path, rel)
                continue
            except ChecksumError:
                pass
        content = _build(rel, root, fetch)
        digest, size = CHECKSUMS[rel]
        actual = hashlib.sha256(content).hexdigest()
        if actual != digest:
            raise ChecksumError(
                f"fetched {rel!r} ({len(content)} bytes, sha256 {actual}) does not match the expected "
                f"sha256 {digest} ({size} bytes); source: {file_source(rel).page}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(content)
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ngvi.experiments.data.download", description=__doc__.split("\n")[0]
    )
    parser.add_argument("groups", nargs="+", help="e.g. all, uci, uci/yacht, libsvm, mnist, usps, bandits")
    parser.add_argument("--data-dir", default=os.environ.get("NGVI_DATA"), help="target (default $NGVI_DATA)")
    parser.add_argument("--force", action="store_true", help="re-fetch files that are already present")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("give --data-dir or set NGVI_DATA")
    for group in args.groups:
        for path in download(group, args.data_dir, overwrite=args.force):
            print(f"wrote {path}")
    print(f"done; use it with: export NGVI_DATA={Path(args.data_dir).expanduser().resolve()}")


if __name__ == "__main__":
    main()
