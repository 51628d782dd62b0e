"""Kernel-level transfer (issue 17): a known phone's kernel predictor adapted to another from a few models."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from leti.cli import app
from leti.predict.kernels import fit_kernel_predictor, load_kernel_predictor, read_kernel_table, read_model_latency
from leti.predict.kernels.adapt import AdaptedKernels
from leti.predict.kernels.adapt_fit import adapt_kernel_predictor
from tests.predict.test_kernels import E2E, FAST, OPS, leti

runner = CliRunner()


@pytest.fixture(scope="module")
def split():
    """pixel4 fitted on 40 models; iphonexs: 3 models measured, 20 others held out."""
    models = np.random.default_rng(0).permutation(sorted(set(pd.read_parquet(OPS).model)))
    src, few, test = models[:40], models[40:43], models[43:63]
    a = read_kernel_table(OPS, "pixel4")
    b = read_kernel_table(OPS, "iphonexs")
    lat = read_model_latency(E2E, "iphonexs")
    source = fit_kernel_predictor(a[a.model.isin(src)], read_model_latency(E2E, "pixel4"), where="pixel4", **FAST)
    return source, b[b.model.isin(few)], b[b.model.isin(test)], lat


def _log_err(pred, rows) -> float:
    return float(np.median(np.abs(np.log(pred.predict_kernels(rows, allow_unknown=True).predicted_ms / rows.latency_ms))))


def test_adapted_kernels_beat_the_source_as_is_and_scratch_on_held_out_models(split):
    source, few, test, lat = split
    adapted = adapt_kernel_predictor(source, few, lat, "iphonexs")
    assert isinstance(adapted.regressors, AdaptedKernels) and adapted.device == "iphonexs"
    as_is = _log_err(source, test.assign(device="pixel4"))
    scratch = fit_kernel_predictor(few, where="iphonexs", **FAST)
    err, err_scratch = _log_err(adapted, test), _log_err(scratch, test)
    assert err < 0.6 * as_is and err < err_scratch, (err, as_is, err_scratch)
    # the overhead was carried over and rescaled on the 3 models' end-to-end latencies
    assert adapted.overhead.terms == source.overhead.terms and adapted.overhead.n_models == 3
    assert "scaled by" in adapted.overhead_note and "(3 models" in adapted.overhead_note
    res = adapted.predict_models(test, allow_unknown=True)
    y = lat.groupby("model").latency_ms.mean()
    ratio = np.array([r.latency_ms / y[r.model] for r in res])
    assert 0.7 < np.median(ratio) < 1.3 and all(r.low_ms < r.latency_ms < r.high_ms for r in res)


def test_adapted_predictor_saves_and_loads_without_pickle(split, tmp_path):
    source, few, test, lat = split
    adapted = adapt_kernel_predictor(source, few, lat, "iphonexs")
    adapted.save(tmp_path / "p")
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["kernels"]["kind"] == "adapted" and manifest["kernels"]["source_device"] == "pixel4"
    for f in (tmp_path / "p").rglob("*"):
        if f.is_file():
            json.loads(f.read_text())  # manifest and XGBoost models: JSON, nothing pickled
    back = load_kernel_predictor(tmp_path / "p")
    np.testing.assert_allclose(back.predict_kernels(test, allow_unknown=True).predicted_ms,
                               adapted.predict_kernels(test, allow_unknown=True).predicted_ms, rtol=1e-5)
    assert back.regressors.kernel_types == adapted.regressors.kernel_types


def test_cli_fit_kernels_transfer_from_predictor(split, tmp_path):
    source, few, test, _ = split
    source.save(tmp_path / "a")
    raw = pd.read_parquet(OPS)
    raw[raw.model.isin(set(few.model))].to_parquet(tmp_path / "few.parquet", index=False)  # both phones' rows
    r = runner.invoke(app, ["fit", "--kernels", str(tmp_path / "few.parquet"), "--device", "iphonexs",
                            "--transfer-from-predictor", str(tmp_path / "a"), "--e2e", str(E2E), "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "device 'iphonexs', runtime 'tflite-gpu'" in r.output and "the regressors of 'pixel4' adapted with" in r.output
    assert "kernels of 3 models; overhead: that of 'pixel4' scaled by" in r.output
    raw[raw.model.isin(set(test.model)) & (raw.device == "iphonexs")].to_parquet(tmp_path / "test.parquet", index=False)
    r = runner.invoke(app, ["predict", "--kernels", str(tmp_path / "test.parquet"), "--predictor", str(tmp_path / "b"),
                            "--allow-unknown", "--out", str(tmp_path / "pred.parquet")])
    assert r.exit_code == 0, r.output
    assert (pd.read_parquet(tmp_path / "pred.parquet").predicted_ms > 0).all()


def test_cli_kernel_transfer_refusals_are_one_line(split, tmp_path):
    source, few, _, _ = split
    source.save(tmp_path / "a")
    few.to_parquet(tmp_path / "few.parquet", index=False)

    def refused(*args: str) -> str:
        proc = leti("fit", *args)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        return proc.stderr.strip()

    assert refused("--transfer-from-predictor", str(tmp_path / "a"), "--out", str(tmp_path / "q")) == \
        "error: --transfer-from-predictor needs --kernels (the new device's measured kernels)"
    assert "--param does not apply with --transfer-from-predictor" in refused(
        "--kernels", str(tmp_path / "few.parquet"), "--transfer-from-predictor", str(tmp_path / "a"),
        "--param", "n_estimators=5", "--out", str(tmp_path / "q"))
    # the source's own device: not a transfer
    few.assign(device="pixel4").to_parquet(tmp_path / "same.parquet", index=False)
    msg = refused("--kernels", str(tmp_path / "same.parquet"), "--transfer-from-predictor", str(tmp_path / "a"),
                  "--out", str(tmp_path / "q"))
    assert "kernels are of device 'pixel4'" in msg and "another device" in msg
    # another precision: refused naming both
    few.assign(precision="int8").to_parquet(tmp_path / "int8.parquet", index=False)
    msg = refused("--kernels", str(tmp_path / "int8.parquet"), "--transfer-from-predictor", str(tmp_path / "a"),
                  "--out", str(tmp_path / "q"))
    assert "precision 'int8'" in msg and "precision 'float'" in msg and "one precision" in msg
    # a folder that is not a kernel predictor
    msg = refused("--kernels", str(tmp_path / "few.parquet"), "--transfer-from-predictor", str(tmp_path),
                  "--out", str(tmp_path / "q"))
    assert str(tmp_path) in msg
    # too few kernels
    few.head(2).to_parquet(tmp_path / "two.parquet", index=False)
    assert "at least 3 measured kernels of the new device, got 2" in refused(
        "--kernels", str(tmp_path / "two.parquet"), "--transfer-from-predictor", str(tmp_path / "a"),
        "--out", str(tmp_path / "q"))
    assert not (tmp_path / "q").exists()


def test_overhead_fitted_afresh_with_enough_models_and_source_kept_without_e2e(split):
    source, few, test, lat = split
    b = read_kernel_table(OPS, "iphonexs")
    many = b[~b.model.isin(set(test.model))]
    many = many[many.model.isin(sorted(set(many.model))[:14])]
    assert many.model.nunique() >= many.kernel_type.nunique() + 4
    adapted = adapt_kernel_predictor(source, many, lat, "iphonexs")
    assert adapted.overhead_note == f"overhead fitted on {many.model.nunique()} models"
    assert adapted.overhead.n_models == many.model.nunique() and adapted.overhead.coef != source.overhead.coef
    bare = adapt_kernel_predictor(source, few, None, "iphonexs")
    assert bare.overhead is source.overhead and "as is" in bare.overhead_note

