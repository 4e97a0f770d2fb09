"""Character-level text for language modelling: ``text/<name>.txt`` in the data folder, checksummed.

Only ``kjv`` (the King James Version, one verse a line; MANIFEST.md §5) is staged: it stands in for War and
Peace, the text of Wilson et al. 2017 (Fig. 2b) and Vadam App. M, which is not available offline.
"""

from __future__ import annotations

from ._files import PathLike, data_path

#: the texts ``load_text`` knows, with their length in characters (all ASCII: one byte each)
TEXTS = {"kjv": 4137850}


def load_text(name: str = "kjv", data_dir: PathLike | None = None) -> str:
    """The whole text ``name`` after checking it against its embedded sha256.

    Raises:
        ValueError: an unknown ``name``.
        DataNotFoundError: no data folder, or the file is missing from it.
        ChecksumError: the file's content differs from the expected one.
    """
    if name not in TEXTS:
        raise ValueError(f"unknown text {name!r}; choose from {', '.join(TEXTS)}")
    return data_path(f"text/{name}.txt", data_dir).read_bytes().decode("ascii")
