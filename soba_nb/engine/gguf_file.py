"""Reading GGUF files (versions 2 and 3) without llama.cpp: metadata, tensor infos, tensors.

Layout (ggml's `docs/gguf.md`), little-endian: header (magic `GGUF`, uint32 version, uint64
tensor and key-value counts); key-values (string key, uint32 type, value); tensor infos (name,
uint32 n_dims, uint64 ne[n_dims] innermost first, uint32 ggml type, uint64 offset); padding to
`general.alignment`; tensor data. Strings are a uint64 length and UTF-8; arrays a uint32
element type, a uint64 count, the elements. Parsed with `struct` on an mmap (SmolLM2: ~0.05 s;
`gguf.GGUFReader` takes ~3 s building a numpy view per field part), checking every count and
length against the bytes left before allocating, so a damaged file is one `GGUFError` line.
Tensors are read one at a time through `np.memmap` and `gguf.quants.dequantize`.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8  # arrays may hold arrays; deeper is taken for damage
MIN_KV_BYTES = MIN_ARRAY_BYTES = 8 + 4  # key length + value type; element type + count
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dimension, type, offset
QUOTED_NAME_CHARS = 60  # longer keys and tensor names are cut short in error messages

_T = GGUFValueType
_FORMATS: dict[int, str] = {
    _T.UINT8: "B", _T.INT8: "b", _T.UINT16: "H", _T.INT16: "h", _T.UINT32: "I", _T.INT32: "i",
    _T.FLOAT32: "f", _T.BOOL: "?", _T.UINT64: "Q", _T.INT64: "q", _T.FLOAT64: "d",
}  # fmt: skip
_SCALARS = {value_type: struct.Struct("<" + code) for value_type, code in _FORMATS.items()}
_ARRAY_DTYPES = {value_type: np.dtype("<" + code) for value_type, code in _FORMATS.items()}
_ARRAY_DTYPES[_T.BOOL] = np.dtype(np.uint8)  # any non-zero byte is true, as in llama.cpp
_U64 = _SCALARS[_T.UINT64]
_HEADER = struct.Struct("<4sIQQ")
# ggml type → (elements per block, bytes per block)
_QUANT_SIZES: dict[int, tuple[int, int]] = {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}
_Q = GGMLQuantizationType
_PLAIN_DTYPES: dict[int, str] = {
    _Q.F32: "<f4", _Q.F16: "<f2", _Q.F64: "<f8", _Q.I8: "<i1", _Q.I16: "<i2", _Q.I32: "<i4",
    _Q.I64: "<i8",
}  # fmt: skip
"""Unquantized types: read as they are, cast to float32."""


class GGUFError(ValueError):
    """A file that is not a readable GGUF; the message is one line naming the file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    """numpy order, outermost first: (ne1, ne0) for a matrix, i.e. (rows, columns)."""
    ggml_type: int
    """A `gguf.GGMLQuantizationType` value."""
    offset: int
    """Absolute byte offset of the tensor's data in the file."""
    n_bytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    """Scalars as Python int/float/bool/str, arrays as lists (strings decoded as UTF-8)."""
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        architecture = self.metadata.get("general.architecture")
        if not isinstance(architecture, str):
            raise GGUFError(f"{self.path}: no general.architecture string in the metadata")
        return architecture

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to a C-contiguous float32 array of `TensorInfo.shape`."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: no tensor named {_quote(name)}")
        if info.n_bytes == 0:  # a dimension of 0: nothing to map
            return np.zeros(info.shape, np.float32)
        try:
            raw = np.memmap(self.path, np.uint8, "r", offset=info.offset, shape=(info.n_bytes,))
        except (OSError, ValueError) as exc:
            raise GGUFError(f"{self.path}: cannot map tensor {_quote(name)}: {exc}") from None
        plain = _PLAIN_DTYPES.get(info.ggml_type)
        if plain is not None:
            return np.ascontiguousarray(raw.view(plain).reshape(info.shape), dtype=np.float32)
        from gguf.quants import dequantize  # only quantized tensors need it

        qtype = GGMLQuantizationType(info.ggml_type)
        try:
            values = dequantize(raw.reshape(*info.shape[:-1], -1), qtype)
        except NotImplementedError:
            raise GGUFError(f"{self.path}: cannot dequantize {qtype.name} ({name})") from None
        return np.ascontiguousarray(values.reshape(info.shape), dtype=np.float32)


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """The metadata and tensor infos of a GGUF file; tensor data waits for `tensor()`."""
    file_path = Path(path)
    with _mapped(file_path) as data:
        cursor = _Cursor(data, file_path)
        tensor_count, kv_count = _read_header(cursor)
        metadata: dict[str, Any] = {}
        for index in range(kv_count):
            key = cursor.string(f"key {index}")
            value_type = cursor.scalar(_T.UINT32, f"the type of {_quote(key)}")
            if key in metadata:
                raise cursor.fail(f"the key {_quote(key)} appears twice")
            metadata[key] = cursor.value(value_type, f"the value of {_quote(key)}")
        alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise cursor.fail(f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two")
        infos = [_read_tensor_info(cursor, index) for index in range(tensor_count)]
        tensors = _place_tensors(cursor, infos, alignment)
    return GGUFFile(file_path, metadata, tensors)


def _quote(name: str) -> str:
    """A key or tensor name for a one-line message, however damaged it is."""
    return repr(name if len(name) <= QUOTED_NAME_CHARS else name[:QUOTED_NAME_CHARS] + "…")


class _Cursor:
    """Bounds-checked little-endian reads through the file's bytes."""

    def __init__(self, data: mmap.mmap, path: Path):
        self.data, self.path, self.size, self.position = data, path, len(data), 0

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def require(self, n_bytes: int, what: str) -> None:
        """Refuses a read past the end of the file, before anything is allocated for it."""
        if n_bytes > self.size - self.position:
            raise self.fail(
                f"truncated or damaged: {what} needs {n_bytes} bytes at byte {self.position}, "
                f"the file has {self.size}"
            )

    def take(self, n_bytes: int, what: str) -> int:
        """The start of the next `n_bytes`, which are then consumed."""
        self.require(n_bytes, what)
        self.position += n_bytes
        return self.position - n_bytes

    def scalar(self, value_type: int, what: str) -> Any:
        fmt = _SCALARS[value_type]
        return fmt.unpack_from(self.data, self.take(fmt.size, what))[0]

    def string(self, what: str) -> str:
        length = self.scalar(_T.UINT64, what)
        start = self.take(length, what)
        return self.data[start : start + length].decode("utf-8", errors="replace")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings: a vocabulary's hot loop, so it works on locals."""
        self.require(count * _U64.size, what)  # each string needs at least its length
        data, size, position, unpack = self.data, self.size, self.position, _U64.unpack_from
        decoded: list[str] = []
        append = decoded.append
        try:
            for _ in range(count):
                start = position + _U64.size
                position = start + unpack(data, position)[0]
                if position > size:
                    break
                append(data[start:position].decode("utf-8", errors="replace"))
        except struct.error:  # the length itself is cut off
            pass
        if len(decoded) < count:
            raise self.fail(f"truncated or damaged: string {len(decoded)} of {what} is cut off")
        self.position = position
        return decoded

    def value(self, value_type: int, what: str, depth: int = 0) -> Any:
        if value_type in _SCALARS:
            return self.scalar(value_type, what)
        if value_type == _T.STRING:
            return self.string(what)
        if value_type != _T.ARRAY:
            raise self.fail(f"unknown value type {value_type} in {what}")
        if depth >= MAX_ARRAY_NESTING:
            raise self.fail(f"arrays nested more than {MAX_ARRAY_NESTING} deep in {what}")
        element_type = self.scalar(_T.UINT32, what)
        count = self.scalar(_T.UINT64, what)
        if element_type == _T.STRING:
            return self.strings(count, what)
        if element_type in _SCALARS:
            start = self.take(count * _SCALARS[element_type].size, what)
            items = np.frombuffer(self.data[start : self.position], _ARRAY_DTYPES[element_type])
            return (items != 0).tolist() if element_type == _T.BOOL else items.tolist()
        self.require(count * MIN_ARRAY_BYTES, what)
        return [self.value(element_type, what, depth + 1) for _ in range(count)]


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    # Non-blocking, so that a FIFO given by mistake is refused instead of waited on.
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise GGUFError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        status = os.fstat(descriptor)
        if stat.S_ISDIR(status.st_mode):
            raise GGUFError(f"{path}: is a directory, not a GGUF file")
        if not stat.S_ISREG(status.st_mode):
            raise GGUFError(f"{path}: is not a regular file")
        if status.st_size < _HEADER.size:
            raise GGUFError(f"{path}: not a GGUF file ({status.st_size} bytes, too short)")
        try:
            data = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)  # keeps its own descriptor
        except (OSError, ValueError) as exc:
            raise GGUFError(f"{path}: cannot map the file: {exc}") from None
    finally:
        os.close(descriptor)
    with data:
        yield data


def _read_header(cursor: _Cursor) -> tuple[int, int]:
    magic, version, tensor_count, kv_count = _HEADER.unpack_from(cursor.data, 0)
    cursor.take(_HEADER.size, "the header")
    if magic != MAGIC:
        raise cursor.fail(f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    if version not in SUPPORTED_VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS:
            raise cursor.fail("a big-endian GGUF file; only little-endian files are read")
        raise cursor.fail(f"GGUF version {version} is not supported (only 2 and 3)")
    minimum = kv_count * MIN_KV_BYTES + tensor_count * MIN_TENSOR_INFO_BYTES
    cursor.require(minimum, f"{kv_count} key-values and {tensor_count} tensor infos")
    return tensor_count, kv_count


# name, dimensions innermost first (ne0, ne1, …), ggml type, offset in the data section
_RawTensorInfo = tuple[str, tuple[int, ...], int, int]


def _read_tensor_info(cursor: _Cursor, index: int) -> _RawTensorInfo:
    name = cursor.string(f"the name of tensor {index}")
    what = f"the info of tensor {_quote(name)}"
    n_dims = cursor.scalar(_T.UINT32, what)
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.fail(f"tensor {_quote(name)} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = struct.unpack_from(f"<{n_dims}Q", cursor.data, cursor.take(n_dims * _U64.size, what))
    ggml_type = cursor.scalar(_T.UINT32, what)
    return name, dims, ggml_type, cursor.scalar(_T.UINT64, what)


def _place_tensors(
    cursor: _Cursor, infos: list[_RawTensorInfo], alignment: int
) -> dict[str, TensorInfo]:
    data_start = -(-cursor.position // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, dims, ggml_type, offset in infos:
        quoted = _quote(name)
        if ggml_type not in _QUANT_SIZES:
            raise cursor.fail(f"tensor {quoted} has an unknown ggml type {ggml_type}")
        block_size, block_bytes = _QUANT_SIZES[ggml_type]
        if dims[0] % block_size:
            raise cursor.fail(f"tensor {quoted}: rows of {dims[0]} are not whole blocks")
        if offset % alignment:
            raise cursor.fail(f"tensor {quoted}: offset {offset} is not {alignment}-aligned")
        n_bytes = math.prod(dims) // block_size * block_bytes
        start = data_start + offset
        if start + n_bytes > cursor.size:
            raise cursor.fail(
                f"truncated or damaged: tensor {quoted} needs bytes {start} to "
                f"{start + n_bytes}, the file has {cursor.size}"
            )
        if name in tensors:
            raise cursor.fail(f"the tensor {quoted} appears twice")
        tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, start, n_bytes)
    return tensors
