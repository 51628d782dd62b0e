"""Kernel detection of any model (issue 16): a model file or Keras model split into the kernels a runtime
runs, and the model-level contract ``leti predict --model`` / ``leti.predict_model_latency``."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import leti
from leti.errors import DatasetError
from leti.predict.kernels import fit_kernel_predictor
from leti.predict.kernels.split import FusionRules, split_model

ROOT = Path(__file__).resolve().parents[2]
FAST = {"n_members": 2, "n_estimators": 30, "max_depth": 3}


def leti_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "leti", *args], capture_output=True, text=True, cwd=ROOT)


def se_block_net(width: int = 16, res: int = 24):
    """conv+BN+ReLU, a depthwise conv with hard-swish, a squeeze-excite block, a residual add, a pool, a dense."""
    import keras
    from keras import layers

    x_in = keras.Input((res, res, 3))
    x = layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False)(x_in)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    y = layers.DepthwiseConv2D(3, padding="same")(x)
    y = layers.Activation("hard_swish")(y)
    s = layers.GlobalAveragePooling2D(keepdims=True)(y)
    s = layers.Conv2D(max(width // 4, 1), 1, activation="relu")(s)
    s = layers.Conv2D(width, 1, activation="hard_sigmoid")(s)
    y = layers.Multiply()([y, s])
    y = layers.Add()([x, y])
    y = layers.MaxPooling2D(2)(y)
    y = layers.GlobalAveragePooling2D()(y)
    return keras.Model(x_in, layers.Dense(10)(y), name=f"se_{width}_{res}")


@pytest.fixture(scope="module")
def se_net():
    return se_block_net()


def test_split_finds_the_kernels_xnnpack_runs(se_net):
    t = split_model(se_net, "tflite-xnnpack")
    kinds = list(t.kernel_type)
    # BN folded, ReLU fused into the first conv by the converter: one kernel, not three
    assert kinds[0] == "conv2d" and t.fused.iloc[0] == "relu" and "batch_norm" not in kinds
    assert {"depthwise_conv2d", "hard_swish", "mean", "mul", "add", "max_pool", "dense"} <= set(kinds)
    first = t.iloc[0]
    assert (first.input_h, first.input_c, first.output_h, first.output_c, first.kernel_h, first.stride) == \
        (24, 3, 12, 16, 3, 2)
    assert first.flops == 2 * 12 * 12 * 16 * 3 * 3 * 3
    dense = t[t.kernel_type == "dense"].iloc[0]
    assert (dense.input_c, dense.output_c) == (16, 10)
    se_mul = t[(t.kernel_type == "mul") & (t.n_inputs == 2)]
    assert len(se_mul) == 1 and se_mul.iloc[0].output_h == 12  # the excite scale over the full map
    assert list(t.kernel_index) == list(range(len(t))) and set(t.runtime) == {"tflite-xnnpack"}


def test_fusion_rules_decide_what_becomes_one_kernel(se_net):
    plain = split_model(se_net, FusionRules("x"))
    linked = split_model(se_net, FusionRules("x", {"depthwise_conv2d": ["hard_swish"], "conv2d": ["mul"]}))
    # two pairs become one kernel each: the dw conv + hard-swish, and the excite conv + its 1/6 scale (hard-sigmoid
    # lowered by the converter); the SE product does not join the dw conv (its output has a second reader)
    assert len(linked) == len(plain) - 2
    assert list(linked[linked.kernel_type == "conv2d"].fused) == ["relu", "relu", "relu+mul"]
    assert (linked.kernel_type == "mul").sum() == 1 and linked[linked.kernel_type == "mul"].n_inputs.iloc[0] == 2
    dw = linked[linked.kernel_type == "depthwise_conv2d"].iloc[0]
    assert dw.fused == "hard_swish" and "hard_swish" not in set(linked.kernel_type)
    gpu = split_model(se_net, "tflite-gpu")  # GPU delegate rules link element-wise followers
    assert len(gpu) < len(plain)
    assert FusionRules.from_dict(json.loads(json.dumps(linked_rules := FusionRules(
        "x", {"conv2d": ["add"]}, "measured").to_dict()))).to_dict() == linked_rules


def test_the_same_model_from_tflite_and_keras_splits_the_same(se_net, tmp_path):
    from leti.models.keras_import import keras_to_tflite

    path = tmp_path / "se.tflite"
    path.write_bytes(keras_to_tflite(se_net))
    a, b = split_model(se_net), split_model(path)
    cols = ["kernel_type", "input_h", "input_c", "output_h", "output_c", "kernel_h", "stride", "fused"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert set(b.model) == {"se"}


def synthetic_predictor(tmp_path, nets):
    """A kernel predictor fitted on the kernels of ``nets`` with a latency that grows with the work
    (a made-up law: what matters is that predictions follow it)."""
    rows = pd.concat([split_model(n) for n in nets], ignore_index=True)
    rows["latency_ms"] = 1e-3 + rows.flops / 2e7 + (rows.bytes_in + rows.bytes_out) / 5e7
    rows["device"] = "testhost"
    pred = fit_kernel_predictor(rows, **FAST)
    pred.save(tmp_path / "kp")
    return tmp_path / "kp", rows


def test_predict_model_latency_api_and_cli(tmp_path):
    # the training nets span the two predicted ones (an API test: the trees are not asked to extrapolate)
    nets = [se_block_net(w, r) for w, r in ((8, 16), (16, 24), (24, 32), (32, 32), (12, 24), (32, 44))]
    kp, rows = synthetic_predictor(tmp_path, nets)
    small, big = se_block_net(10, 20), se_block_net(28, 40)
    r_small, r_big = leti.predict_model_latency(small, kp), leti.predict_model_latency(big, kp)
    assert r_big.latency_ms > 2 * r_small.latency_ms  # ~4x the work
    assert r_small.low_ms <= r_small.latency_ms <= r_small.high_ms
    assert r_small.kernel_sum_ms == pytest.approx(r_small.kernels.predicted_ms.sum())
    law = split_model(big).eval("1e-3 + flops / 2e7 + (bytes_in + bytes_out) / 5e7").sum()
    assert r_big.latency_ms == pytest.approx(law, rel=0.5)
    # the CLI, from a model file: one line in ms, and --json with the per-kernel breakdown
    from leti.models.keras_import import keras_to_tflite

    f = tmp_path / "big.tflite"
    f.write_bytes(keras_to_tflite(big))
    p = leti_cli("predict", "--model", str(f), "--predictor", str(kp))
    assert p.returncode == 0, p.stderr
    ms = float(p.stdout.split()[0])
    assert ms == pytest.approx(r_big.latency_ms, rel=1e-4) and p.stdout.split()[1] == "ms"
    j = leti_cli("predict", "--model", str(f), "--predictor", str(kp), "--json")
    line = json.loads(j.stdout)
    assert line["latency_ms"] == pytest.approx(ms, rel=1e-4) and line["device"] == "testhost"
    assert len(line["kernels"]) == len(split_model(big)) and line["low_ms"] < ms < line["high_ms"]
    assert sum(k["predicted_ms"] for k in line["kernels"]) == pytest.approx(line["kernel_sum_ms"])
    assert line["outside_delegate"] == {} and "warning" not in j.stderr  # XNNPACK runs it whole
    # a node XNNPACK leaves to TFLite's own kernels (an uneven channel split: SPLIT_V) is named and the answer flagged
    import keras

    x = keras.Input((20, 20, 3), batch_size=1)
    a, b = keras.ops.split(keras.layers.Conv2D(7, 1)(x), [3], axis=-1)
    y = keras.layers.Concatenate()([keras.layers.Conv2D(4, 1)(a), keras.layers.Conv2D(4, 1)(b)])
    g = tmp_path / "split.tflite"
    g.write_bytes(keras_to_tflite(keras.Model(x, y)))
    s = leti_cli("predict", "--model", str(g), "--predictor", str(kp), "--json", "--allow-unknown")
    assert s.returncode == 0, s.stderr
    line = json.loads(s.stdout)
    assert line["outside_delegate"] == {"SPLIT_V": 1}
    # the kernels that node runs are marked (the split's two channel slices, one per output read), and none other
    assert [k["kernel_type"] for k in line["kernels"] if k["outside_delegate"]] == ["slice", "slice"]
    assert [k["kernel_type"] for k in line["kernels"] if not k["outside_delegate"]] == ["conv2d"] * 3 + ["concat"]
    assert f"warning: XNNPACK leaves 1 nodes of {g} to TFLite's own kernels (SPLIT_V x1)" in s.stderr
    assert leti.predict_model_latency(keras.Model(x, y), kp, allow_unknown=True).outside_delegate is None  # not a file


def test_model_bad_inputs_are_one_clear_line(tmp_path):
    nets = [se_block_net(w, r) for w, r in ((8, 16), (16, 24), (24, 32))]
    kp, _ = synthetic_predictor(tmp_path, nets)
    import keras
    from keras import layers

    from leti.models.keras_import import keras_to_tflite

    x = keras.Input((16, 16, 8))
    odd = keras.Model(x, layers.AveragePooling2D(2)(layers.Conv2D(8, 3, activation="sigmoid")(x)))
    f = tmp_path / "odd.tflite"
    f.write_bytes(keras_to_tflite(odd))
    p = leti_cli("predict", "--model", str(f), "--predictor", str(kp))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "avg_pool" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    ok = leti_cli("predict", "--model", str(f), "--predictor", str(kp), "--allow-unknown")
    assert ok.returncode == 0 and float(ok.stdout.split()[0]) > 0 and "avg_pool" in ok.stderr
    other = leti_cli("predict", "--model", str(f), "--predictor", str(kp), "--device", "pixel4", "--allow-unknown")
    assert other.returncode != 0 and "'testhost'" in other.stderr and "'pixel4'" in other.stderr
    missing = leti_cli("predict", "--model", str(tmp_path / "nope.onnx"), "--predictor", str(kp))
    assert missing.returncode != 0 and "no such model file" in missing.stderr
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x00garbage" * 50)
    bad = leti_cli("predict", "--model", str(junk), "--predictor", str(kp))
    assert bad.returncode != 0 and "junk.tflite" in bad.stderr and "Traceback" not in bad.stderr
    with pytest.raises(DatasetError, match="pixel4"):
        leti.predict_model_latency(odd, kp, allow_unknown=True, device="pixel4")


def test_a_quantized_model_is_refused(tmp_path):
    from leti.models.quantize import convert_keras_quantized

    nets = [se_block_net(w, r) for w, r in ((8, 16), (16, 24), (24, 32))]
    kp, _ = synthetic_predictor(tmp_path, nets)
    f = tmp_path / "q.tflite"
    f.write_bytes(convert_keras_quantized(se_block_net(8, 16), "int8"))
    p = leti_cli("predict", "--model", str(f), "--predictor", str(kp))
    assert p.returncode != 0 and "quantized" in p.stderr and "Traceback" not in p.stderr


def test_a_shortcut_add_fuses_from_either_side_as_the_engine_runs_it():
    """ResNet's identity block computes ``add(shortcut, conv)``: the engine adds the shortcut in the
    convolution's epilogue whichever side it is on, so its kernel split has one kernel per engine step."""
    import keras
    from keras import layers

    from leti.engine.convert import load_model
    from leti.engine.session import Session

    x_in = keras.Input((12, 12, 8))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(x_in)
    a = layers.Add()([x, layers.Conv2D(8, 3, padding="same")(x)])  # the conv on the right
    b = layers.Add()([layers.Conv2D(8, 1)(a), a])  # the conv on the left
    s = layers.GlobalAveragePooling2D(keepdims=True)(b)
    c = layers.Multiply()([b, layers.Conv2D(8, 1, activation="sigmoid")(s)])  # a broadcast scale: not fused
    net = keras.Model(x_in, layers.ReLU()(c))
    rules = FusionRules("leti-engine-cpu", {"conv2d": ["add"]}, "measured")
    t = split_model(net, rules)
    assert "add" not in set(t.kernel_type) and list(t.fused[t.kernel_type == "conv2d"]).count("add") == 2
    assert (t.kernel_type == "mul").sum() == 1 and t[t.kernel_type == "mul"].output_h.iloc[0] == 12
    s = Session(load_model(net), backends=("cpu",), threads=1)
    s.resize()
    assert [st.op for st in s.steps if st.op != "reshape"].count("add") == 0
    assert len([st for st in s.steps if st.op != "reshape"]) == len(t)
    # the engine's own pass fused them (passes.fuse_residual_adds), rule or not; XNNPACK runs them as kernels
    assert split_model(net, FusionRules("leti-engine-cpu")).equals(t.assign(model=t.model))
    assert (split_model(net, "tflite-xnnpack").kernel_type == "add").sum() == 2


def test_an_add_of_convolutions_that_end_in_a_relu_stays_a_kernel_on_the_engine():
    """An NB101 cell sums convolutions that end in a ReLU: the engine cannot add in their epilogues
    (``passes.fuse_residual_adds`` takes a convolution without an activation of its own) and runs the adds as steps of
    their own, so a measured ``conv2d: add`` rule must not fuse them (session 33: the split did, the 18 adds of a
    16-channel NB101 network were priced at nothing and those networks came out 10-14 % under)."""
    import keras
    from keras import layers

    from leti.engine.convert import load_model
    from leti.engine.session import Session

    x_in = keras.Input((16, 16, 8))
    a = layers.Conv2D(8, 1, activation="relu")(x_in)
    b = layers.Conv2D(8, 3, padding="same", activation="relu")(x_in)
    y = layers.Add()([a, b])  # two ReLU convolutions summed: a step of its own
    z = layers.Add()([layers.Conv2D(8, 3, padding="same")(y), y])  # a shortcut: in the convolution's epilogue
    net = keras.Model(x_in, layers.GlobalAveragePooling2D()(z))
    t = split_model(net, FusionRules("leti-engine-cpu", {"conv2d": ["add"]}, "measured"))
    steps = [st for st in Session(load_model(net), backends=("cpu",), threads=1).resize().steps
             if not st.execution.alias]
    assert list(t.kernel_type) == [{"fully_connected": "dense"}.get(st.op, st.op) for st in steps]
    assert (t.kernel_type == "add").sum() == 1 and t.n_inputs[t.kernel_type == "add"].iloc[0] == 2
    fused = t[t.fused.str.contains("add")]
    assert len(fused) == 1 and fused.input_c.iloc[0] == 8 and fused.kernel_h.iloc[0] == 3
    # its bytes in: the input map and the shortcut it adds
    assert fused.bytes_in.iloc[0] == 2 * 16 * 16 * 8 * 4
