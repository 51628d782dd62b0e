"""Kernel-level transfer on a measured device (issue 17, item 4): ``leti kernels build --transfer-from SRC/``
measures a few kernels chosen to correct another device's kernel predictor and saves a normal kernel predictor."""

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leti.models.kernel_models import KernelConfig, expected_row
from leti.predict.kernels import fit_kernel_predictor, load_kernel_predictor
from leti.predict.kernels.sampler import KernelSampler
from leti.predict.kernels.schema import normalize
from leti.predict.kernels.split import rules_for
from leti.predict.kernels.transfer_plan import (candidate_pool, order_kernels, source_log_ms, source_weights,
                                                type_shares, van_der_corput)
from tests.device.conftest import run_leti
from tests.predict.test_kernels import FAST


@pytest.fixture(scope="module")
def sampler():
    return KernelSampler()


def _source(sampler, types, device="phone-a", runtime="tflite-xnnpack", precision="float", n=40):
    """A small kernel predictor of another device: sampler draws priced by a made-up cost law."""
    rng = np.random.default_rng(0)
    configs = [c for t in types for c in sampler.draw(t, n, rng)]
    rows = normalize(pd.DataFrame([{**expected_row(c), "model": c.name, "kernel_index": 0} for c in configs]))
    ms = 2e-3 + rows.flops / 4e9 + (rows.bytes_in + rows.bytes_out + rows.bytes_weights) / 2e9
    rows = rows.assign(latency_ms=ms, device=device, runtime=runtime, precision=precision)
    return fit_kernel_predictor(rows, where="source", rules=rules_for(runtime), **FAST)


def test_van_der_corput_visits_the_middle_first():
    np.testing.assert_allclose(van_der_corput(7), [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875])


def test_chooser_covers_every_type_first_and_spreads_over_the_source_latency(sampler):
    types = ["add", "conv2d", "depthwise_conv2d", "relu"]
    src = _source(sampler, types)
    weights = source_weights(sampler, src.regressors)
    shares = type_shares(types, weights)
    assert shares["conv2d"] > shares["relu"] and sum(shares.values()) == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    _, cand = candidate_pool(sampler, types, shares, 60, rng)
    order = order_kernels(src.regressors, cand, weights, rng, 60)
    assert len(order) == 60 and len(set(order)) == 60
    picked = cand.kernel_type.to_numpy()[order]
    assert set(picked[: len(types)]) == set(types)  # every type before any type's second kernel
    counts = pd.Series(picked).value_counts()
    assert counts["conv2d"] > counts["relu"] >= 5  # more where the weight is, a few everywhere
    # within a type: the first picks span the source's predicted latency (quantile ranks), unlike a random pick
    log_ms = source_log_ms(src.regressors, cand)
    for t in types:
        pool = np.flatnonzero(cand.kernel_type.to_numpy() == t)
        mine = [i for i in order if cand.kernel_type.iloc[i] == t][:5]
        q = np.array([np.mean(log_ms[pool] < log_ms[i]) for i in mine])
        assert q.min() < 0.3 and q.max() > 0.7 and abs(q[0] - 0.5) < 0.3, (t, q)
    # the full order of a measured table (the benchmark's use): every row once
    full = order_kernels(src.regressors, cand, weights, np.random.default_rng(2))
    assert sorted(full) == list(range(len(cand)))


@pytest.fixture(scope="module")
def warm_tf(tmp_path_factory):
    """TensorFlow's converter run once, so a tiny budget goes to measuring."""
    from leti.models.kernel_models import kernel_model
    from leti.models.keras_import import keras_to_tflite

    keras_to_tflite(kernel_model(KernelConfig("relu", 2, 2, 2), 0))


def _items(db: Path) -> dict:
    with sqlite3.connect(db) as c:
        return {name: (kind, status, ratio) for name, kind, status, ratio in
                c.execute("SELECT name, kind, status, ratio FROM items")}


def test_transfer_build_on_the_local_device(sampler, tmp_path, capsys, warm_tf):
    src = _source(sampler, ["relu", "hard_swish", "add"])
    src.save(tmp_path / "src")
    out = tmp_path / "kp"
    args = ["kernels", "build", "--device", "local", "--transfer-from", tmp_path / "src", "--budget-minutes", "0.5",
            "--types", "relu,hard_swish", "--networks", "1", "--no-cache-probe", "--seed", "2", "--out", out]
    code, stdout, err = run_leti(capsys, *args)
    assert code == 0, err
    assert "the kernel regressors of 'phone-a' (tflite-xnnpack) adapted with" in stdout
    assert "note: fusion rules: those of 'phone-a'" in stdout and "1 networks timed" in stdout
    assert "note: the adapted source's regressors alone" in stdout or "note: the device's own regressors weigh" in stdout
    assert "note: types of the source not measured here (the device-wide correction only): add" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "local" and manifest["runtime"] == "tflite-xnnpack"
    assert manifest["kernels"]["kind"] == "blended" and manifest["kernels"]["source_device"] == "phone-a"
    assert (out / "base" / "types" / "relu").is_dir()  # the source's regressors travel with it
    assert manifest["fusion_rules"] == src.rules.to_dict()
    table = pd.read_parquet(out / "kernels.parquet")
    assert set(table.kernel_type) == {"relu", "hard_swish"} and set(table.origin) == {"transfer"}
    assert len(table) >= 4 and set(table.device) == {"local"}
    nets = pd.read_parquet(out / "networks.parquet")
    assert list(nets.model) == ["net-000"] and (nets.latency_ms > 0).all()
    # a normal kernel predictor: loads, predicts a model file; the correction moved the source's answers
    import keras

    import leti

    x = keras.Input((24, 24, 16), batch_size=1)
    model = keras.Model(x, keras.layers.Activation("hard_swish")(keras.layers.ReLU()(x)))
    r = leti.predict_model_latency(model, out)
    assert len(r.kernels) == 2 and 0 < r.latency_ms < 10
    back = load_kernel_predictor(out)
    mine = back.predict_kernels(table, where="t").predicted_ms.to_numpy()
    theirs = src.predict_kernels(table.assign(device="phone-a"), where="t").predicted_ms.to_numpy()
    err_mine = np.median(np.abs(np.log(mine / table.latency_ms)))
    err_theirs = np.median(np.abs(np.log(theirs / table.latency_ms)))
    assert err_mine < err_theirs, (err_mine, err_theirs)
    # continued with a larger budget: what was measured is kept as it was, more kernels are measured, and the build's
    # wall time (kept in the store across runs) stays within the new budget
    before = _items(out / "kernels.sqlite")
    more = [a if a != "0.5" else "0.7" for a in args]
    code, stdout, err = run_leti(capsys, *more)
    assert code == 0, err
    after = _items(out / "kernels.sqlite")
    ok = lambda items: {k: v for k, v in items.items() if v[1] == "ok"}  # noqa: E731
    assert ok(after).items() >= ok(before).items() and len(ok(after)) > len(ok(before))
    with sqlite3.connect(out / "kernels.sqlite") as c:
        spent = json.loads(c.execute("SELECT value FROM meta WHERE key='spent_s'").fetchone()[0])
    assert 0.5 * 60 < spent < 0.7 * 60 + 15
    before = after
    # a scratch build on the folder, or a transfer from another source: refused, nothing touched
    code, _, err = run_leti(capsys, "kernels", "build", "--device", "local", "--budget-minutes", "1", "--out", out)
    assert code == 1 and err.strip().splitlines() == [
        f"error: {out} holds a transfer build (leti kernels build --transfer-from); rerun it with its --transfer-from "
        "to continue it, or use another --out"]
    other = _source(sampler, ["relu"], device="phone-b")
    other.save(tmp_path / "other")
    code, _, err = run_leti(capsys, *[a if a != tmp_path / "src" else tmp_path / "other" for a in more])
    assert code == 1 and len(err.strip().splitlines()) == 1 and "transfer_from" in err
    assert _items(out / "kernels.sqlite") == before


@pytest.mark.parametrize("case", ["not a predictor", "itself", "int8"])
def test_transfer_refusals_are_one_line(case, sampler, tmp_path, capsys):
    src = tmp_path / "src"
    if case == "not a predictor":
        src.mkdir()
        (src / "notes.txt").write_text("mine")
        want = f"--transfer-from {src} is not a kernel predictor (no manifest.json of leti kernels build or leti fit"
    elif case == "itself":
        _source(sampler, ["relu"], device="local").save(src)
        want = f"--transfer-from {src} is the kernel predictor of this very device (device 'local', runtime " \
               "'tflite-xnnpack', precision 'float', measured on a machine its build did not record): a transfer to " \
               "itself makes no sense"
    else:
        _source(sampler, ["relu"], precision="int8").save(src)
        want = f"--transfer-from {src} describes precision 'int8', and a kernel build measures 'float' kernels"
    code, _, err = run_leti(capsys, "kernels", "build", "--device", "local", "--transfer-from", src,
                            "--budget-minutes", "1", "--out", tmp_path / "kp")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {want}"), err
    assert not (tmp_path / "kp").exists()


def test_the_same_device_on_another_recorded_machine_is_a_source(sampler, tmp_path):
    """``local`` timed on another machine (its recorded hosts) transfers; timed here it is refused."""
    from leti.device.host import host_identity
    from leti.errors import LetiError
    from leti.predict.kernels.build_transfer import load_source

    src = _source(sampler, ["relu"], device="local")
    src.hosts = [{"id": "another-vm", "cpu": "elsewhere"}]
    src.save(tmp_path / "other")
    assert load_source(tmp_path / "other", "local", "tflite-xnnpack").hosts == src.hosts
    src.hosts = [host_identity()]
    src.save(tmp_path / "here")
    with pytest.raises(LetiError, match="measured on this machine"):
        load_source(tmp_path / "here", "local", "tflite-xnnpack")


def test_weight_space_evidence_is_the_same_fit():
    """AdaptedKernels fits thousands of kernels in weight space (p × p): the same posterior as the n × n form."""
    from leti.predict.transfer.bayes import fit_evidence, fit_evidence_primal

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 24))
    y = x @ (rng.normal(size=24) * np.r_[np.ones(4), np.full(10, 0.3), np.full(10, 0.02)]) + 0.1 * rng.normal(size=200)
    a, b = fit_evidence(x, y, [10, 10], 4), fit_evidence_primal(x, y, [10, 10], 4)
    np.testing.assert_allclose(b["hyper"], a["hyper"], rtol=1e-3)
    np.testing.assert_allclose(b["coef"], a["coef"], atol=1e-6)
    assert b["nll"] == pytest.approx(a["nll"], abs=1e-6)
