"""A pickle reader that runs nothing: plain data and uint8 numpy arrays only.

Why it exists: a pickle is a program, and unpickling calls whatever the file names. Restricting
``find_class`` to numpy's array rebuilders is not enough (issue 20): ``numpy.dtype`` takes any state through
BUILD, including its flags, and an object dtype with forged flags makes numpy read raw bytes from the file
as object pointers, which crashes or runs code. So this module never calls pickle's unpickler, numpy's
unpickling or anything a file names. It walks the opcodes (:func:`pickletools.genops` only parses them)
and builds dicts, lists, tuples, str, bytes, ints, None and bools itself. A global is only a name here,
never imported. Of calls, it recognises only the exact shapes in which Python and numpy write bytes and a
C-ordered uint8 array, and builds the array with :func:`numpy.frombuffer` after checking the shape against
the byte count. Everything else is refused with a one-line :class:`ValueError`.

**Memory is bounded too** (issue 31): the memo lets a file name one value many times for the price of a
2-byte GET, and each array rebuilt from it copies its bytes, so a 1 MB file could ask for gigabytes. Every
object the reader makes is charged to a budget at about its size in CPython (a str or bytes its length plus
a header, an array or encoded string the bytes it copies, a container, list slot, dict item or memo entry a
fixed size; a reference to an existing value costs nothing, and the stack is bounded by :data:`MAX_STACK`).
The budget is a small multiple of the file's size (:data:`BUDGET_PER_BYTE` × size + :data:`BUDGET_FLOOR`),
lowered further by the caller where the content's size is known (a CIFAR batch). An honest file needs about
twice its size (its data string, then the array copied from it); a list of small ints four times.
"""

from __future__ import annotations

import builtins
import math
import pickletools
import reprlib
from typing import Any

import numpy as np

#: deepest nesting of containers and marks, and the most items on the stack (real batches need 4 and ~1000)
MAX_DEPTH = 32
MAX_STACK = 100_000
_INT_LIMIT = 1 << 63
#: the bytes a file may make the reader build: BUDGET_PER_BYTE × its size + BUDGET_FLOOR (see the docstring)
BUDGET_PER_BYTE = 8
BUDGET_FLOOR = 1 << 20
# about what CPython takes, in bytes: the header of a str, bytes or int; an empty container with its entries
# in self.depth and self.alive; a slot of a list or tuple; an item of a dict or of the memo; an array header
_HEADER = 48
_CONTAINER = 200
_SLOT = 8
_ITEM = 48
_ARRAY = 112

# The only globals a file may name, by what they stand for. None of them is imported or called.
_GLOBALS = {
    # below protocol 3, Python 3 writes bytes as _codecs.encode(str, "latin1"), and b"" as bytes()
    ("_codecs", "encode"): "encode",
    ("__builtin__", "bytes"): "bytes",
    ("builtins", "bytes"): "bytes",
    ("numpy.core.multiarray", "_reconstruct"): "reconstruct",  # numpy 1.x, protocols 0-4
    ("numpy._core.multiarray", "_reconstruct"): "reconstruct",  # numpy 2.x
    ("numpy.core.numeric", "_frombuffer"): "frombuffer",  # protocol 5
    ("numpy._core.numeric", "_frombuffer"): "frombuffer",
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
}
# the state numpy writes for dtype('u1'): version 3, no byte order, subarray, names or fields, flags 0
_U1_STATE = (3, "|", None, None, None, -1, -1, 0)


class _Short(reprlib.Repr):
    """Bounded one-line descriptions for messages (reprlib would build the full repr of bytes first)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 40
        self.maxtuple = 10  # a dtype state has 8 items

    def repr_bytes(self, x: bytes, level: int) -> str:
        return builtins.repr(bytes(x[:20])) + ("..." if len(x) > 20 else "")

    repr_bytearray = repr_bytes

    def repr_ndarray(self, x: np.ndarray, level: int) -> str:
        return f"array(shape={x.shape}, dtype={x.dtype})"


_repr = _Short()


class _Global:
    def __init__(self, tag: str, name: str) -> None:
        self.tag, self.name = tag, name

    def __repr__(self) -> str:
        return self.name


class _Dtype:
    """dtype('u1') between its REDUCE and its BUILD (the state is checked to be exactly ``_U1_STATE``)."""

    built = False

    def __repr__(self) -> str:
        return "dtype('u1')"


class _Array:
    """An ndarray from ``_reconstruct`` awaiting its BUILD state."""

    value: np.ndarray | None = None

    def __repr__(self) -> str:
        return "ndarray"


def _text(x: Any) -> Any:
    """Python 2 strings are read as bytes; where numpy wrote a name, either form means the same."""
    return x.decode("latin-1") if isinstance(x, bytes) else x


def _is_int(x: Any, *values: int) -> bool:
    return isinstance(x, int) and (not values or x in values)


def _is(x: Any, want: Any) -> bool:
    """``x == want`` for a str, int or None ``want``, by type first (an array's ``==`` is elementwise)."""
    x = _text(x)
    if isinstance(want, int):
        return _is_int(x, want)
    return type(x) is type(want) and x == want


def uint8_array(shape: Any, data: Any) -> np.ndarray:
    """A writable C-ordered uint8 array of ``shape`` from ``data``; the shape must account for every byte."""
    if not (isinstance(shape, tuple) and 1 <= len(shape) <= MAX_DEPTH):
        raise ValueError(f"an array shape must be a tuple of 1 to {MAX_DEPTH} sizes, got {_repr.repr(shape)}")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"an array shape must hold sizes >= 0, got {_repr.repr(shape)}")
    if not isinstance(data, (bytes, bytearray)) or math.prod(shape) != len(data):
        size = len(data) if isinstance(data, (bytes, bytearray)) else type(data).__name__
        raise ValueError(f"an array of shape {_repr.repr(shape)} was given {size} bytes of data")
    buffer = data if isinstance(data, bytearray) else bytearray(data)  # writable, as numpy's unpickling gives
    return np.frombuffer(buffer, dtype=np.uint8).reshape(shape)


class _Reader:
    def __init__(self, budget: int) -> None:
        self.budget, self.spent = budget, 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        # the nesting depth of each container (kept alive here, so ids stay unique), and the tuples that
        # hold a global, dtype or array in the making: those may only be arguments, never data
        self.depth: dict[int, int] = {}
        self.alive: list[Any] = []
        self.internal: set[int] = set()

    # ---- values
    def charge(self, cost: int) -> None:
        """Count ``cost`` bytes against the budget, before they are allocated."""
        self.spent += cost
        if self.spent > self.budget:
            raise ValueError(
                f"the pickle builds more than {self.budget:,} bytes of values, a bound set from the file's "
                "size (a file that names its values many times over through the memo)"
            )

    def push(self, value: Any) -> None:
        if len(self.stack) >= MAX_STACK:
            raise ValueError(f"more than {MAX_STACK} items on the pickle stack")
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise ValueError("an opcode found too few items on the stack")
        return self.stack.pop()

    def top(self) -> Any:
        """The item that APPEND(S) and SETITEM(S) add to: on the stack, above the innermost open MARK."""
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise ValueError("nothing to add items to")
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise ValueError("an opcode needs a MARK that is not there")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def container(self, value: Any, depth: int = 1) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"containers nested deeper than {MAX_DEPTH}")
        self.charge(_CONTAINER)
        self.depth[id(value)] = depth
        self.alive.append(value)
        return value

    def data_item(self, x: Any) -> int:
        """The depth of ``x``, which must be finished plain data (it goes into a list or dict)."""
        if isinstance(x, (_Global, _Dtype, _Array)) or id(x) in self.internal:
            raise ValueError(
                f"refused {_repr.repr(x)} as data: numpy's names and dtypes only build a uint8 array"
            )
        return self.depth.get(id(x), 0)

    def insert(self, target: Any, items: list[Any]) -> None:
        """APPEND(S) and SETITEM(S): put finished items into a list or dict being built."""
        if not isinstance(target, (list, dict)):
            raise ValueError(f"cannot add items to {type(target).__name__}")
        depth = self.depth[id(target)]
        for x in items:
            depth = max(depth, self.data_item(x) + 1)
        if depth > MAX_DEPTH:
            raise ValueError(f"containers nested deeper than {MAX_DEPTH}")
        self.depth[id(target)] = depth
        self.charge(len(items) * _SLOT if isinstance(target, list) else len(items) // 2 * _ITEM)
        if isinstance(target, list):
            target.extend(items)
            return
        if len(items) % 2:
            raise ValueError("SETITEMS found an odd number of items")
        for key, value in zip(items[::2], items[1::2], strict=True):
            if type(key) not in (str, bytes, int):
                raise ValueError(f"a dict key must be str, bytes or int, got {type(key).__name__}")
            target[key] = value

    def tuple(self, items: list[Any]) -> tuple[Any, ...]:
        self.charge(len(items) * _SLOT)
        value = tuple(items)
        depth = 1
        for x in items:
            depth = max(depth, self.depth.get(id(x), 0) + 1)
            if isinstance(x, (_Global, _Dtype, _Array)) or id(x) in self.internal:
                self.internal.add(id(value))
        return self.container(value, depth)

    # ---- the calls numpy and Python write: recognised by shape, computed here
    def array(self, shape: Any, data: Any) -> np.ndarray:
        """:func:`uint8_array`, charged for the copy it makes of bytes (a bytearray is used in place)."""
        self.charge(_ARRAY + (len(data) if isinstance(data, bytes) else 0))
        return uint8_array(shape, data)

    def reduce(self, func: Any, args: Any) -> Any:
        if not isinstance(func, _Global) or not isinstance(args, tuple):
            raise ValueError(f"refused a call of {_repr.repr(func)}: only named globals are called")
        if func.tag == "encode" and len(args) == 2 and isinstance(args[0], str) and _is(args[1], "latin1"):
            self.charge(_HEADER + len(args[0]))
            try:
                return args[0].encode("latin-1")
            except UnicodeEncodeError:
                raise ValueError("_codecs.encode was given a string that is not latin-1") from None
        if func.tag == "bytes" and args == ():
            return b""
        if func.tag == "reconstruct" and len(args) == 3:
            cls, shape, typecode = args
            empty = isinstance(shape, tuple) and len(shape) == 1 and _is(shape[0], 0)
            if isinstance(cls, _Global) and cls.tag == "ndarray" and empty and _is(typecode, "b"):
                return _Array()
        if (
            func.tag == "dtype"
            and len(args) == 3
            and _is(args[0], "u1")
            and _is(args[1], 0)
            and _is(args[2], 1)
        ):
            return _Dtype()
        if func.tag == "frombuffer" and len(args) == 4:
            buf, dtype, shape, order = args
            if isinstance(dtype, _Dtype) and dtype.built and _is(order, "C"):
                return self.array(shape, buf)
        raise ValueError(
            f"refused {func.name}{_repr.repr(args)}: only dicts, lists, tuples, str, bytes, ints and "
            "C-ordered uint8 numpy arrays are read"
        )

    def build(self, obj: Any, state: Any) -> Any:
        if isinstance(obj, _Dtype) and not obj.built:
            same = isinstance(state, tuple) and len(state) == len(_U1_STATE)
            if not (same and all(_is(s, want) for s, want in zip(state, _U1_STATE, strict=True))):
                raise ValueError(
                    f"refused the dtype state {_repr.repr(state)}: only plain uint8 is read, which numpy "
                    f"writes as {_U1_STATE}"
                )
            obj.built = True
            return obj
        if isinstance(obj, _Array) and obj.value is None:
            if not (isinstance(state, tuple) and len(state) == 5):
                raise ValueError(f"refused the array state {_repr.repr(state)}: expected 5 items")
            version, shape, dtype, fortran, data = state
            if not (_is(version, 1) and isinstance(dtype, _Dtype) and dtype.built and _is(fortran, 0)):
                raise ValueError(
                    f"refused the array state {_repr.repr(state)}: only C-ordered uint8 arrays are read"
                )
            obj.value = self.array(shape, data)
            return obj.value
        raise ValueError(f"refused to set the state of {_repr.repr(obj)}: only a new uint8 array takes one")

    # ---- the opcode loop
    def run(self, data: bytes) -> Any:
        ops = pickletools.genops(data)
        while True:
            try:
                op, arg, pos = next(ops)
            except StopIteration:
                raise ValueError("the pickle ends before its STOP opcode") from None
            except Exception as err:  # a malformed file: genops says what (its message can be long)
                what = (str(err).splitlines() or [type(err).__name__])[0][:120]
                raise ValueError(f"not a readable pickle: {what}") from None
            try:
                if self.step(op.name, arg):
                    break
            except ValueError as err:
                raise ValueError(f"at byte {pos} ({op.name}): {err}") from None
        if len(self.stack) != 1 or self.marks:
            raise ValueError("the pickle does not end with exactly one value")
        result = self.stack[0]
        self.data_item(result)
        return result

    def step(self, name: str, arg: Any) -> bool:
        push = self.push
        if isinstance(arg, (str, bytes, bytearray)):  # parsed from the file: a new object of that size
            self.charge(_HEADER + len(arg))
        elif type(arg) is int and not -5 <= arg <= 256:  # CPython keeps one copy of each small int
            self.charge(_HEADER)
        if name in ("PROTO", "FRAME"):
            if name == "PROTO" and not _is_int(arg, 0, 1, 2, 3, 4, 5):
                raise ValueError(f"unknown pickle protocol {arg}")
        elif name == "STOP":
            return True
        elif name == "MARK":
            if len(self.marks) >= MAX_DEPTH:
                raise ValueError(f"MARKs nested deeper than {MAX_DEPTH}")
            self.marks.append(len(self.stack))
        elif name == "NONE":
            push(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            push(name == "NEWTRUE")
        elif name in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"):
            if not -_INT_LIMIT <= arg < _INT_LIMIT:
                raise ValueError("an integer does not fit in 64 bits")
            push(arg)
        elif name in ("STRING", "BINSTRING", "SHORT_BINSTRING"):  # Python 2 str: bytes (genops gives latin-1)
            push(arg.encode("latin-1"))
        elif name in ("BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
            push(arg)  # bytes, or a bytearray: numpy's protocol-5 array buffer
        elif name in ("UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"):
            push(arg)
        elif name in ("EMPTY_LIST", "EMPTY_DICT"):
            push(self.container([] if name == "EMPTY_LIST" else {}))
        elif name in ("LIST", "DICT"):
            items, value = self.pop_mark(), self.container([] if name == "LIST" else {})
            self.insert(value, items)
            push(value)
        elif name == "APPEND":
            item = self.pop()
            self.insert(self.top(), [item])
        elif name == "SETITEM":
            value, key = self.pop(), self.pop()
            self.insert(self.top(), [key, value])
        elif name in ("APPENDS", "SETITEMS"):
            items = self.pop_mark()
            self.insert(self.top(), items)
        elif name in ("EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
            n = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}.get(name)
            items = self.pop_mark() if n is None else [self.pop() for _ in range(n)][::-1]
            push(self.tuple(items))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not self.stack:
                raise ValueError("nothing to memoize")
            self.charge(_ITEM)
            self.memo[len(self.memo) if arg is None else arg] = self.stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in self.memo:
                raise ValueError(f"memo entry {arg} was never stored")
            value = self.memo[arg]
            # a list or dict seen twice could grow after it was nested; the batches never share one
            if isinstance(value, (list, dict)) or (isinstance(value, _Array) and value.value is None):
                raise ValueError(f"refused a second reference to a {type(value).__name__.strip('_')}")
            push(value.value if isinstance(value, _Array) else value)
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, qualname = arg.partition(" ")
            else:
                qualname, module = self.pop(), self.pop()
                if not (isinstance(module, str) and isinstance(qualname, str)):
                    raise ValueError("STACK_GLOBAL needs two str")
            full = f"{module}.{qualname}"
            if (module, qualname) not in _GLOBALS:
                raise ValueError(
                    f"refused the global {_repr.repr(full)}: a data pickle may name only numpy's array and "
                    "dtype rebuilders (and nothing named is run)"
                )
            push(_Global(_GLOBALS[module, qualname], full))
        elif name == "REDUCE":
            args, func = self.pop(), self.pop()
            push(self.reduce(func, args))
        elif name == "BUILD":
            state, obj = self.pop(), self.pop()
            push(self.build(obj, state))
        else:
            raise ValueError(f"refused the opcode {name}: a data pickle needs only plain values")
        return False


def loads(data: bytes, source: str, max_built: int | None = None) -> Any:
    """The value pickled in ``data``: dicts, lists, tuples, str, bytes, ints, None, bools and uint8 arrays.

    Python 2 strings are read as bytes (pickle's ``encoding="bytes"``). Nothing named in the file is
    imported or called. The values built may take at most ``BUDGET_PER_BYTE × len(data) + BUDGET_FLOOR``
    bytes, and at most ``max_built`` where the caller knows the content's size.

    Raises:
        ValueError: one line naming ``source``, the place in the file and what was refused.
    """
    budget = BUDGET_PER_BYTE * len(data) + BUDGET_FLOOR
    if max_built is not None:
        budget = min(budget, max_built)
    try:
        return _Reader(budget).run(data)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    except MemoryError:  # the budget keeps the reader's own share small; the machine may still be short
        raise ValueError(f"{source}: out of memory while reading a {len(data):,}-byte pickle") from None
