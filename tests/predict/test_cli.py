import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from leti.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory, nb201_frame):
    d = nb201_frame[nb201_frame.device.isin(["eyeriss", "gold_6226"])]
    keep = d.arch_index < 500
    path = tmp_path_factory.mktemp("data") / "small.parquet"
    d[keep].to_parquet(path)
    return path


def test_fit_then_predict(small_dataset, tmp_path):
    r = runner.invoke(app, ["fit", "--dataset", str(small_dataset), "--device", "eyeriss", "--predictor",
                            "catboost-rich", "--param", "n_estimators=50", "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["params"]["n_estimators"] == 50
    cells = pd.read_parquet(small_dataset)
    cells = cells[cells.device == "eyeriss"][["arch"]].head(20)
    cells.to_parquet(tmp_path / "cells.parquet")
    r = runner.invoke(app, ["predict", "--predictor", str(tmp_path / "m"), "--cells", str(tmp_path / "cells.parquet"),
                            "--out", str(tmp_path / "pred.parquet")])
    assert r.exit_code == 0, r.output
    pred = pd.read_parquet(tmp_path / "pred.parquet")
    assert len(pred) == 20 and (pred.predicted_ms > 0).all()


def test_evaluate_writes_table_json_and_plots(small_dataset, tmp_path):
    r = runner.invoke(app, ["evaluate", "--dataset", str(small_dataset), "--train-size", "200", "--predictors",
                            "flops,ransac_cluster,xgboost", "--seeds", "0,1", "--folds", "2",
                            "--set", "xgboost.n_estimators=40", "--out", str(tmp_path / "ev")])
    assert r.exit_code == 0, r.output
    assert "ransac_cluster" in r.output and "eyeriss" in r.output
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    xgb = res["devices"]["gold_6226"]["xgboost"]
    assert len(xgb["seeds"]) == 2 and xgb["seeds"][0]["train"] == 200 and xgb["seeds"][0]["test"] == 300
    assert len(xgb["seeds"][0]["cv"]) == 3  # the three candidates of the grid were cross-validated
    assert 0 <= xgb["mean"]["acc@10%"] <= 1
    assert (tmp_path / "ev" / "scatter_eyeriss.png").stat().st_size > 1000
    assert "| flops |" in (tmp_path / "ev" / "table.md").read_text()


def test_errors_are_one_line(tmp_path, small_dataset):
    (tmp_path / "junk.parquet").write_text("not parquet")
    r = runner.invoke(app, ["fit", "--dataset", str(tmp_path / "junk.parquet"), "--predictor", "flops",
                            "--out", str(tmp_path / "m")])
    assert r.exit_code != 0 and "not a readable Parquet" in str(r.exception)
    r = runner.invoke(app, ["fit", "--dataset", str(small_dataset), "--predictor", "flops", "--out", str(tmp_path / "m")])
    assert r.exit_code != 0 and "several devices" in str(r.exception)
    r = runner.invoke(app, ["predict", "--predictor", str(tmp_path), "--cells", str(small_dataset)])
    assert r.exit_code != 0 and "not a LETI predictor" in str(r.exception)
    r = runner.invoke(app, ["evaluate", "--dataset", str(small_dataset), "--predictors", "nope", "--out",
                            str(tmp_path / "e")])
    assert r.exit_code != 0 and "unknown predictor 'nope'" in str(r.exception)


def test_help_has_examples():
    for cmd in ("evaluate", "fit", "predict"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Example: leti " + cmd in r.output


def test_predict_prints_csv_without_out(small_dataset, tmp_path):
    r = runner.invoke(app, ["fit", "--dataset", str(small_dataset), "--device", "gold_6226", "--predictor", "ransac",
                            "--train-size", "100", "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    cells = pd.read_parquet(small_dataset).head(5)
    cells.to_parquet(tmp_path / "c.parquet")
    r = runner.invoke(app, ["predict", "--predictor", str(tmp_path / "m"), "--cells", str(tmp_path / "c.parquet")])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "," in ln]
    assert lines[0].startswith("arch,") and lines[0].endswith("predicted_ms") and len(lines) == 6
