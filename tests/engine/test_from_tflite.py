"""TFLite models converted from Keras run on the engine with the interpreter's outputs (1e-4)."""

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from leti.engine import format as fmt
from leti.engine.convert.from_tflite import from_tflite
from leti.engine.session import Session
from leti.errors import ConversionError, CorruptModelError
from tests.engine.conftest import rel_err

ROOT = Path(__file__).resolve().parents[2]

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
from ai_edge_litert.interpreter import Interpreter  # noqa: E402

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("from-tflite-zoo")


def _convert(model) -> bytes:
    data = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    keras.backend.clear_session()
    return data


def _tflite_run(data: bytes, x: np.ndarray) -> np.ndarray:
    it = Interpreter(model_content=data)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _randomize_bn(model, rng):
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights([(rng.random(w.shape) + 0.5).astype(np.float32) for w in layer.get_weights()])


@pytest.fixture(scope="module")
def zoo():
    """Two small Keras models covering every op the TFLite translator supports from Keras."""
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), batch_size=1)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    y = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2)(x)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.ReLU(6.0)(y)
    z = keras.layers.Conv2D(16, 1)(y)
    a = keras.layers.Add()([y, z])
    m = keras.layers.MaxPooling2D(3, 1, padding="same")(a)
    v = keras.layers.AveragePooling2D(2, 2, padding="same")(a)
    c = keras.layers.Concatenate()([keras.layers.AveragePooling2D(2, 2, padding="same")(m), v])
    c = keras.layers.ZeroPadding2D(((1, 0), (0, 1)))(c)
    c = keras.layers.Conv2D(4, 3, strides=2, dilation_rate=1)(c)
    g = keras.layers.GlobalAveragePooling2D()(c)
    f = keras.layers.Dense(5)(g)
    f = keras.layers.Softmax()(f)
    m1 = keras.Model(inp, f)
    _randomize_bn(m1, rng)

    inp = keras.Input((10, 10, 4), batch_size=1)  # residual block with BN, dilation, 5x5, multiply, add of 3
    b = keras.layers.Conv2D(6, 5, padding="same", use_bias=False)(inp)
    b = keras.layers.BatchNormalization()(b)
    b = keras.layers.Activation("relu")(b)
    d = keras.layers.Conv2D(6, 3, padding="same", dilation_rate=2)(b)
    s = keras.layers.Conv2D(6, 1, strides=1)(inp)
    r = keras.layers.Add()([b, d, s])
    r = keras.layers.Multiply()([r, d])
    r = keras.layers.Conv2D(7, 3, strides=2, padding="valid", activation="relu6")(r)
    r = keras.layers.Reshape((-1,))(r)
    r = keras.layers.Dense(3, activation="relu")(r)
    m2 = keras.Model(inp, r)
    _randomize_bn(m2, rng)
    return {"convnet": (_convert(m1), (1, 12, 12, 3)), "resblock": (_convert(m2), (1, 10, 10, 4))}


@pytest.mark.parametrize("name", ["convnet", "resblock"])
def test_engine_matches_tflite(zoo, tmp_path, name):
    data, shape = zoo[name]
    g = from_tflite(data)
    path = fmt.save(g, tmp_path / f"{name}.leti")  # through the file format too
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = _tflite_run(data, x)
    for backends in (("cpu",), ("reference",)):
        out = Session(path, backends=backends).run(x)
        (y,) = out.values()
        assert y.shape == ref.shape
        assert rel_err(y, ref) < 1e-4, backends


def test_bad_tflite_inputs(zoo, tmp_path):
    with pytest.raises(CorruptModelError, match="not a TFLite flatbuffer"):
        from_tflite(b"\x00" * 64)
    with pytest.raises(CorruptModelError, match="cannot read"):
        from_tflite(tmp_path / "missing.tflite")
    data, _ = zoo["convnet"]
    with pytest.raises(CorruptModelError, match="malformed|not a TFLite"):
        from_tflite(data[:200])


def test_unsupported_ops_are_all_named(zoo):
    inp = keras.Input((4,), batch_size=1)
    h = keras.layers.Dense(3)(inp)
    out = keras.layers.Lambda(lambda t: keras.ops.sin(t) + keras.ops.cos(t))(h)
    data = _convert(keras.Model(inp, out))
    with pytest.raises(ConversionError, match=r"unsupported TFLite ops: COS, SIN \(supported: ABS, ADD"):
        from_tflite(data)


@pytest.mark.parametrize("name", ["convnet", "resblock"])
def test_weights_are_views_of_the_mapped_file_and_released_after_packing(zoo, tmp_path, name):
    """A ``.tflite`` path is mapped, not read: every weight (the transposed ones too) is a view of the mapping, none a
    private copy; a session releases the mapping's pages once it has packed them, and both what it runs and the
    weights read afterwards (faulted back from the file) are unchanged."""
    from leti.engine.memory import file_mapping, release_mapped_weights

    data, shape = zoo[name]
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(data)
    g = from_tflite(path)
    maps = [file_mapping(a) for a in g.constants.values()]
    assert None not in maps and len({id(m) for m in maps}) == 1
    before = {k: np.array(v) for k, v in g.constants.items()}
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    s = Session(g, backends=("cpu",)).resize()  # resize ends with the release
    (y,) = s.run(x).values()
    assert rel_err(y, _tflite_run(data, x)) < 1e-4
    assert release_mapped_weights(g.constants.values()) == 1
    assert all(np.array_equal(before[k], v) for k, v in g.constants.items())
    assert np.array_equal(next(iter(s.run(x).values())), y)
    assert release_mapped_weights([np.zeros(3, np.float32)]) == 0  # private memory: nothing to release


def test_the_segment_benchmark_times_both_runtimes_on_every_prefix(zoo, tmp_path, capsys):
    """benchmarks/bench_engine_segments.py: TFLite and the engine over the same prefixes of a model; one row per cut, the
    last the whole model, segments that add up to the whole."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("segments", ROOT / "benchmarks" / "bench_engine_segments.py")
    seg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seg)
    path = tmp_path / "convnet.tflite"
    path.write_bytes(zoo["convnet"][0])
    n = seg.operator_count(path.read_bytes())
    assert seg.main(["--model", str(path), "--step", "4", "--rounds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("<=")]
    cuts = [int(r[1]) for r in rows]
    assert cuts == sorted(set(list(range(4, n, 4)) + [n]))
    whole_tflite, whole_engine = float(rows[-1][2]), float(rows[-1][3])
    assert whole_tflite > 0 and whole_engine > 0
    assert sum(float(r[7]) for r in rows) == pytest.approx(whole_engine, abs=2e-3)
    with pytest.raises(SystemExit):
        seg.main(["--model", str(tmp_path / "missing.tflite")])


def test_the_cache_decay_benchmark_times_both_runtimes_after_every_gap(zoo, tmp_path, capsys):
    """benchmarks/bench_cache_decay.py: one row per runtime, the time with no gap and, per gap, the time and its
    difference; a gap it cannot read is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("decay", ROOT / "benchmarks" / "bench_cache_decay.py")
    decay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decay)
    path = tmp_path / "convnet.tflite"
    path.write_bytes(zoo["convnet"][0])
    t0 = time.perf_counter()
    decay.busy_wait(20)
    assert time.perf_counter() - t0 >= 0.02
    assert decay.main(["--model", str(path), "--gaps", "0,2", "--rounds", "2"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
            if line.split() and line.split()[0] in ("tflite", "engine")}
    assert set(rows) == {"tflite", "engine"}
    for cells in rows.values():
        base, after, extra = (float(v) for v in cells)
        assert base > 0 and after > 0 and extra == pytest.approx(after - base, abs=0.011)
    with pytest.raises(SystemExit):
        decay.main(["--model", str(path), "--gaps", "0,soon"])


def _bench_module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_ab_benchmark_times_both_settings_and_tflite_beside_a_competitor(tmp_path, capsys):
    """benchmarks/bench_engine_ab.py: a switch's two values on one model, paired, with TFLite in every pair and a
    competing process on the last core that is gone afterwards; a duty outside [0, 1) and an unknown switch refused."""
    chains = _bench_module("bench_layer_chains")
    path = tmp_path / "chain.tflite"
    path.write_bytes(chains.chain_tflite(*chains.parse_chain("8,16,p16,d1")))
    ab = _bench_module("bench_engine_ab")
    assert ab.main([str(path), "--setting", "set_step_waits", "--a", "true", "--b", "false", "--pairs", "4",
                    "--tflite", "--competitor", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "competitor 0.2" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("chain.tflite"))
    assert "bit-equal True" in line and float(line.split("paired a/tflite")[1].split()[0]) > 0
    means = line.split(" mean ")[1].split()
    assert means[0::2] == ["True", "False", "tflite"] and all(float(v) > 0 for v in means[1::2])
    assert subprocess.run(["pgrep", "-f", "duty \\* 0.01"], capture_output=True).returncode == 1  # no spinner left
    for bad in (["--competitor", "1.5"], ["--setting", "set_nothing"]):
        with pytest.raises(SystemExit):
            ab.main([str(path), "--setting", "set_step_waits", "--a", "1", "--b", "0", *bad])


def test_the_layer_chain_benchmark_times_both_runtimes_and_a_switched_engine(capsys):
    """benchmarks/bench_layer_chains.py: a chain's spec expands (repeats), a malformed one is refused with the reason;
    a tiny chain prints one row per thread count: both runtimes' milliseconds, their ratio and a switch's column."""
    chains = _bench_module("bench_layer_chains")
    assert chains.parse_chain("7,32,p16,d2*2") == (7, 32, [("p", 16), ("d", 2), ("p", 16), ("d", 2)])
    for bad in ("7,32", "7,32,x3", "7,32,p", "a,32,p16", "7,32,p16*two"):
        with pytest.raises(ValueError, match="chain"):
            chains.parse_chain(bad)
    assert chains.main(["--chain", "6,16,d1,p16", "--threads", "1", "--rounds", "2", "--switch", "dw_packed=0"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(" ") and "6,16" in line]
    assert len(rows) == 1
    _, thr, tfl, eng, ratio, switch = rows[0]
    assert thr == "1" and float(tfl) > 0 and float(eng) > 0 and float(ratio) > 0 and float(switch) > 0
    for bad in (["--chain", "6,16,q1"], ["--chain", "6,16,d1", "--threads", "one"], ["--chain", "6,16,d1", "--rounds", "0"],
                ["--chain", "6,16,d1", "--switch", "dw_packed"]):
        with pytest.raises(SystemExit):
            chains.main(bad)
    with pytest.raises(SystemExit):
        chains.main(["--chain", "6,16,d1", "--threads", "1", "--rounds", "1", "--switch", "no_such_switch=1"])


def test_the_fma_peak_benchmark_prints_a_rate_per_repeat_and_refuses_nonsense(capsys):
    """benchmarks/bench_fma_peak.py builds its loop with cc and prints one positive rate per repeat and their median."""
    peak = _bench_module("bench_fma_peak")
    assert peak.main(["--repeats", "3", "--iterations", "200000"]) == 0
    out = capsys.readouterr().out
    rates = [float(v) for v in out.split("GFLOP/s per repeat:")[1].splitlines()[0].split()]
    assert len(rates) == 3 and all(r > 0 for r in rates)
    assert float(out.split("FMA peak:")[1].split()[0]) == sorted(rates)[1]
    with pytest.raises(SystemExit):
        peak.main(["--repeats", "0"])
    # bench_engine_cpu.py prints the same figure before and after its rounds
    value, unit = _bench_module("bench_engine_cpu").fma_peak().split()
    assert float(value) > 0 and unit == "GFLOP/s"


def test_bench_median_interval_is_the_order_statistics_of_the_binomial_tail():
    interval = _bench_module("bench_engine_cpu").median_interval
    # 11 rounds: P(B <= 2) = 67 / 2048 <= 0.05 < P(B <= 3): the 3rd and the 9th of the sorted ratios
    assert interval([1.10, 0.90, 0.95, 1.00, 0.97, 1.02, 0.99, 1.05, 0.93, 0.98, 1.01]) == (0.95, 1.02)
    # few rounds: the whole range, never an empty or inverted interval
    assert interval([1.2, 0.8, 1.0]) == (0.8, 1.2)
    lo, hi = interval(np.linspace(0.9, 1.1, 41))
    assert 0.9 < lo < 1.0 < hi < 1.1 and lo == pytest.approx(2 - hi)


def test_bench_rewrites_pnnx_pad_layers_as_ncnn_padding(tmp_path):
    rewrite = _bench_module("bench_engine_cpu").ncnn_pads_as_padding
    pnnx = tmp_path / "m.pnnx.param"
    pnnx.write_text("7767517\n3 3\npnnx.Input in0 0 1 0\n"
                    "Pad Pad_1 1 1 0 1 pads=(0,0,3,2,0,0,1,4) value=0.0 #0=(1,3,8,8)f32 #1=(1,3,12,14)f32\n"
                    "nn.Conv2d conv_0 1 1 1 2 bias=True\n")
    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\nPad Pad_1 1 1 in0 1\nConvolution conv_0 1 1 1 out0 0=8\n")
    assert rewrite(param, pnnx) == 1
    lines = param.read_text().splitlines()
    # top 3, bottom 1, left 2, right 4, constant zero; the blob names and every other layer untouched
    assert lines[3] == "Padding Pad_1 1 1 in0 1 0=3 1=1 2=2 3=4 4=0 5=0"
    assert lines[:3] + lines[4:] == ["7767517", "3 3", "Input in0 0 1 in0", "Convolution conv_0 1 1 1 out0 0=8"]
    # a pad over the channels has no ncnn Padding form: refused, not silently dropped
    pnnx.write_text(pnnx.read_text().replace("pads=(0,0,3,2,0,0,1,4)", "pads=(0,1,0,0,0,1,0,0)"))
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\nPad Pad_1 1 1 in0 1\nConvolution conv_0 1 1 1 out0 0=8\n")
    with pytest.raises(RuntimeError, match="cannot express pads"):
        rewrite(param, pnnx)
