"""Finding the data folder, checking files against the embedded sha256 table, and clear errors.

The data folder is ``data_dir`` when given, else the environment variable ``NGVI_DATA``. Every file a
loader reads is checked against :data:`ngvi.experiments.data._checksums.CHECKSUMS` once per process
(a file that changes on disk is checked again).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

from ._checksums import CHECKSUMS
from ._sources import file_source

ENV_VAR = "NGVI_DATA"

PathLike = str | os.PathLike[str]

_verified: set[tuple[str, int, int, int, int]] = set()
_lock = threading.Lock()


class DataNotFoundError(FileNotFoundError):
    """A data folder or file is missing. The message says what is missing, where we looked and what to do."""

    def __init__(self, message: str, filename: str | None = None) -> None:
        super().__init__(errno.ENOENT, message, filename)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return type(self), (self.strerror, self.filename)


class ChecksumError(ValueError):
    """A data file exists but its content is not the expected one (corrupt, truncated or another version)."""


def _fix_hint(group: str, root: Path | None) -> str:
    where = str(root) if root is not None else "/path/to/data"
    return (
        "What to do: get the ngvi benchmark data folder (the one holding MANIFEST.md, uci/, mnist/, ...)\n"
        "  and pass it as --data-dir to the ngvi commands (data_dir=... to the loaders), or set:\n"
        f"      export {ENV_VAR}=/path/to/data\n"
        "  With network access, this fetches the files from pinned upstream sources and verifies them:\n"
        f"      python -m ngvi.experiments.data.download {group} --data-dir {where}"
    )


def _group(rel: str) -> str:
    """The download group of a file: its folder (``uci/yacht``, ``mnist``, ``bandits/adult``)."""
    return rel.rsplit("/", 1)[0]


def resolve_data_dir(data_dir: PathLike | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$NGVI_DATA``; it must exist.

    Raises:
        DataNotFoundError: neither is set, or the folder does not exist.
    """
    if data_dir is not None and str(data_dir) != "":
        root, origin = Path(data_dir).expanduser(), "--data-dir / data_dir="
    else:
        env = os.environ.get(ENV_VAR, "")
        if not env:
            raise DataNotFoundError(
                f"No data folder given: pass --data-dir (data_dir=... in Python) or set {ENV_VAR}.\n"
                + _fix_hint("all", None)
            )
        root, origin = Path(env).expanduser(), f"the environment variable {ENV_VAR}"
    if not root.is_dir():
        raise DataNotFoundError(
            f"The data folder {str(root)!r} (from {origin}) does not exist or is not a folder: pass "
            f"--data-dir or set {ENV_VAR} to the folder holding MANIFEST.md.\n" + _fix_hint("all", root)
        )
    return root


def sha256_file(path: PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def expected_checksum(rel: str) -> tuple[str, int]:
    """The embedded ``(sha256, size in bytes)`` of ``rel``, a path relative to the data folder."""
    try:
        return CHECKSUMS[rel]
    except KeyError:
        raise KeyError(f"{rel!r} is not a known ngvi data file") from None


def verify_file(path: PathLike, rel: str) -> None:
    """Check ``path`` against the embedded checksum of ``rel``; cached while the file is unchanged.

    Raises:
        ChecksumError: the size or the sha256 differs.
    """
    digest, size = expected_checksum(rel)
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    with _lock:
        if key in _verified:
            return
    problem = None
    if st.st_size != size:
        problem = f"it has {st.st_size} bytes, expected {size}"
    else:
        actual = sha256_file(path)
        if actual != digest:
            problem = f"its sha256 is {actual}, expected {digest}"
    if problem is not None:
        src = file_source(rel)
        raise ChecksumError(
            f"Data file {rel!r} ({src.dataset}) at {str(path)!r} failed verification: {problem}.\n"
            "It is corrupt, truncated or a different version. Replace it with a fresh copy of the ngvi data\n"
            f"folder, or from the upstream source {src.page}\n"
            "(see MANIFEST.md for changes made after download). With network access:\n"
            f"      python -m ngvi.experiments.data.download {_group(rel)} --data-dir <the data folder>"
        )
    with _lock:
        _verified.add(key)


def data_path(rel: str, data_dir: PathLike | None = None, *, verify: bool = True) -> Path:
    """The verified path of data file ``rel`` (e.g. ``"uci/yacht/data.txt"``) in the data folder.

    Raises:
        DataNotFoundError: no data folder, or the file is missing from it.
        ChecksumError: the file's content differs from the expected one.
    """
    expected_checksum(rel)
    root = resolve_data_dir(data_dir)
    path = root / rel
    if not path.is_file():
        src = file_source(rel)
        origin = "--data-dir / data_dir=" if data_dir is not None else f"${ENV_VAR}"
        lines = [
            f"Data file {rel!r} ({src.dataset}) was not found in {root}: pass --data-dir or set {ENV_VAR} to "
            "the ngvi data folder, or fetch it with "
            f"`python -m ngvi.experiments.data.download {_group(rel)}`.",
            f"  expected at: {path}",
            f"  data folder searched: {root} (from {origin})",
            f"  upstream source: {src.page}",
        ]
        if (root / "data" / rel).is_file():
            lines.append(f"  hint: it exists under {root / 'data'}; did you mean that folder?")
        raise DataNotFoundError("\n".join(lines) + "\n" + _fix_hint(_group(rel), root), str(path))
    if verify:
        verify_file(path, rel)
    return path


def clear_verification_cache() -> None:
    """Forget which files were verified, so the next read checks them again."""
    with _lock:
        _verified.clear()
