"""The CIFAR-10 batch reader (issue 20): it reads the pickles that Python 2 and 3 and numpy 1.x and 2.x write
for a batch, bit for bit, and refuses every crafted file with one line, without a crash and without running
anything. The crafted files are run in child processes, so that a segfault fails a test instead of pytest."""

from __future__ import annotations

import ast
import os
import pickle
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from ngvi.experiments.data._safe_pickle import loads
from ngvi.experiments.data.cifar10 import MAX_BATCH_BUILT, MAX_BATCH_FILE, load_cifar10

# ---- raw opcodes, as Python 2's cPickle writes them at protocol 2 (strings are SHORT_BINSTRING / BINSTRING)


def glob(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def pystr(b: bytes) -> bytes:
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b


def dtype(code: bytes, state: bytes) -> bytes:
    """numpy.dtype(code, 0, 1) and BUILD with ``state``, the opcodes of a tuple."""
    return glob("numpy", "dtype") + pystr(code) + b"K\x00K\x01\x87R" + state + b"b"


NONE3 = b"NNN"
MINUS1 = b"J\xff\xff\xff\xff"
U1 = dtype(b"u1", b"(K\x03U\x01|" + NONE3 + MINUS1 + MINUS1 + b"K\x00t")  # numpy's state of dtype('u1')
O8_FLAGS0 = dtype(b"O8", b"(K\x03U\x01|" + NONE3 + MINUS1 + MINUS1 + b"K\x00t")  # object dtype, flags forged


def array(dtype_ops: bytes, shape: bytes, data: bytes) -> bytes:
    """numpy's pickle of an array: _reconstruct(ndarray, (0,), b'b'), BUILD (1, shape, dtype, False, data)."""
    head = glob("numpy.core.multiarray", "_reconstruct") + glob("numpy", "ndarray") + b"K\x00\x85U\x01b\x87R"
    return head + b"(K\x01" + shape + dtype_ops + b"\x89" + pystr(data) + b"tb"


def batch(data_ops: bytes, labels: bytes = b"]K\x00a") -> bytes:
    """A dict {b'data': ..., b'labels': ...} around the given opcodes."""
    return b"\x80\x02}(U\x04data" + data_ops + b"U\x06labels" + labels + b"u."


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch as the real files are written: Python 2 cPickle, protocol 2, numpy 1.x names."""
    n = len(labels)
    shape = b"M" + struct.pack("<H", n) + b"M\x00\x0c\x86"  # (n, 3072)
    ints = b"".join(b"K" + bytes([y]) for y in labels)
    names = b"".join(pystr(f"img_{i}.png".encode()) for i in range(n))
    return (
        b"\x80\x02}q\x01(U\x04dataq\x02"
        + array(U1, shape, data.tobytes())
        + b"U\x06labelsq\x03](" + ints + b"eU\x0bbatch_labelq\x04U\x0ftesting batch 1"
        + b"U\tfilenames](" + names + b"eu."
    )  # fmt: skip


def cifar_batch(n: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": rng.integers(0, 10, n).tolist(),
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_reads_what_python_and_numpy_write_bit_for_bit(protocol):
    written = cifar_batch()
    written["text"] = "é, and an empty bytes"
    written[b"empty"] = b""
    read = loads(pickle.dumps(written, protocol=protocol), "batch")
    assert read.keys() == written.keys()
    assert read[b"data"].dtype == np.uint8 and read[b"data"].shape == (3, 3072)
    assert read[b"data"].tobytes() == written[b"data"].tobytes()
    del read[b"data"], written[b"data"]
    assert read == written


def test_reads_the_python2_form_of_the_real_batches(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, (2, 3072), dtype=np.uint8)
    raw = py2_batch(data, [3, 9])
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw and b"T\x00\x18\x00\x00" in raw  # BINSTRING data
    expected = pickle.loads(raw, encoding="bytes")  # our own bytes: a check of the fixture, not of a file
    read = loads(raw, "py2")
    assert read[b"data"].tobytes() == expected[b"data"].tobytes() == data.tobytes()
    assert read[b"labels"] == [3, 9] and read[b"filenames"] == [b"img_0.png", b"img_1.png"]
    (tmp_path / "test_batch").write_bytes(raw)
    x, y = load_cifar10(tmp_path, "test")
    assert x.numpy().tobytes() == data.tobytes() and x.shape == (2, 3, 32, 32) and y.tolist() == [3, 9]


def test_a_shared_array_and_dtype_are_read():
    a = np.arange(6, dtype=np.uint8).reshape(2, 3)
    first, second = loads(pickle.dumps([a, a, np.ones(2, np.uint8)], protocol=2), "shared")[:2]
    assert first is second and first.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    ("written", "refused"),
    [
        (np.zeros(3, np.int64), r"numpy\.dtype\('i8'"),
        (np.zeros(3, ">u2"), r"numpy\.dtype\('u2'"),
        (np.zeros((3, 2), np.uint8).T, "C-ordered uint8"),  # Fortran order
        (np.zeros(2, object), r"numpy\.dtype\('O8'"),
        (np.zeros(2, [("a", "u1"), ("b", "O")]), r"numpy\.dtype\('V9'"),
        (np.float64(1.0), r"refused the global 'numpy\._core\.multiarray\.scalar'"),
        (1.5, "refused the opcode BINFLOAT"),
        ({1, 2}, "refused the (global '__builtin__.set'|opcode EMPTY_SET)"),
    ],
)
def test_refuses_anything_but_plain_data_and_uint8_arrays(written, refused):
    for protocol in (2, 5):
        with pytest.raises(ValueError, match=f"^f: at byte [0-9]+ .*{refused}") as err:
            loads(pickle.dumps(written, protocol=protocol), "f")
        assert "\n" not in str(err.value)


def test_cifar_batch_contents_are_checked(tmp_path):
    good = cifar_batch(2)
    cases = {
        "labels out of range": ({**good, b"labels": [0, 10]}, "'labels' must be a list of 2 ints in 0..9"),
        "too few labels": ({**good, b"labels": [0]}, "'labels' must be a list of 2 ints"),
        "bool labels": ({**good, b"labels": [True, 0]}, "'labels' must be a list of 2 ints"),
        "image size": ({**good, b"data": np.zeros((2, 3071), np.uint8)}, r"'data' must be a uint8 array"),
        "no data": ({b"labels": [1]}, r"'data' must be a uint8 array \[n, 3072\], got NoneType"),
        "not a dict": ([1, 2], "is not a CIFAR-10 batch \\(a dict\\) but a list"),
    }
    for content, message in cases.values():
        (tmp_path / "test_batch").write_bytes(pickle.dumps(content, protocol=2))
        with pytest.raises(ValueError, match=message):
            load_cifar10(tmp_path, "test")


# ---- crafted files, each in a child process: a crash there fails the test; nothing may run

# Writes the proof of concept of issue 20 in the child itself (it needs the address of os.system there): a
# forged object dtype (flags 0) makes numpy.core.multiarray.scalar read 8 bytes of the file as an object
# pointer, the REDUCE that follows calls what it points to. Then loads every batch folder under ROOT.
CHILD = """
import os, struct, sys
from pathlib import Path
from ngvi.experiments.data.cifar10 import MAX_BATCH_BUILT, MAX_BATCH_FILE, load_cifar10
root, marker = Path(sys.argv[1]), sys.argv[2]
command = f"touch {marker}".encode()
poc = root / "poc_os_system"
poc.mkdir()
(poc / "test_batch").write_bytes(
    b"\\x80\\x02" + bytes.fromhex(sys.argv[3]) + b"U\\x08" + struct.pack("<Q", id(os.system))
    + b"\\x86R(X" + struct.pack("<I", len(command)) + command + b"tR."
)
for folder in sorted(root.iterdir()):
    try:
        x, y = load_cifar10(folder, "test")
        outcome = f"loaded {tuple(x.shape)}"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    print(f"{folder.name}\\t{outcome!r}", flush=True)
"""

SCALAR = glob("numpy.core.multiarray", "scalar")
STRUCT_STATE = b"(K\x03U\x01|N(U\x01aU\x01bt}(U\x01a(" + O8_FLAGS0 + b"K\x00tU\x01b(" + U1 + b"K\x08tu"
# dtype state: one field 'a' of type u1 at offset 2**30, in items of 1 byte
FAR_FIELD_STATE = b"(K\x03U\x01|N(U\x01at}U\x01a(" + U1 + b"J\x00\x00\x00\x40tsK\x01K\x01K\x00t"
ATTACKS = {
    # object-dtype flags: an object array over raw bytes, and flags forged on dtype('u1')
    "object_dtype_array": (batch(array(O8_FLAGS0, b"K\x01\x85", b"A" * 8)), r"refused numpy\.dtype\(b'O8'"),
    "u1_forged_flags": (
        batch(array(dtype(b"u1", b"(K\x03U\x01|" + NONE3 + MINUS1 + MINUS1 + b"K?t"), b"K\x01\x85", b"A")),
        r"refused the dtype state \(3, b'\|', None, None, None, -1, -1, 63\)",
    ),
    # a forged scalar: an object pointer read from the file (it would crash at 0x4141414141414141)
    "forged_scalar": (
        b"\x80\x02" + SCALAR + O8_FLAGS0 + b"U\x08AAAAAAAA\x86R.",
        r"at byte 2 \(GLOBAL\): refused the global 'numpy\.core\.multiarray\.scalar'",
    ),
    # struct dtypes with object fields, and a field at an offset far outside the item
    "struct_object_fields": (
        batch(array(dtype(b"V9", STRUCT_STATE + b"K\tK\x01K?t"), b"K\x01\x85", b"A" * 9)),
        r"refused numpy\.dtype\(b'V9'",
    ),
    "field_offset_out_of_range": (
        batch(array(dtype(b"V1", FAR_FIELD_STATE), b"K\x01\x85", b"A")),
        r"refused numpy\.dtype\(b'V1'",
    ),
    "far_field_state_on_u1": (
        batch(array(dtype(b"u1", FAR_FIELD_STATE), b"K\x01\x85", b"A")),
        r"\(SETITEM\): refused \(dtype\('u1'\), 1073741824\) as data",  # in the fields dict
    ),
    # huge declared sizes: of a string, of bytes, of an array, of bytes()
    "huge_binstring": (b"\x80\x02T\xff\xff\xff\x7fAAAA.", "expected 2147483647 bytes in a string4"),
    "huge_binbytes8": (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"AAAA.", "expected 461168601842738"),
    "huge_shape": (
        batch(array(U1, b"\x8a\x06\x00\x00\x00\x00\x00\x01M\x00\x0c\x86", b"AAAA")),
        r"an array of shape \(1099511627776, 3072\) was given 4 bytes of data",
    ),
    "huge_bytes_call": (
        glob("__builtin__", "bytes") + b"(J\x00\x00\x00\x7ftR.",
        r"refused __builtin__\.bytes",
    ),
    "negative_shape": (batch(array(U1, b"J\xff\xff\xff\xffJ\xfc\xff\xff\xff\x86", b"AAAA")), "sizes >= 0"),
    # deep nesting: lists in lists, marks in marks, tuples in tuples, and lists nested after the fact
    "deep_lists": (b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b".", "containers nested deeper than 32"),
    "deep_marks": (b"\x80\x02" + b"(" * 100_000 + b".", "MARKs nested deeper than 32"),
    "deep_tuples": (b"\x80\x02)" + b"\x85" * 100_000 + b".", "containers nested deeper than 32"),
    "lists_nested_later": (  # 40 empty lists, to be nested through the memo once they are inside others
        b"\x80\x02" + b"".join(b"]q" + bytes([i]) for i in range(40)) + b"h\x00h\x01a.",
        "refused a second reference to a list",
    ),
    "shared_list": (b"\x80\x02]q\x00h\x00a.", "refused a second reference to a list"),
    # globals that run code
    "os_system": (glob("os", "system") + b"(S'touch MARKER'\ntR.", "refused the global 'os.system'"),
    "posix_system_reduce": (None, "refused the global 'posix.system'"),
    "builtins_eval": (glob("builtins", "eval") + b"(S'1+1'\ntR.", "refused the global 'builtins.eval'"),
    "eval_stack_global": (
        b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x031+1\x85R.",
        "refused the global 'builtins.eval'",
    ),
    "codecs_other_encoding": (glob("_codecs", "encode") + b"(Vx\nVzlib\ntR.", r"refused _codecs\.encode"),
}


class _RunsCode:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_crafted_files_end_in_one_clean_line_never_a_crash_or_code(tmp_path):
    marker = tmp_path / "pwned"
    root = tmp_path / "batches"
    for name, (raw, _) in ATTACKS.items():
        if raw is None:
            raw = pickle.dumps({b"data": _RunsCode(f"touch {marker}"), b"labels": [0]}, protocol=2)
        (root / name).mkdir(parents=True)
        (root / name / "test_batch").write_bytes(raw.replace(b"MARKER", str(marker).encode()))
    poc_head = (SCALAR + O8_FLAGS0).hex()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(marker), poc_head],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == 0, f"the reader crashed ({child.returncode}):\n{child.stdout}\n{child.stderr}"
    assert not marker.exists(), "a crafted file ran code"
    outcomes = dict(line.split("\t", 1) for line in child.stdout.splitlines())
    expected = {
        **{name: message for name, (_, message) in ATTACKS.items()},
        "poc_os_system": r"refused the global 'numpy\.core\.multiarray\.scalar'",
    }
    assert outcomes.keys() == expected.keys()
    for name, message in expected.items():
        outcome = ast.literal_eval(outcomes[name])  # the child's repr of its one line
        assert outcome.startswith(f"ValueError: CIFAR-10 batch {root / name / 'test_batch'}: "), outcome
        assert "\n" not in outcome
        assert re.search(message, outcome), (name, outcome)


def test_classify_reports_a_crafted_batch_in_one_line(tmp_path):
    """`ngvi classify --dataset cifar10` reaches the reader before training, and exits 2 with one line."""
    folder = tmp_path / "batches"
    folder.mkdir()
    (folder / "test_batch").write_bytes(b"\x80\x02" + SCALAR + O8_FLAGS0 + b"U\x08AAAAAAAA\x86R.")
    args = ["classify", "--quick", "--dataset", "cifar10", "--model", "resnet20", "--cifar-dir", str(folder),
            "--out", str(tmp_path / "out"), "--jobs", "1"]  # fmt: skip
    child = subprocess.run(
        [sys.executable, "-m", "ngvi.experiments.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 2, (child.returncode, child.stderr)
    assert child.stderr.strip().splitlines() == [
        f"ngvi classify: error: CIFAR-10 batch {folder / 'test_batch'}: at byte 2 (GLOBAL): refused the "
        "global 'numpy.core.multiarray.scalar': a data pickle may name only numpy's array and dtype "
        "rebuilders (and nothing named is run)"
    ]
    assert not (tmp_path / "out" / "results.json").exists()


# ---- memory (issue 31): the memo rebuilds one string into many arrays; a batch file of many gigabytes


def memo_bomb(copies: int, size: int) -> bytes:
    """A batch whose 'data' is a list of ``copies`` arrays, each rebuilt from one ``size``-byte string that
    the file holds once (memo slot 9): ``copies × size`` bytes asked for by a file of ``size`` bytes."""
    one = array(U1, b"J" + struct.pack("<i", size) + b"\x85", b"")  # its data: BINGET 9 instead of a string
    one = one.replace(pystr(b"") + b"tb", b"h\x09tb")
    return b"\x80\x02}(U\x04data](" + pystr(b"A" * size) + b"q\x09" + one * copies + b"eu."


def test_a_string_rebuilt_through_the_memo_is_bounded_by_the_file_size():
    raw = memo_bomb(200, 1 << 20)  # 1 MB on disk, 200 MB asked (the 3,000 copies ask for 3 GB)
    assert len(raw) < (1 << 20) + 30_000
    message = r"^bomb: at byte [0-9]+ \(BUILD\): the pickle builds more than "
    with pytest.raises(ValueError, match=message) as e:
        loads(raw, "bomb")
    assert "\n" not in str(e.value)
    # a few copies fit in the budget: they are read, so the bound is on the size and not on the form
    read = loads(memo_bomb(3, 1 << 10), "few")
    assert [a.shape for a in read[b"data"][1:]] == [(1024,)] * 3


def test_a_cifar_batch_may_build_no_more_than_a_batch_needs(tmp_path):
    """Within 8 × its size, but more than a real batch's bytes three times over: refused before the copies."""
    raw = memo_bomb(8, 16 << 20)  # a 16 MB file asking for 128 MB
    assert MAX_BATCH_BUILT < 8 * (16 << 20) and len(raw) < MAX_BATCH_FILE
    (tmp_path / "test_batch").write_bytes(raw)
    with pytest.raises(ValueError, match=f"batch {tmp_path / 'test_batch'}: at byte [0-9]+ \\(BUILD\\): the "
                       f"pickle builds more than {MAX_BATCH_BUILT:,} bytes") as e:  # fmt: skip
        load_cifar10(tmp_path, "test")
    assert "\n" not in str(e.value)


def test_a_batch_file_larger_than_a_batch_is_refused_unread(tmp_path, monkeypatch):
    file = tmp_path / "test_batch"
    with file.open("wb") as f:  # sparse: takes no disk
        f.truncate(3 << 30)
    monkeypatch.setattr("pathlib.Path.read_bytes", lambda self: pytest.fail("the whole file was read"))
    message = (
        r"test_batch has 3,221,225,472 bytes, more than the 67,108,864 read from a batch "
        r"\(a real one, 10,000 images, is about 31 MB\): use the batch files"
    )
    with pytest.raises(ValueError, match=message) as e:
        load_cifar10(tmp_path, "test")
    assert "\n" not in str(e.value)
