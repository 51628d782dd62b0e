"""Quantized models: the precision in ModelSpec, `leti generate --format tflite-int8,tflite-fp16,...`, ops left
in float, the quantization error against the float model, and the engine's refusal of quantized models."""

import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.device.conftest import run_leti

from leti.errors import DatasetError
from leti.models.export import Artifacts
from leti.models.quantize import float_ops, quantization_error, quantization_flags, quantized_tensors
from leti.models.tflite import read_ops
from leti.spaces.spec import ModelSpec
from leti.spaces.table_file import read_cell_table

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("quantize-generated")


def test_precision_is_part_of_the_spec_and_fp32_keeps_the_old_form():
    old = {"kind": "cell", "input_shape": [32, 32, 64], "channels": 64}
    fp32 = ModelSpec.from_dict(old)
    assert fp32.precision == "fp32" and fp32.to_dict() == old  # old files read and compare unchanged
    int8 = ModelSpec("cell", (32, 32, 64), 64, precision="int8")
    assert int8.to_dict() == {**old, "precision": "int8"} and int8 != fp32
    assert ModelSpec.from_dict(int8.to_dict()) == int8
    assert int8.describe().endswith("(64 channels, int8)") and "fp32" not in fp32.describe()
    net = ModelSpec("network", precision="fp16")
    assert ModelSpec.from_dict(net.to_dict()).precision == "fp16" and "fp16" in net.describe()
    with pytest.raises(DatasetError, match="unknown precision 'int4'; known: fp32, int8, fp16, dynamic"):
        ModelSpec(precision="int4")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Two cells written as fp32, int8, fp16 and dynamic-range .tflite by `leti generate` (one run)."""
    from typer.testing import CliRunner

    from leti.cli import app

    out = tmp_path_factory.mktemp("quant")
    res = CliRunner().invoke(app, ["generate", "--sample", "2", "--seed", "3", "--input-size", "8", "--channels",
                                   "4", "--format", "tflite-int8,tflite-fp16,tflite-dynamic,tflite", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (out / "generate.log").write_text(res.output)
    return out


def test_generate_writes_each_precision_and_records_it(generated):
    df, spec = read_cell_table(generated / "cells.parquet")
    # several precisions: the table stands for fp32 (plain tflite is among them) and lists the others
    assert spec.precision == "fp32"
    meta = pq.read_schema(generated / "cells.parquet").metadata[b"leti"]
    assert b'"precisions": ["int8", "fp16", "dynamic", "fp32"]' in meta
    # weights are seeded by the cell, so what stays in float is reproducible (here: nothing)
    assert list(df["hash"]) == ["d188470241c57ec2e48029720eee1f96", "4df874a3f2196ee8317c881ffc777bf0"]
    assert list(df["fully_quantized"]) == [True, True] and list(df["float_ops"]) == ["", ""]
    assert "all 2 int8 models are fully quantized" in (generated / "generate.log").read_text()
    for h in df["hash"]:
        i8 = read_ops(generated / "tflite-int8" / f"{h}.tflite")
        assert {o.name for o in i8} >= {"QUANTIZE", "DEQUANTIZE", "CONV_2D"}
        assert all(t.dtype == "INT8" for o in i8 if o.name == "CONV_2D" for t in o.inputs[:2])
        fp16 = quantized_tensors(generated / "tflite-fp16" / f"{h}.tflite")
        assert fp16 and {k for _, k, _ in fp16} == {"FLOAT16"}
        dyn = read_ops(generated / "tflite-dynamic" / f"{h}.tflite")
        assert all(o.inputs[0].dtype == "FLOAT32" for o in dyn if o.name == "CONV_2D")  # float activations
        assert quantized_tensors(generated / "tflite" / f"{h}.tflite") == []


def test_one_quantized_format_makes_an_int8_table(capsys, tmp_path):
    code, out, err = run_leti(capsys, "generate", "--sample", "1", "--seed", "3", "--input-size", "8", "--channels",
                              "4", "--format", "tflite-int8", "--out", tmp_path)
    assert code == 0, err
    _, spec = read_cell_table(tmp_path / "cells.parquet")
    assert spec.precision == "int8" and spec.to_dict()["precision"] == "int8"
    assert "all 1 int8 models are fully quantized" in out


def test_int8_calibration_is_seeded(nb101_space):
    cell = list(nb101_space.sample(1, seed=5))[0]
    spec = ModelSpec("cell", (8, 8, 4), 4, precision="int8")
    assert Artifacts(cell, spec).quantized_bytes("int8") == Artifacts(cell, spec).quantized_bytes("int8")
    # dynamic range: int8 weights (the converter quantizes weights of 1024 values and more), float activations
    dyn = read_ops(Artifacts(cell, ModelSpec("cell", (8, 8, 32), 32)).quantized_bytes("dynamic"))
    big = [o for o in dyn if o.name == "CONV_2D" and np.prod(o.inputs[1].shape) >= 1024]
    assert big and all(o.inputs[1].dtype == "INT8" and o.inputs[0].dtype == "FLOAT32" for o in big)


def test_ops_without_an_int8_kernel_are_reported():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from leti.models.quantize import convert_keras_quantized

    inp = keras.Input((8, 8, 4), batch_size=1)
    x = keras.layers.Conv2D(4, 3, padding="same")(inp)
    x = keras.layers.Lambda(lambda t: keras.ops.sin(t))(x)  # SIN: float kernel only
    model = keras.Model(inp, keras.layers.Conv2D(4, 1)(x))
    data = convert_keras_quantized(model, "int8", seed=1)
    assert float_ops(data) == ["SIN"]
    col, full, counts = quantization_flags([{"float_ops": ["SIN"]}, {"float_ops": []}, {"float_ops": None}])
    assert col == ["SIN", "", None] and full == [False, True, None] and counts == {"SIN": 1}


def test_quantization_error_against_the_float_model(generated):
    """int8 outputs agree with the float model within the quantization error (reported per model)."""
    df, _ = read_cell_table(generated / "cells.parquet")
    for h in df["hash"]:
        f32 = generated / "tflite" / f"{h}.tflite"
        e8 = quantization_error(f32, generated / "tflite-int8" / f"{h}.tflite")
        e16 = quantization_error(f32, generated / "tflite-fp16" / f"{h}.tflite")
        print(f"{h[:12]} int8: max abs {e8['max_abs']:.4f} of range {e8['range']:.3f} ({e8['rel']:.2%}); "
              f"fp16: {e16['rel']:.4%}")
        assert 0 < e8["rel"] < 0.1  # a few int8 steps of the output range (median 2.9% at 32x32x64, see the benchmark)
        assert e16["rel"] < 1e-2 and e16["rel"] < e8["rel"]
    same = quantization_error(f32, f32)
    assert same["max_abs"] == 0.0


def test_engine_refuses_quantized_models(capsys, generated, tmp_path):
    df, _ = read_cell_table(generated / "cells.parquet")
    h = df["hash"][0]
    for fmt, kind in (("tflite-int8", "INT8"), ("tflite-fp16", "FLOAT16")):
        code, out, err = run_leti(capsys, "engine", "convert", generated / fmt / f"{h}.tflite", "-o", tmp_path / "x.leti")
        assert code == 1 and err.count("\n") == 1, err
        assert err.startswith("error: ") and "a quantized model" in err and kind in err
        assert "the engine runs float32 models only until it has int8 kernels" in err
        assert "ops " in err and not (tmp_path / "x.leti").exists()
    code, out, err = run_leti(capsys, "engine", "convert", generated / "tflite" / f"{h}.tflite", "-o", tmp_path / "x.leti")
    assert code == 0 and (tmp_path / "x.leti").is_file()


def test_measure_refuses_int8_on_a_float_only_device(capsys, generated, tmp_path):
    code, out, err = run_leti(capsys, "measure", "--device", "engine", "--cells", generated / "cells.parquet",
                              "--precision", "int8", "--db", tmp_path / "e.sqlite")
    assert code == 1 and "int8 models exist only as .tflite" in err and err.count("\n") == 1
    assert not (tmp_path / "e.sqlite").exists()
    code, out, err = run_leti(capsys, "measure", "--device", "local", "--cells", generated / "cells.parquet",
                              "--precision", "int4", "--db", tmp_path / "e.sqlite")
    assert code != 0 and "unknown precision 'int4'; known: fp32, int8, fp16, dynamic" in err and err.count("\n") == 1


def test_float_reference_arrays_are_finite(generated):
    df, _ = read_cell_table(generated / "cells.parquet")
    e = quantization_error(generated / "tflite" / f"{df['hash'][0]}.tflite",
                           generated / "tflite-dynamic" / f"{df['hash'][0]}.tflite")
    assert np.isfinite(e["rel"]) and e["range"] > 0
