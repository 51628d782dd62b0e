"""Any-model prediction on the local CPU (issue 16): the GEMM tiling features, predictors saved with the older
feature list, the overhead's weights (cache) term, and the weight-heavy calibration chains a continued build
adds."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leti.models.kernel_models import expected_row
from leti.predict.kernels.build import plan_calibration
from leti.predict.kernels.build_store import BuildStore
from leti.predict.kernels.calibration import calibration_chains, chain_ok
from leti.predict.kernels.features import FEATURES, FEATURES_V1, kernel_features
from leti.predict.kernels.model import KernelLatencyPredictor, load_kernel_predictor
from leti.predict.kernels.overhead import SCALED, Overhead, model_aggregates
from leti.predict.kernels.predictor import KernelRegressors
from leti.predict.kernels.schema import normalize
from tests.device.conftest import run_leti

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "datasets" / "kernels_local_cpu.parquet"
FAST = {"n_members": 2, "n_estimators": 30, "max_depth": 3}


def _conv(cout: int, pixels_side: int = 7, cin: int = 16) -> dict:
    return {"model": f"c{cout}", "kernel_type": "conv2d", "input_h": pixels_side, "input_w": pixels_side,
            "input_c": cin, "output_h": pixels_side, "output_w": pixels_side, "output_c": cout, "kernel_h": 1,
            "kernel_w": 1}


def test_tiling_features_count_the_padded_tiles():
    t = normalize(pd.DataFrame([_conv(9), _conv(16), _conv(17)]), "t")
    x = pd.DataFrame(kernel_features(t), columns=FEATURES)
    # 9 and 16 output channels fill the same two 8-wide tiles; 17 needs a third, and 16-wide tiles: one vs two
    assert x.log_flops_tile4x8[0] == pytest.approx(x.log_flops_tile4x8[1])
    assert x.log_flops_tile4x8[2] == pytest.approx(x.log_flops_tile4x8[1] + np.log(1.5))
    assert x.log_flops_tile7x16[0] == pytest.approx(x.log_flops_tile7x16[1])
    assert x.log_flops_tile7x16[2] == pytest.approx(x.log_flops_tile7x16[1] + np.log(2))
    assert list(x.out_c_mod8) == [1, 0, 1] and list(x.out_c_mod16) == [9, 0, 1]
    assert x.log_pixels[0] == pytest.approx(np.log(49)) and list(x.output_w) == [7, 7, 7]
    # the older list is a prefix: the same columns
    np.testing.assert_array_equal(kernel_features(t, FEATURES_V1), kernel_features(t)[:, : len(FEATURES_V1)])


@pytest.fixture(scope="module")
def conv_slice() -> pd.DataFrame:
    t = pd.read_parquet(KERNELS)
    return t[t.kernel_type.isin(["conv2d", "add"])].groupby("kernel_type").head(60).reset_index(drop=True)


def test_a_predictor_saved_with_the_older_features_loads_and_predicts_the_same(conv_slice, tmp_path, capsys):
    old = KernelRegressors(**FAST)
    old.features_ = FEATURES_V1  # what predictors fitted before the tiling features saved
    old.fit(conv_slice)
    KernelLatencyPredictor(old, Overhead(), "local", "tflite-xnnpack", "float").save(tmp_path / "old")
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert manifest["kernels"]["features"] == list(FEATURES_V1)
    back = load_kernel_predictor(tmp_path / "old")
    assert back.regressors.features_ == FEATURES_V1
    np.testing.assert_allclose(back.predict_kernels(conv_slice).predicted_ms, old.predict(conv_slice)[0], rtol=1e-5)
    new = KernelRegressors(**FAST).fit(conv_slice)
    KernelLatencyPredictor(new, Overhead(), "local", "tflite-xnnpack", "float").save(tmp_path / "new")
    assert load_kernel_predictor(tmp_path / "new").regressors.features_ == FEATURES
    # a feature list this LETI does not compute: one line through the CLI, the folder untouched
    manifest["kernels"]["features"] = list(reversed(FEATURES_V1))
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    table = tmp_path / "k.parquet"
    conv_slice.to_parquet(table, index=False)
    code, _, err = run_leti(capsys, "predict", "--kernels", str(table), "--predictor", str(tmp_path / "old"),
                            "--out", str(tmp_path / "pred.parquet"))
    assert code == 1 and err.strip().splitlines() == [
        f"error: {tmp_path / 'old'}: the predictor's kernel features differ from this LETI's"]
    assert not (tmp_path / "pred.parquet").exists()


def test_overhead_learns_the_weights_streaming_cost():
    rng = np.random.default_rng(0)
    rows = []
    for m in range(30):
        for k in range(int(rng.integers(3, 9))):
            rows.append({**_conv(int(rng.choice([32, 64, 256])), int(rng.choice([1, 2, 7]))), "model": f"m{m}",
                         "bytes_weights": float(rng.uniform(0, 8e6)), "bytes_out": 1e5})
    table = normalize(pd.DataFrame(rows), "t")
    ms = rng.uniform(0.05, 1.0, len(table))
    agg = model_aggregates(table, ms)
    assert agg.weights_mb.to_numpy() == pytest.approx(table.groupby("model", sort=False).bytes_weights.sum() / 1e6)
    assert set(agg.columns) >= {"sum_ms", "bytes_out_mb", "weights_mb", "stream_mb", "n:conv2d"}
    truth = agg.sum_ms + 0.03 * agg.weights_mb  # 30 GB/s of weights streamed in per inference
    o = Overhead().fit(agg, truth.to_numpy())
    coef = dict(zip(o.terms, o.coef))
    assert o.terms == ["sum_ms", "one", "bytes_out_mb", "weights_mb"]  # the simplest option that explains it
    assert coef["weights_mb"] == pytest.approx(0.03, rel=1e-3)
    assert coef["sum_ms"] == pytest.approx(1.0, rel=1e-3) and o.resid_std < 1e-3
    np.testing.assert_allclose(o.predict(agg), truth, rtol=1e-3)
    # weights read once per output pixel (a GEMV's): the per-pixel term is the one chosen
    pixels = (table.output_h * table.output_w).to_numpy()
    stream = (table.bytes_weights / pixels).groupby(table.model, sort=False).sum() / 1e6
    assert agg.stream_mb.to_numpy() == pytest.approx(stream.loc[agg.index].to_numpy())
    o = Overhead().fit(agg, (agg.sum_ms + 0.5 * agg.stream_mb).to_numpy())
    assert o.terms[-1] == "stream_mb" and dict(zip(o.terms, o.coef))["stream_mb"] == pytest.approx(0.5, rel=1e-3)
    # latency that is the kernels' sum with noise: no cache term and no per-type counts enter
    noisy = agg.sum_ms.to_numpy() * np.exp(rng.normal(0, 0.05, len(agg)))
    o = Overhead().fit(agg, noisy)
    assert o.terms == ["sum_ms", "one", "bytes_out_mb"] and 0.02 < o.resid_std < 0.1
    # an overhead saved before the term existed keeps its own terms: the weights do not enter
    older = Overhead(["sum_ms", "one", "bytes_out_mb"], [1.0, 0.0, 0.0], 0.1, 17)
    np.testing.assert_allclose(older.predict(agg), agg.sum_ms)


def test_overhead_scales_the_sum_by_the_log_of_the_weights_and_stays_below_a_per_mb_cost_far_past_them():
    rng = np.random.default_rng(1)
    rows = []
    for m in range(40):
        for k in range(int(rng.integers(3, 9))):
            rows.append({**_conv(64, int(rng.choice([7, 14]))), "model": f"m{m}",
                         "bytes_weights": float(rng.uniform(0, 6e6)), "bytes_out": 1e5})
    table = normalize(pd.DataFrame(rows), "t")
    agg = model_aggregates(table, rng.uniform(0.05, 1.0, len(table)))
    assert agg[SCALED].to_numpy() == pytest.approx(agg.sum_ms * np.log1p(agg.weights_mb))
    truth = agg.sum_ms * (0.95 + 0.04 * np.log1p(agg.weights_mb))  # a share of the kernels' time, growing with weights
    o = Overhead().fit(agg, truth.to_numpy())
    coef = dict(zip(o.terms, o.coef))
    assert SCALED in o.terms and not any(t.startswith("evicted") or t == "weights_mb" for t in o.terms)
    assert coef[SCALED] == pytest.approx(0.04, rel=1e-2) and coef["sum_ms"] == pytest.approx(0.95, rel=1e-2)
    # a model with 20x the networks' weights: priced by the log it was fitted with, not per MB
    big = normalize(pd.DataFrame([{**_conv(64, 7), "model": "big", "bytes_weights": 500e6, "bytes_out": 1e5}]), "t")
    one = model_aggregates(big, np.array([2.0]))
    assert o.predict(one)[0] == pytest.approx(2.0 * (0.95 + 0.04 * np.log1p(500.0)), rel=2e-2)


def _weights_mb(steps) -> float:
    total = 0.0
    for c in steps:
        r = expected_row(c)
        if r["kernel_type"] in ("conv2d", "depthwise_conv2d", "grouped_conv2d", "dense"):
            total += 4 * r["output_c"] * (r["kernel_h"] * r["kernel_w"] * r["input_c"] / r["groups"] + 1)
    return total / 1e6


def test_every_second_calibration_chain_is_weight_heavy():
    types = ["conv2d", "depthwise_conv2d", "add", "relu", "mean", "dense"]
    weights = {t: 1.0 / len(types) for t in types}
    chains = calibration_chains(types, weights, 12, seed=5)
    assert len(chains) == 12 and all(chain_ok(c) for c in chains)
    again = calibration_chains(types, weights, 12, seed=5)
    assert [[s.to_dict() for s in c] for c in chains] == [[s.to_dict() for s in c] for c in again]
    light, heavy = [_weights_mb(c) for c in chains[0::2]], [_weights_mb(c) for c in chains[1::2]]
    assert np.median(heavy) > 5 * np.median(light) and max(heavy) > 4.0  # megabytes, as late network stages
    assert min(chains[1::2], key=lambda c: c[0].input_h)[0].input_h <= 14


def test_a_continued_build_plans_only_the_missing_calibration_chains(tmp_path):
    types = ["conv2d", "relu", "mean", "dense"]
    weights = {t: 0.25 for t in types}
    with BuildStore(tmp_path / "kernels.sqlite") as store:
        assert plan_calibration(store, types, weights, 4, seed=1) == 4
        first = {r[0]: r[1] for r in store.db.execute("SELECT name, config FROM items WHERE kind='calibration'")}
        assert plan_calibration(store, types, weights, 4, seed=1) == 0  # as many as asked: nothing new
        assert plan_calibration(store, types, weights, 3, seed=1) == 0
        assert plan_calibration(store, types, weights, 7, seed=1) == 3
        after = {r[0]: r[1] for r in store.db.execute("SELECT name, config FROM items WHERE kind='calibration'")}
    assert sorted(after) == [f"calib-{i:03d}" for i in range(7)]
    assert all(after[n] == c for n, c in first.items())  # those planned before are kept as they were


def test_a_round_is_planned_type_by_type_in_turn():
    from leti.predict.kernels.build import interleave

    plan = interleave([["a1", "a2", "a3"], ["b1"], ["c1", "c2"]])
    assert plan == ["a1", "b1", "c1", "a2", "c2", "a3"]
    # cut after four items (the budget ran out): every type got its most uncertain kernel measured
    assert {p[0] for p in plan[:3]} == {"a", "b", "c"}


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_kernels_zoo", ROOT / "benchmarks" / "bench_kernels_zoo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_zoo_benchmark_scale_follows_the_campaign_clock(tmp_path):
    bench = _bench_module()
    rows = pd.DataFrame({"model": ["a.tflite", "a.tflite", "b.tflite", "b.tflite"], "ratio": [0.5, 0.7, 2.0, 2.0],
                         "corrected_ms": [2.0, 2.8, 8.0, 8.0], "mean_ms": [9.0, 9.0, 9.0, 9.0], "ref_ms": 4.0})
    data = tmp_path / "zoo.parquet"
    rows.to_parquet(data)
    side = {"protocol": {"clock": "cpu"}, "reference_model": "ref.tflite"}
    (tmp_path / "zoo.device.json").write_text(json.dumps(side))
    ms, how = bench.measured_latency(data, tmp_path, "auto")
    # a CPU-clock campaign: corrected_ms is on the kernels' scale already (the reference is not re-timed)
    assert ms.to_dict() == {"a.tflite": pytest.approx(2.4), "b.tflite": pytest.approx(8.0)}
    assert how == "the export's corrected_ms (cpu clock campaign)"
    # --reference-ms: the ratios on another campaign's reference time
    ms, how = bench.measured_latency(data, tmp_path, "auto", reference_ms=5.0)
    assert ms.to_dict() == {"a.tflite": pytest.approx(3.0), "b.tflite": pytest.approx(10.0)}
    assert "5.0000 ms (given" in how and "4.0000 ms" in how
    # delegation: a model XNNPACK left a node of to TFLite's own kernels in any row is partly delegated
    rows.assign(fully_delegated=[True, False, True, True]).to_parquet(data)
    other = tmp_path / "zoo2.parquet"
    pd.DataFrame({"model": ["b.tflite", "c.tflite"], "fully_delegated": [True, False]}).to_parquet(other)
    assert bench.delegation([data, other]).to_dict() == {"a.tflite": False, "b.tflite": True, "c.tflite": False}
    rows.to_parquet(data)  # a campaign without the column says nothing
    assert bench.delegation([data]).empty
    # the dev/test split: fixed by the file name, about 30 % dev
    names = [f"m{i}.tflite" for i in range(400)]
    split = [bench.zoo_split(n) for n in names]
    assert split == [bench.zoo_split(n) for n in names] and 0.22 < split.count("dev") / 400 < 0.38


def test_overhead_on_networks_learns_a_scale_per_kernel_type_and_a_saving_per_kernel():
    rng = np.random.default_rng(3)
    rows = []
    for m in range(60):
        for k in range(int(rng.integers(5, 40))):
            t = str(rng.choice(["conv2d", "grouped_conv2d", "add"], p=[0.5, 0.2, 0.3]))
            rows.append({**_conv(32), "model": f"n{m}", "kernel_type": t, "bytes_weights": 1e4, "bytes_out": 1e4})
    table = normalize(pd.DataFrame(rows), "t")
    size = np.exp(rng.uniform(np.log(0.5), np.log(10), 60))  # small and large networks
    ms = rng.uniform(0.01, 0.1, len(table)) * size[table.model.str[1:].astype(int).to_numpy()]
    agg = model_aggregates(table, ms)
    assert agg["ms:conv2d"].to_numpy() == pytest.approx(
        pd.Series(np.where(table.kernel_type == "conv2d", ms, 0)).groupby(table.model.to_numpy(), sort=False)
        .sum().loc[agg.index].to_numpy())
    assert agg.kernels.to_numpy() == pytest.approx(table.groupby("model", sort=False).size().loc[agg.index])
    # networks: convolutions 10 % dearer than alone, grouped ones 40 % cheaper, 5 µs saved per kernel
    truth = 1.1 * agg["ms:conv2d"] + 0.6 * agg["ms:grouped_conv2d"] + agg["ms:add"] - 0.005 * agg.kernels
    y = truth.to_numpy() * np.exp(rng.normal(0, 0.005, len(agg)))
    common = Overhead().fit(agg, y)
    o = Overhead().fit(agg, y, per_type=True)
    coef = dict(zip(o.terms, o.coef))
    assert "ms:rest" in o.terms and "saved_per_kernel" in o.terms and o.resid_std < 0.5 * common.resid_std
    assert coef["ms:conv2d"] == pytest.approx(1.1, rel=0.03) and coef["ms:grouped_conv2d"] == pytest.approx(0.6, rel=0.05)
    assert coef["saved_per_kernel"] == pytest.approx(0.005, rel=0.2)
    # a type no network had is scaled by the common scale (the pull's target), not dropped
    other = agg.iloc[:3].assign(**{"ms:gelu": 1.0, "sum_ms": agg.sum_ms.iloc[:3] + 1.0})
    base = Overhead._nnls(Overhead._design(agg, ["sum_ms", "one", "bytes_out_mb"]), y)[0]
    np.testing.assert_allclose(o.predict(other) - o.predict(agg.iloc[:3]), coef["ms:rest"], rtol=1e-6)
    assert coef["ms:rest"] == pytest.approx(base, rel=1e-3)
    # fitted without per_type (the chains): no per-type scale is among the options
    assert not any(t.startswith("ms:") for t in common.terms)


def test_overhead_on_networks_learns_a_cost_per_kernel():
    # LETI's engine: every step of a network costs a few microseconds of dispatch its kernel alone did not show
    rng = np.random.default_rng(5)
    rows = []
    for m in range(50):
        for k in range(int(rng.integers(5, 200))):
            rows.append({**_conv(32), "model": f"n{m}", "bytes_weights": float(rng.uniform(1e3, 1e6)),
                         "bytes_out": float(rng.uniform(1e3, 1e6))})  # neither a multiple of the kernel count
    table = normalize(pd.DataFrame(rows), "t")
    ms = rng.uniform(0.005, 0.05, len(table))
    agg = model_aggregates(table, ms)
    y = (1.02 * agg.sum_ms + 0.004 * agg.kernels).to_numpy() * np.exp(rng.normal(0, 0.005, len(agg)))
    o = Overhead().fit(agg, y, per_type=True)
    coef = dict(zip(o.terms, o.coef))
    assert "kernels" in o.terms and "saved_per_kernel" not in o.terms
    assert coef["kernels"] == pytest.approx(0.004, rel=0.15) and o.resid_std < 0.02


def test_engine_kernels_carry_the_engines_convolution_scheme():
    from leti.engine.ops import conv2d
    from leti.engine.schedule import ScheduleOptions
    from leti.predict.kernels.features import ENGINE_FEATURES, SCHEME, features_for

    def conv(h, cin, cout, k, stride=1):
        return {"model": "m", "kernel_type": "conv2d", "input_h": h, "input_w": h, "input_c": cin,
                "output_h": -(-h // stride), "output_w": -(-h // stride), "output_c": cout, "kernel_h": k,
                "kernel_w": k, "stride": stride}

    t = normalize(pd.DataFrame([conv(32, 64, 64, 3), conv(32, 16, 16, 3), conv(8, 512, 512, 3), conv(32, 64, 64, 3, 2),
                                conv(28, 64, 128, 1), {**conv(14, 32, 32, 3), "kernel_type": "depthwise_conv2d"}]), "t")
    x = pd.DataFrame(kernel_features(t, ENGINE_FEATURES), columns=ENGINE_FEATURES)
    np.testing.assert_array_equal(x[list(FEATURES)].to_numpy(), kernel_features(t))  # the common columns unchanged
    # what the engine itself chooses, shape by shape: Winograd F(4x4) on 32x32x64, im2col below 32 input channels
    # and strided, F(2x2) on an 8x8 map (16 tiles); a 1x1 is a product; a depthwise convolution has no scheme
    for i, r in enumerate(t.to_dict("records")[:5]):
        shapes = [(1, r["input_h"], r["input_w"], r["input_c"]), (r["kernel_h"], r["kernel_w"], r["input_c"], r["output_c"])]
        s = conv2d.choose_scheme(shapes, {"strides": [r["stride"]] * 2, "padding": "same"}, ScheduleOptions())
        assert x.scheme_winograd_n[i] == (s.params["n"] if s.name == "winograd" else 0)
        assert x.scheme_im2col[i] == (s.name == "im2col")
    assert list(x.scheme_winograd_n) == [4, 0, 2, 0, 0, 0] and list(x.scheme_im2col) == [0, 1, 0, 1, 0, 0]
    assert x.log_scheme_mults[0] < x.log_flops[0] - np.log(2) - 0.5  # Winograd saves multiplications
    assert (x.loc[5, list(SCHEME)] == 0).all()
    # only a predictor of the engine on the CPU takes them (the CUDA backend picks its schemes by measurement)
    assert features_for(["leti-engine-cpu"]) == ENGINE_FEATURES
    assert features_for(["tflite-xnnpack"]) == FEATURES and features_for(["leti-engine-cuda"]) == FEATURES
    engine = KernelRegressors(**FAST).fit(t.assign(runtime="leti-engine-cpu", latency_ms=np.linspace(0.1, 1, 6)))
    assert engine.features_ == ENGINE_FEATURES


def _campaign(tmp_path, name, ratios, scale, reference="ref.tflite"):
    models = [f"m{i}.tflite" for i in range(len(ratios))]
    pd.DataFrame({"model": models, "ratio": ratios, "corrected_ms": [r * scale for r in ratios]}).to_parquet(
        tmp_path / f"{name}.parquet")
    (tmp_path / f"{name}.device.json").write_text(json.dumps({"reference_model": reference}))
    return tmp_path / f"{name}.parquet"


def test_zoo_repeatability_scores_one_campaign_against_another_on_the_paired_scale(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo_repeatability", ROOT / "benchmarks" / "zoo_repeatability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = _campaign(tmp_path, "a", [1.0, 2.0, 3.0, 4.0], 4.0)
    # b: the host ran 20 % slower that hour (a common scale), one model 15 % apart in its ratio, one 7 %
    b = _campaign(tmp_path, "b", [1.0, 2.0, 3.0 / 1.07, 4.0 / 1.15], 4.8)
    models = tmp_path / "models.parquet"
    pd.DataFrame({"model": ["m0.tflite", "m1.tflite", "m2.tflite", "m3.tflite"],
                  "family": ["x", "x", "y", "y"]}).to_parquet(models)
    assert mod.main([str(a), str(b), "--models", str(models)]) == 0
    out = capsys.readouterr().out
    all_line = next(line for line in out.splitlines() if line.startswith("ALL"))
    n, paired5, paired10, ms10 = all_line.split()[1:5]
    assert (int(n), float(paired5), float(paired10), float(ms10)) == (4, 50.0, 75.0, 25.0)  # ms: only m3 (slower ratio, faster hour) within 10 %
    assert "common scale (ms, a / b): 0.8" in out and "apart by more than 10 %: m3.tflite" in out
    # campaigns paired against different reference networks are refused with a one-line reason
    c = _campaign(tmp_path, "c", [1.0, 2.0, 3.0, 4.0], 4.0, reference="other.tflite")
    with pytest.raises(SystemExit, match="not comparable"):
        mod.main([str(a), str(c), "--models", str(models)])


def test_zoo_benchmark_combines_campaigns_on_the_median_paired_ratio(tmp_path):
    bench = _bench_module()
    a = _campaign(tmp_path, "a", [1.0, 2.0, 3.0], 4.0)
    # b: passes of the same models (one model left out by this campaign), another hour's scale
    pd.DataFrame({"model": ["m0.tflite", "m0.tflite", "m1.tflite", "m1.tflite"], "ratio": [1.2, 1.4, 2.0, 2.0],
                  "corrected_ms": [6.0, 7.0, 10.0, 10.0]}).to_parquet(tmp_path / "b.parquet")
    (tmp_path / "b.device.json").write_text(json.dumps({"reference_model": "ref.tflite"}))
    ms, how = bench.combined_latency([a, tmp_path / "b.parquet"], 5.0)
    # m0: median of 1.0, 1.2, 1.4 = 1.2; m1: 2.0; m2 is in one campaign only and left out
    assert ms.to_dict() == {"m0.tflite": pytest.approx(6.0), "m1.tflite": pytest.approx(10.0)}
    assert "2 campaigns (2 models all of them kept)" in how
    c = _campaign(tmp_path, "c", [1.0], 4.0, reference="other.tflite")
    with pytest.raises(SystemExit, match="different"):
        bench.combined_latency([a, c], 5.0)
