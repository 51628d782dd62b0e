"""fp32 → int8 transfer (issues 17 and 19): the int8 local-CPU dataset from the fp32 one of the same cells.

A source of another precision is accepted on purpose (its devices named with it), and only that: any other
difference of model is still refused naming both files. The fitted predictor describes the int8 model.
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from leti.cli import app

runner = CliRunner()
DS = Path(__file__).resolve().parents[2] / "datasets"
INT8, FP32 = DS / "nb101_local_cpu_int8.parquet", DS / "nb101_local_cpu.parquet"


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r, str(r.exception) if r.exception else ""


def leti(*args):
    return subprocess.run([sys.executable, "-m", "leti", *map(str, args)], capture_output=True, text=True)


def test_evaluate_int8_from_fp32(tmp_path):
    r, exc = run("evaluate", "--dataset", INT8, "--transfer-from", FP32, "--train-size", "10,20", "--seeds", "0",
                 "--predictors", "transfer-ridge,flops", "--out", tmp_path / "E")
    assert r.exit_code == 0, (r.output, exc)
    res = json.loads((tmp_path / "E" / "results.json").read_text())
    assert res["sources"] == ["local:cpu@fp32"] and list(res["devices"]) == ["local:cpu"]
    tr = res["devices"]["local:cpu"]["transfer-ridge"]["train_sizes"]
    cells = pd.read_parquet(INT8, columns=["hash"]).hash.nunique()  # every int8 cell: train or test
    for n in ("10", "20"):
        assert tr[n]["seeds"][0]["train"] == int(n) and tr[n]["seeds"][0]["test"] == cells - int(n)
        # the fp32 latencies of the same cells rank the int8 ones (0.99 at N = 10 on three seeds)
        assert tr[n]["mean"]["spearman"] > 0.95, tr[n]["mean"]


def test_fit_records_int8_and_predict_refuses_fp32_cells(tmp_path):
    r, exc = run("fit", "--dataset", INT8, "--transfer-from", FP32, "--train-size", 10, "--out", tmp_path / "P")
    assert r.exit_code == 0, (r.output, exc)
    assert "local:cpu <- local:cpu@fp32" in r.output
    manifest = json.loads((tmp_path / "P" / "manifest.json").read_text())
    assert manifest["model"]["precision"] == "int8"
    r, exc = run("predict", "--predictor", tmp_path / "P", "--cells", DS / "nb101_local_cpu_int8.cells.parquet",
                 "--out", tmp_path / "int8.parquet")
    assert r.exit_code == 0, (r.output, exc)
    p = leti("predict", "--predictor", tmp_path / "P", "--cells", DS / "nb101_local_cpu.cells.parquet",
             "--out", tmp_path / "fp32.parquet")
    assert p.returncode != 0 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "int8 models, not fp32" in p.stderr and "nb101_local_cpu.cells.parquet" in p.stderr
    assert not (tmp_path / "fp32.parquet").exists()


def test_other_differences_still_refused(tmp_path):
    """int8 cells on 32x32x64 from the fp32 stacked network: not only the precision differs."""
    p = leti("evaluate", "--dataset", INT8, "--transfer-from", DS / "nb101_local_cpu_net32.parquet",
             "--train-size", "10", "--out", tmp_path / "x")
    assert p.returncode != 0 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "nb101_local_cpu_int8.parquet" in p.stderr and "nb101_local_cpu_net32.parquet" in p.stderr
    assert "stacked network" in p.stderr and "int8" in p.stderr and "precision only" in p.stderr
    assert not (tmp_path / "x").exists()
    # the same device at the same precision is the target, not a source
    r, exc = run("fit", "--dataset", INT8, "--transfer-from", INT8, "--train-size", 10, "--out", tmp_path / "y")
    assert r.exit_code != 0 and "target device 'local:cpu'" in exc and "among the sources" in exc
    # choose: int8 candidates from fp32 sources are fine, the stacked network's cells are not
    r, exc = run("choose", "--dataset", FP32, "--cells", DS / "nb101_local_cpu_int8.cells.parquet", "--budget", 5,
                 "--out", tmp_path / "chosen.parquet")
    assert r.exit_code == 0, (r.output, exc)
    r, exc = run("choose", "--dataset", FP32, "--cells", DS / "nb101_local_cpu_net32.parquet", "--budget", 5,
                 "--out", tmp_path / "bad.parquet")
    assert r.exit_code != 0 and "different models" in exc and not (tmp_path / "bad.parquet").exists()
