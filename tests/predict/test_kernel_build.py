"""A device's kernel predictor built by measurement (issue 16, items 3-4): single-kernel models that split into
the kernel meant, the sampler of real kernel configurations, fusion detection on the local CPU, the adaptive
build within a budget (resumable after a kill), and ``leti kernels`` bad inputs as a user runs them."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leti.errors import ConversionError
from leti.models.kernel_models import ROW_KEYS, KernelConfig, check_split, expected_row, kernel_model, valid
from leti.predict.kernels.split import split_model
from tests.device.conftest import run_leti

ROOT = Path(__file__).resolve().parents[2]


def _split(config, tmp_path, seed=0):
    from leti.models.keras_import import keras_to_tflite

    path = tmp_path / f"{config.name}.tflite"
    path.write_bytes(keras_to_tflite(kernel_model(config, seed)))
    return split_model(path)


@pytest.mark.parametrize("config", [
    KernelConfig("conv2d", 20, 20, 12, 24, kernel=3, stride=2, activation="relu"),
    KernelConfig("conv2d", 17, 17, 8, 8, kernel=1, kernel_w=7),                       # Inception's 1x7
    KernelConfig("mul", 14, 14, 32, variant="broadcast"),                              # squeeze-excite scale
    KernelConfig("concat", 9, 9, 16, 40, n_inputs=3),
    KernelConfig("dense", 7, 7, 16, 64, variant="spatial"),                             # ConvNeXt's pointwise dense
    KernelConfig("grouped_conv2d", 12, 12, 32, 32, kernel=7, groups=32),
    KernelConfig("mean", 10, 10, 24, variant="channel"),                                # a layer norm's mean
    KernelConfig("transpose", 14, 14, 116, groups=2),                                   # ShuffleNet's channel shuffle
])
def test_single_kernel_models_split_into_the_kernel_meant(config, tmp_path):
    rows = _split(config, tmp_path)
    row = check_split(config, rows)
    assert len(rows) == 1 and row["kernel_type"] == config.kernel_type
    assert {k: row[k] for k in ROW_KEYS} == {k: expected_row(config)[k] for k in ROW_KEYS}


def test_a_kernel_that_is_not_the_one_meant_is_refused(tmp_path):
    rows = _split(KernelConfig("mul", 14, 14, 32, variant="same"), tmp_path)
    # the broadcast product has the same shapes but reads 1/196 of the second operand: told apart, by bytes read
    with pytest.raises(ConversionError, match="bytes_in"):
        check_split(KernelConfig("mul", 14, 14, 32, variant="broadcast"), rows)
    with pytest.raises(ConversionError, match="not one conv2d kernel"):
        check_split(KernelConfig("conv2d", 14, 14, 32, 8), pd.concat([rows, rows]))
    assert not valid(KernelConfig("grouped_conv2d", 8, 8, 30, 32, groups=4))  # 4 does not divide 30
    with pytest.raises(ConversionError, match="no single-kernel model"):
        KernelConfig("lstm", 8, 8, 8)


def test_sampler_follows_the_real_networks():
    from leti.models.kernel_models import BUILDABLE
    from leti.predict.kernels.sampler import KernelSampler, config_from_row, config_flops, real_architectures

    s = KernelSampler()
    assert set(s.real.model) == set(real_architectures())  # collected at the default sizes, cached in the package
    # every real kernel maps back onto a configuration whose model splits into exactly that row
    for r in s.real.sample(300, random_state=0).to_dict("records"):
        c = config_from_row(r)
        assert c is not None and r["kernel_type"] in BUILDABLE
        assert {k: expected_row(c)[k] for k in ROW_KEYS} == {k: r[k] for k in ROW_KEYS}
    w = s.type_weights()
    assert sum(w.values()) == pytest.approx(1.0) and max(w, key=w.get) == "conv2d"
    rng = np.random.default_rng(0)
    draws = s.draw("depthwise_conv2d", 200, rng)
    assert len(draws) == 200 and all(valid(c) and config_flops(c) <= 4e9 for c in draws)
    real_c = set(s.real[s.real.kernel_type == "depthwise_conv2d"].input_c)
    jittered = [c for c in draws if c.input_c not in real_c]
    assert len(jittered) > 100 and {3, 5, 7} >= {c.kernel for c in draws}
    assert sum(c.input_c % 8 == 0 for c in draws) > 80  # channels rounded to SIMD-friendly multiples, mostly
    # a type no keras.applications network has is drawn from synthetic seeds, with a share of its own
    assert s.synthetic == ["transpose"] and w["transpose"] == pytest.approx(0.01)
    # grouped convolutions, whose real rows are ConvNeXt's depthwise ones redrawn and the two RegNets' bottlenecks,
    # get their floor, not their 1.7 % of the rows
    assert w["grouped_conv2d"] == pytest.approx(0.03)
    plain = (s.real.kernel_type == "grouped_conv2d").mean()
    assert plain < 0.03 and w["depthwise_conv2d"] > w["grouped_conv2d"]
    bottlenecks = [c for c in s.pool["grouped_conv2d"] if c.input_c // c.groups == 8 and c.kernel == 3]
    assert len(bottlenecks) >= 20 and min(c.input_h for c in bottlenecks) <= 7  # RegNet-200MF's, at 224 px
    shuffles = s.draw("transpose", 50, rng)
    assert len(shuffles) == 50 and all(valid(c) and c.groups >= 2 and c.input_c % c.groups == 0 for c in shuffles)
    # no draw around VGG16's 25088 -> 4096 head (411 MB) exceeds the weights cap (converting one took ~100 s)
    from leti.predict.kernels.sampler import MAX_WEIGHT_BYTES, config_weight_bytes

    dense = s.draw("dense", 300, rng)
    assert len(dense) == 300 and max(config_weight_bytes(c) for c in dense) <= MAX_WEIGHT_BYTES
    assert config_weight_bytes(KernelConfig("dense", 1, 1, 25088, 4096, variant="vector")) == 4 * 25088 * 4096
    assert len({(c.input_h, c.input_c, c.groups) for c in shuffles}) > 30


def test_real_table_cache_collects_only_the_architectures_it_lacks(tmp_path):
    """A cached real-kernel table written before an architecture joined the pool gains that architecture's rows (the
    same split as the package's table) and is rewritten; its other rows are kept as they were."""
    from leti.predict.kernels.sampler import REAL_TABLE, real_kernels

    full = pd.read_parquet(REAL_TABLE)
    old = full[full.model != "RegNetX002"]
    path = tmp_path / "real.parquet"
    old.to_parquet(path, index=False)
    echoed = []
    table = real_kernels(path, echo=echoed.append)
    assert echoed == [f"RegNetX002: {int((full.model == 'RegNetX002').sum())} kernels"]  # only the missing one built
    assert len(table) == len(full) and set(table.model) == set(full.model)
    keys = list(ROW_KEYS)  # the same rows; their order follows Keras's layer names, which depend on the process

    def rows(t):
        return t.loc[t.model == "RegNetX002", keys].sort_values(keys).reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(table), rows(full), check_dtype=False)
    assert len(pd.read_parquet(path)) == len(full)  # written back: the next call collects nothing
    assert len(real_kernels(path, echo=echoed.append)) == len(full) and len(echoed) == 1


def test_first_round_interleaves_the_types():
    """A budget that runs out inside the first round must leave every type some kernels: the initial plan takes the
    types in turn, not all of one type first."""
    from leti.predict.kernels.build import _plan_initial
    from leti.predict.kernels.sampler import KernelSampler

    s = KernelSampler()
    types = ["conv2d", "hard_swish", "dense"]
    plan = _plan_initial(s, types, s.type_weights(), 12, np.random.default_rng(3))
    kinds = [item[2] for item in plan]
    assert [kinds.count(t) for t in types][0] > kinds.count("hard_swish") >= 4  # conv2d weighs most
    assert set(kinds[:3]) == set(types) and set(kinds[3:6]) == set(types)
    assert len({item[0] for item in plan}) == len(plan)


def test_detection_on_one_pair_and_a_graph_fusion():
    from leti.device.local import LocalDevice
    from leti.predict.kernels.detect import detect_fusion

    evidence = []
    print("load", os.getloadavg())
    rules = detect_fusion(LocalDevice(threads=1), [("conv2d", "hard_swish"), ("add", "relu")], repeats=3,
                          evidence=evidence)
    hs, relu = evidence
    assert rules.source == "measured" and rules.runtime == "tflite-xnnpack"
    # XNNPACK runs the hard-swish after the convolution as a kernel of its own: it costs about what it costs alone
    assert hs.verdict == "separate" and hs.kernels_in_pair == 2
    assert hs.marginal > 0.5 * hs.alone > 0 and hs.t_pair > hs.t_main
    # the converter already fused the ReLU into the add: one op in the graph, no runtime rule
    assert relu.verdict == "graph" and relu.kernels_in_pair == 1
    assert rules.fuse == {}


@pytest.fixture(scope="module")
def warm_tf(tmp_path_factory):
    """TensorFlow imported and its converter run once, so a build's small budget goes to measuring (the first
    conversion of a process takes seconds, tens of them on a loaded host)."""
    _split(KernelConfig("relu", 2, 2, 2), tmp_path_factory.mktemp("warm"))


def _db_rows(db: Path) -> dict:
    with sqlite3.connect(db) as c:
        return {name: (status, ratio) for name, status, ratio in c.execute("SELECT name, status, ratio FROM items")}


def test_build_within_budget_resumes_after_a_kill(tmp_path, capsys, warm_tf):
    out = tmp_path / "kp"
    args = ["kernels", "build", "--device", "local", "--out", str(out), "--types", "conv2d,hard_swish",
            "--calibration", "6", "--networks", "0", "--no-detect", "--seed", "3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "leti", *args, "--budget-minutes", "5"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "kernels.sqlite"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            rows = _db_rows(db) if db.is_file() else {}
        except sqlite3.OperationalError:  # the build has created the file but not yet its tables
            rows = {}
        if sum(s == "ok" for s, _ in rows.values()) >= 8:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # mid-build, mid-model: nothing measured may be lost
    proc.wait(timeout=30)
    before = {n: v for n, v in _db_rows(db).items() if v[0] == "ok"}
    assert len(before) >= 8 and not (out / "manifest.json").exists()
    code, stdout, err = run_leti(capsys, *args, "--budget-minutes", "0.6")  # the kill came ~12 s in: room for more
    assert code == 0, err
    after = _db_rows(db)
    assert all(after[n] == v for n, v in before.items())  # every measurement kept as it was
    assert sum(s == "ok" for s, _ in after.values()) > len(before)
    line = stdout.strip().splitlines()[-1]
    assert line.startswith(f"wrote {out}: ") and "kernels measured (" in line and "CV error per type (MAPE/latency-weighted MAPE): " in line
    minutes = float(line.split(" minutes")[0].rsplit(" ", 1)[1])
    assert 0.2 < minutes < 1.1  # both runs together, within the budget (and the final fit's slack)
    table = pd.read_parquet(out / "kernels.parquet")
    assert set(table.kernel_type) == {"conv2d", "hard_swish"} and (table.latency_ms > 0).all()
    assert set(table.runtime) == {"tflite-xnnpack"} and set(table.device) == {"local"}
    cal = pd.read_parquet(out / "calibration.parquet")
    assert list(cal.columns[:2]) == ["model", "latency_ms"] and (cal.latency_ms > 0).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["fusion_rules"]["runtime"] == "tflite-xnnpack" and manifest["device"] == "local"
    from leti.device.host import host_identity

    assert manifest["hosts"] == [host_identity()]  # both runs measured here: the machine recorded once
    # a build of convolutions measures the device's cache profile once and keeps it in the store and the predictor
    assert manifest["cache"]["weights_mb"] == [1.0, 2.0, 4.0, 8.0] and manifest["cache"]["lost"][0] == 0.0
    with sqlite3.connect(db) as c:
        assert json.loads(c.execute("SELECT value FROM meta WHERE key='cache_profile'").fetchone()[0]) == manifest["cache"]
        price = json.loads(c.execute("SELECT value FROM meta WHERE key='delegate_price'").fetchone()[0])
    # ... and what a kernel XNNPACK leaves out costs, timed once on its probe pairs, the overhead's price for it
    assert len(price["pairs"]) == 3 and all(p["outside"] == 9 and p["split_ms"] > 0 < p["slice_ms"] for p in price["pairs"])
    overhead = dict(zip(manifest["overhead"]["terms"], manifest["overhead"]["coef"]))
    assert price["price_ms"] >= 0 and overhead["outside_delegate"] == price["price_ms"]
    # the predictor predicts a model of its kernel types, a conv net with hard-swish, in a sane range
    import keras

    import leti

    x = keras.Input((32, 32, 8), batch_size=1)
    y = keras.layers.Activation("hard_swish")(keras.layers.Conv2D(32, 3, padding="same")(x))
    y = keras.layers.Conv2D(64, 3, strides=2, padding="same")(y)
    r = leti.predict_model_latency(keras.Model(x, y), out)
    assert len(r.kernels) == 3 and 1e-4 < r.latency_ms < 50
    # another seed on the same folder: refused, naming the difference; the folder is untouched
    code, _, err = run_leti(capsys, *args[:-2], "--seed", "4", "--budget-minutes", "1")
    assert code == 1 and err.strip().splitlines() == [
        f"error: {out} holds a kernel build with other settings: seed 3 (asked 4); rerun with those settings "
        "to continue it, or use another --out"]
    assert _db_rows(db) == after


def test_rounds_refit_and_sample_where_the_predictor_is_unsure(tmp_path, warm_tf):
    from leti.predict.kernels.build import build_kernel_predictor

    print("load", os.getloadavg())
    # round 0 (twelve cheap kernels) is fitted within seconds: half a minute leaves room for further rounds, also
    # when the other test worker halves this one's speed
    report = build_kernel_predictor("local", tmp_path / "kp", 0.5, kernel_types=["hard_swish", "relu"],
                                    n_calibration=0, n_networks=0, initial_per_type=6, detect=False, seed=1)
    assert report.rounds >= 2 and report.minutes < 0.8  # within the budget and the final fit's slack
    with sqlite3.connect(tmp_path / "kp" / "kernels.sqlite") as c:
        origins = dict(c.execute("SELECT origin, COUNT(*) FROM items WHERE kind='kernel' GROUP BY origin"))
        fitted = [json.loads(cv) for (cv,) in c.execute("SELECT cv FROM rounds WHERE cv IS NOT NULL")]
    assert origins["initial"] >= 8 and origins.get("adaptive", 0) > 0  # later rounds chosen by uncertainty
    assert fitted and set(fitted[0]) == {"hard_swish", "relu"} and fitted[0]["hard_swish"]["n"] >= 3
    assert sum(report.per_type.values()) == len(pd.read_parquet(tmp_path / "kp" / "kernels.parquet"))
    assert report.rules == {"runtime": "tflite-xnnpack", "fuse": {}, "source": "default"}  # not detected: a priori
    assert "cache" not in json.loads((tmp_path / "kp" / "manifest.json").read_text())  # no one-pixel product type
    # a new build's fits weigh kernels by their closeness to real networks' kernels; a rerun keeps or changes that
    manifest = lambda: json.loads((tmp_path / "kp" / "manifest.json").read_text())  # noqa: E731
    assert manifest()["kernels"]["params"]["coverage"] is True
    build_kernel_predictor("local", tmp_path / "kp", 0.5, kernel_types=["hard_swish", "relu"], n_calibration=0,
                           n_networks=0, detect=False, seed=1, coverage=False)  # the budget is spent: a refit
    assert manifest()["kernels"]["params"]["coverage"] is False
    with sqlite3.connect(tmp_path / "kp" / "kernels.sqlite") as c:
        assert json.loads(c.execute("SELECT value FROM meta WHERE key='coverage'").fetchone()[0]) is False
        c.execute("DELETE FROM meta WHERE key='coverage'")  # a store from before the setting existed
    build_kernel_predictor("local", tmp_path / "kp", 0.5, kernel_types=["hard_swish", "relu"], n_calibration=0,
                           n_networks=0, detect=False, seed=1)
    assert manifest()["kernels"]["params"]["coverage"] is False  # it was fitted without: refitted the same way
    # benchmarks/bench_kernels_alone.py: every kernel of a model built alone and timed against the build's reference
    import importlib.util

    from leti.models.kernel_models import chain_model
    from leti.models.keras_import import keras_to_tflite

    model = chain_model([KernelConfig("relu", 24, 24, 16), KernelConfig("hard_swish", 24, 24, 16)], 0, name="m")
    path = tmp_path / "m.tflite"
    path.write_bytes(keras_to_tflite(model))
    spec = importlib.util.spec_from_file_location("alone", ROOT / "benchmarks" / "bench_kernels_alone.py")
    alone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alone)
    assert alone.main(["--predictor", str(tmp_path / "kp"), "--models", str(path), "--out", str(tmp_path / "a.parquet")]) == 0
    rows = pd.read_parquet(tmp_path / "a.parquet")
    assert list(rows.kernel_type) == ["relu", "hard_swish"] and (rows.alone_ms > 0).all() and (rows.predicted_ms > 0).all()
    assert (rows.alone_ms < 1.0).all() and set(rows.file) == {"m.tflite"}
    # benchmarks/profile_tflite_prefix.py: the model cut after its first operator computes that operator's output
    spec = importlib.util.spec_from_file_location("prefix", ROOT / "benchmarks" / "profile_tflite_prefix.py")
    prefix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prefix)
    from ai_edge_litert.interpreter import Interpreter

    x = np.random.default_rng(0).standard_normal((1, 24, 24, 16)).astype(np.float32)
    outs = {}
    for k, data in ((1, prefix.prefix_tflite(path.read_bytes(), 1)), (2, path.read_bytes())):
        it = Interpreter(model_content=data)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs[k] = [it.get_tensor(o["index"]) for o in it.get_output_details()]
    relu = np.maximum(x, 0)
    assert len(outs[1]) == 1 and np.allclose(outs[1][0], relu)
    assert np.allclose(outs[2][0], relu * np.clip(relu + 3, 0, 6) / 6, atol=1e-5)  # the whole chain: hard-swish of it
    with pytest.raises(ValueError, match="1..2 operators"):
        prefix.prefix_tflite(path.read_bytes(), 3)
    assert prefix.main(["--predictor", str(tmp_path / "kp"), "--models", str(path), "--cuts", "2", "--repeats", "1",
                        "--out", str(tmp_path / "p.parquet")]) == 0
    rows = pd.read_parquet(tmp_path / "p.parquet")
    assert list(rows.ops) == [1, 2] and list(rows.kernels) == [1, 2] and (rows.run_ms > 0).all()
    assert rows.alone_ms.iloc[0] < rows.alone_ms.iloc[1] and rows.segment.iloc[1].startswith("hard_swish@24x24")


def test_calibration_is_timed_at_the_budget_s_pace_and_its_rest_reserved(tmp_path):
    from leti.predict.kernels.build import _calibration_left_s, calibration_due
    from leti.predict.kernels.build_store import BuildStore

    # a share in proportion to the budget spent, at least one, all of them by the pace's share of the budget
    assert [calibration_due(60, s, 1000, pace=0.8) for s in (0, 40, 400, 799, 800, 5000)] == [1, 3, 30, 60, 60, 60]
    assert calibration_due(0, 500, 1000) == 0 and calibration_due(7, 1, 1000) == 1
    with BuildStore(tmp_path / "kernels.sqlite") as store:
        assert _calibration_left_s(store) == 0.0  # nothing planned: nothing reserved
        store.plan("network", [(f"net-{i}", "network", "network", {"params": i}) for i in range(4)], 0)
        store.plan("calibration", [(f"calib-{i}", "calibration", "chain", {"seed": i}) for i in range(2)], 0)
        assert _calibration_left_s(store) == pytest.approx(4 * 4.0 + 2 * 1.5)  # the guesses before any was timed
        ids = [item["id"] for item in store.pending("network")]
        store.failed(ids[0], "could not build", 0.5)
        m = type("M", (), {"ratio": 1.0, "ratio_std": 0.0, "ref_ms": 1.0, "mean_ms": 2.0, "runs": 5})()
        store.done(ids[1], pd.DataFrame({"kernel_type": ["relu"]}), m, 10.0)
        assert _calibration_left_s(store) == pytest.approx(2 * 10.0 + 2 * 1.5)  # the measured mean: failures aside


def test_networks_are_timed_a_share_after_each_round(tmp_path, warm_tf, monkeypatch):
    from leti.predict.kernels import build

    fitted, order = [], []
    monkeypatch.setattr(build, "calibration_due", lambda total, spent, budget: min(total, 1))
    monkeypatch.setattr(build._Clock, "left", lambda self, left=build._Clock.left: -1.0 if fitted else left(self))

    def notify(_s, _b, msg):
        order.append(msg.split(":")[1].split()[0] if msg.startswith("round 0:") else msg)
        fitted.extend([msg] if msg.startswith("round 0 fitted") else [])

    report = build.build_kernel_predictor("local", tmp_path / "kp", 0.9, kernel_types=["relu"], n_calibration=0,
                                          n_networks=3, initial_per_type=4, detect=False, seed=2, notify=notify)
    # round 0's kernels, then the one network due, then the fit; the budget gone, the other two stay pending for a
    # continued build, and the overhead is fitted on the one timed
    assert order.count("network") == 1 and order.index("network") > max(i for i, m in enumerate(order) if m == "kernel")
    assert order.index("network") < next(i for i, m in enumerate(order) if m.startswith("round 0 fitted"))
    assert report.calibration == 1
    with sqlite3.connect(tmp_path / "kp" / "kernels.sqlite") as c:
        assert dict(c.execute("SELECT status, COUNT(*) FROM items WHERE kind='network' GROUP BY status")) == {
            "ok": 1, "pending": 2}


def test_build_times_random_whole_networks_for_the_overhead(tmp_path, warm_tf, monkeypatch):
    from leti.models.random_networks import network_params
    from leti.predict.kernels import build
    from leti.predict.kernels.build import build_kernel_predictor

    # the networks are all due after round 0 (a pace of almost nothing); once it is fitted the budget counts as spent
    # (the rounds after it would only sample more kernels until the 0.9 minutes were gone)
    fitted = []
    monkeypatch.setattr(build, "CALIBRATION_PACE", 1e-6)
    monkeypatch.setattr(build._Clock, "left", lambda self, left=build._Clock.left: -1.0 if fitted else left(self))
    notify = lambda _s, _b, msg: fitted.append(msg) if msg.startswith("round 0 fitted") else None  # noqa: E731
    report = build_kernel_predictor("local", tmp_path / "kp", 0.9, kernel_types=["relu"], n_calibration=0,
                                    n_networks=3, initial_per_type=4, detect=False, seed=2, notify=notify)
    assert fitted and report.rounds == 1
    nets = pd.read_parquet(tmp_path / "kp" / "networks.parquet")
    kernels = pd.read_parquet(tmp_path / "kp" / "network_kernels.parquet")
    assert list(nets.model) == ["net-000", "net-001", "net-002"] and (nets.latency_ms > 0).all()
    assert (nets.set_index("model").n_kernels == kernels.groupby("model").size()).all()
    assert {"conv2d", "mean", "dense"} <= set(kernels.kernel_type)  # whole networks, not the build's types
    with sqlite3.connect(tmp_path / "kp" / "kernels.sqlite") as c:
        stored = dict(c.execute("SELECT name, config FROM items WHERE kind='network' AND status='ok'"))
    assert json.loads(stored["net-001"])["params"] == network_params(2 * 100_003 + 1)  # rebuilt from the store
    # fewer networks than the overhead takes them from: said, and the overhead is not fitted on them
    assert any("only 3 calibration networks" in n for n in report.notes), report.notes
    assert report.calibration == 3
    # --overhead sum: no overhead, latency = the kernels' sum, its spread on the networks the interval's; the store
    # keeps the choice for the next refit
    report = build_kernel_predictor("local", tmp_path / "kp", 0.9, kernel_types=["relu"], n_calibration=0,
                                    n_networks=3, initial_per_type=4, detect=False, seed=2, overhead="sum")
    manifest = json.loads((tmp_path / "kp" / "manifest.json").read_text())["overhead"]
    assert manifest["terms"] == [] and manifest["n_models"] == 3 and manifest["resid_std"] > 0
    assert any(n.startswith("no overhead (--overhead sum)") for n in report.notes), report.notes
    report = build_kernel_predictor("local", tmp_path / "kp", 0.9, kernel_types=["relu"], n_calibration=0,
                                    n_networks=3, initial_per_type=4, detect=False, seed=2)
    assert any(n.startswith("no overhead (--overhead sum)") for n in report.notes), report.notes
    from leti.predict.kernels.model import load_kernel_predictor

    kp = load_kernel_predictor(tmp_path / "kp")
    lat = kp.predict_models(kernels, allow_unknown=True)
    assert [m.latency_ms for m in lat] == pytest.approx([m.kernel_sum_ms for m in lat])
    assert all(m.low_ms < m.latency_ms < m.high_ms for m in lat)


@pytest.mark.parametrize("args, message", [
    (["build", "--device", "phone42", "--budget-minutes", "1"],
     "--device 'phone42': kernels are measured on a device that runs models in this process: local, engine, "
     "cuda-engine"),
    (["build", "--device", "local", "--budget-minutes", "0"], "--budget-minutes must be above 0, got 0"),
    (["build", "--device", "local", "--budget-minutes", "-3"], "--budget-minutes must be above 0, got -3"),
    (["build", "--device", "local", "--budget-minutes", "1", "--threads", "0"],
     "--threads must be a positive whole number, got 0"),
    (["build", "--device", "local", "--budget-minutes", "1", "--no-coverage", "--transfer-from", "src"],
     "--coverage/--no-coverage goes without --transfer-from (a transfer adapts the source's fits)"),
    (["build", "--device", "local", "--budget-minutes", "1", "--overhead", "mean"],
     "--overhead takes fit or sum, and goes without --transfer-from; got 'mean'"),
    (["detect", "--device", "nowhere"],
     "--device 'nowhere': kernels are measured on a device that runs models in this process: local, engine, "
     "cuda-engine"),
])
def test_kernels_cli_bad_input(args, message, tmp_path, capsys):
    extra = ["--out", str(tmp_path / ("rules.json" if args[0] == "detect" else "kp"))]
    code, out, err = run_leti(capsys, "kernels", *args, *extra)
    assert code == 1 and err.strip().splitlines() == [f"error: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_kernels_out_that_holds_something_else(tmp_path, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    code, _, err = run_leti(capsys, "kernels", "build", "--budget-minutes", "1", "--out", busy)
    assert code == 1 and err.strip().splitlines() == [
        f"error: --out {busy} holds something else (no kernels.sqlite of a kernel build); give a new or empty "
        "folder, or the folder of a build to continue"]
    assert [p.name for p in busy.iterdir()] == ["notes.txt"] and (busy / "notes.txt").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_leti(capsys, "kernels", "build", "--budget-minutes", "1", "--out", afile)
    assert code == 1 and err.strip() == f"error: --out {afile} is a file, not a folder" and afile.read_text() == "x"
    code, _, err = run_leti(capsys, "kernels", "detect", "--pairs", "conv2d:lstm", "--out", tmp_path / "r.json")
    assert code == 1 and err.strip().startswith("error: --pairs expects MAIN:FOLLOWER items of kernel types (")
    assert err.strip().endswith("got conv2d:lstm") and not (tmp_path / "r.json").exists()
