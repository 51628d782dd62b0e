import json
import struct

import numpy as np
import pytest

from leti.engine import format as fmt
from leti.engine.convert.from_cell import from_cell
from leti.engine.graph import Graph
from leti.errors import ConversionError, CorruptModelError
from tests.engine.conftest import RICH


@pytest.fixture
def model(tmp_path):
    g = from_cell(RICH, input_shape=(8, 8, 16), seed=3)
    return g, fmt.save(g, tmp_path / "m.leti")


def test_roundtrip_is_exact_and_zero_copy(model):
    g, path = model
    h = fmt.load(path)
    assert h.inputs == g.inputs and h.outputs == g.outputs
    assert [(n.op, n.inputs, n.outputs, n.attrs) for n in h.nodes] == [(n.op, n.inputs, n.outputs, n.attrs) for n in g.nodes]
    assert set(h.constants) == set(g.constants)
    for name, arr in h.constants.items():
        np.testing.assert_array_equal(arr, g.constants[name])
        assert arr.ctypes.data % 64 == 0  # aligned blob
        assert not arr.flags.writeable and not arr.flags.owndata  # a view over the mapping, not a copy
    assert h.metadata["hash"] == RICH.hash


def test_header_layout(model):
    _, path = model
    raw = path.read_bytes()
    magic, version = struct.unpack_from("<8sI", raw)
    assert magic == fmt.MAGIC and version == fmt.FORMAT_VERSION
    js_off, js_len, data_off, data_len = struct.unpack_from("<QQQQ", raw, 16)
    assert js_off == 128 and data_off % 64 == 0 and data_off + data_len == len(raw)
    doc = json.loads(raw[js_off:js_off + js_len])
    assert doc["format"] == "leti" and {"inputs", "outputs", "tensors", "nodes"} <= set(doc)


def _corrupt(path, offset, value: bytes):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(value)] = value
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("what, offset, value, message", [
    ("magic", 0, b"PK\x03\x04", "not a .leti model"),
    ("version", 8, struct.pack("<I", 99), "unsupported .leti format version 99"),
    ("json length", 24, struct.pack("<Q", 10 ** 9), "outside"),
    ("data byte", -5, b"\xff", "checksum mismatch"),
    ("json byte", 140, b"#", "checksum mismatch"),
])
def test_corruption_is_rejected_with_one_line(model, what, offset, value, message):
    _, path = model
    size = path.stat().st_size
    _corrupt(path, offset % size, value)
    with pytest.raises(CorruptModelError, match=message) as exc:
        fmt.load(path)
    assert "\n" not in str(exc.value)


def test_truncated_and_missing_files(model, tmp_path):
    _, path = model
    raw = path.read_bytes()
    (tmp_path / "t.leti").write_bytes(raw[:-100])
    with pytest.raises(CorruptModelError, match="truncated"):
        fmt.load(tmp_path / "t.leti")
    (tmp_path / "s.leti").write_bytes(raw[:50])
    with pytest.raises(CorruptModelError, match="shorter than"):
        fmt.load(tmp_path / "s.leti")
    with pytest.raises(CorruptModelError, match="cannot open"):
        fmt.load(tmp_path / "nope.leti")


def test_declared_shape_mismatch_and_bad_blob_bounds(tmp_path):
    g = from_cell(RICH, input_shape=(8, 8, 16))
    out = g.outputs[0]
    g.tensors[out].shape = (1, 8, 8, 17)
    fmt.save(g, tmp_path / "bad.leti")
    with pytest.raises(CorruptModelError, match="declared"):
        fmt.load(tmp_path / "bad.leti")


def test_unknown_op_lists_known_ones(tmp_path):
    g = Graph()
    g.add_tensor("x", (1, 4))
    g.add_tensor("y", (1, 4))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node("gelu_fancy", ["x"], ["y"])
    fmt.save(g, tmp_path / "u.leti")
    with pytest.raises(ConversionError, match="unsupported op 'gelu_fancy'.*conv2d"):
        fmt.load(tmp_path / "u.leti")


def test_checksum_can_be_skipped_but_structure_is_still_checked(model):
    _, path = model
    _corrupt(path, path.stat().st_size - 5, b"\xff")
    fmt.load(path, verify=False)  # weight bytes changed, structure intact
    _corrupt(path, 0, b"XXXX")
    with pytest.raises(CorruptModelError):
        fmt.load(path, verify=False)
