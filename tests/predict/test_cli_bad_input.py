"""`leti fit` / `leti predict` fed bad input as a user would: one line naming what and where, a
non-zero exit, nothing written — and a predictor applied to another model than it was fitted on."""

import json
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli.test_bad_input import unwritable_places
from tests.device.conftest import run_leti

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("predict-cli-work")


def with_latency(table, path):
    """A dataset: the table's rows with a latency, keeping the table's LETI metadata (its model)."""
    t = pq.read_table(table)
    df = t.to_pandas()
    df["latency_ms"] = df["flops"] / 1e8 * (1 + 0.03 * (df.index % 4))
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(t.schema.metadata), path)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    from typer.testing import CliRunner

    from leti.cli import app, main  # noqa: F401  (the commands registered)

    def leti_ok(*args):  # in-process (four interpreter start-ups and imports saved), exit code checked as before
        res = CliRunner().invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, (args, res.output, res.exception)

    root = tmp_path_factory.mktemp("predict-cli")
    for name, args in {"c64": [], "c16": ["--channels", "16"], "net": ["--network", "--stacks", "1", "--modules", "1",
                                                                     "--channels", "16"]}.items():
        leti_ok("generate", "--sample", "24", "--seed", "2", *args, "--out", root / name)
    with_latency(root / "c64" / "cells.parquet", root / "ds64.parquet")
    leti_ok("fit", "--dataset", root / "ds64.parquet", "--predictor", "ransac", "--out", root / "ransac")
    return root


def test_predict_refuses_another_model(capsys, work, tmp_path):
    for other, described in (("c16", "one cell on 32x32x16 (16 channels)"),
                             ("net", "stacked network (32x32x3 input, stem 16, 1x1 modules)")):
        out = tmp_path / f"{other}.parquet"
        code, _, err = run_leti(capsys, "predict", "--predictor", work / "ransac",
                                "--cells", work / other / "cells.parquet", "--out", out)
        assert code == 2
        assert err.strip() == (f"error: {work / 'ransac'} was fitted on one cell on 32x32x64 (64 channels), but "
                               f"{work / other / 'cells.parquet'} describes {described}; fit a predictor on "
                               f"measurements of that model")
        assert not out.exists()
    code, out, err = run_leti(capsys, "predict", "--predictor", work / "ransac", "--cells", work / "c64" / "cells.parquet")
    assert code == 0 and err == "" and len(out.strip().splitlines()) == 25
    assert json.loads((work / "ransac" / "manifest.json").read_text())["model"] == {
        "kind": "cell", "input_shape": [32, 32, 64], "channels": 64}


def test_old_predictor_without_model_still_predicts_with_a_warning(capsys, work, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(work / "ransac", old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["model"], manifest["files"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_leti(capsys, "predict", "--predictor", old, "--cells", work / "c16" / "cells.parquet",
                            "--out", tmp_path / "p.parquet")
    assert code == 0
    assert err.strip() == (f"warning: {old} was saved by an older LETI that did not record which model it was "
                           f"fitted on; cannot check that it suits {work / 'c16' / 'cells.parquet'}")
    assert len(pd.read_parquet(tmp_path / "p.parquet")) == 24


def test_null_matrix_names_the_row(capsys, work, tmp_path):
    t = pq.read_table(work / "c64" / "cells.parquet")
    df = t.to_pandas().head(5)
    df.loc[3, "matrix"] = None
    bad = tmp_path / "null.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(t.schema.metadata), bad)
    code, _, err = run_leti(capsys, "predict", "--predictor", work / "ransac", "--cells", bad,
                            "--out", tmp_path / "p.parquet")
    assert code == 2 and err.strip() == f"error: {bad} row 3: matrix is null"
    assert not (tmp_path / "p.parquet").exists()


@pytest.mark.parametrize("field, value, shown", [
    ("params", [1, 2], "list [1, 2]"),
    ("space", "nb101", "str 'nb101'"),
    ("name", 5, "int 5"),
    ("format_version", "1", "str '1'"),
    ("state", None, "NoneType None"),
])
def test_malformed_manifest_names_file_and_field(capsys, work, tmp_path, field, value, shown):
    bad = tmp_path / "bad"
    shutil.copytree(work / "ransac", bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest[field] = value
    (bad / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_leti(capsys, "predict", "--predictor", bad, "--cells", work / "c64" / "cells.parquet")
    assert code == 1
    assert err.strip() == f"error: {bad / 'manifest.json'}: field {field!r} is malformed ({shown})"


def test_manifest_with_bad_values_names_the_field(capsys, work, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(work / "ransac", bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["model"] = {"kind": "blob"}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_leti(capsys, "predict", "--predictor", bad, "--cells", work / "c64" / "cells.parquet")
    assert code == 1 and err.startswith(f"error: {bad / 'manifest.json'}: field 'model'") and "'blob'" in err
    manifest["model"], manifest["state"] = None, {"coef": "x"}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_leti(capsys, "predict", "--predictor", bad, "--cells", work / "c64" / "cells.parquet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {bad / 'manifest.json'}: field 'state' is malformed (")


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("family, params, native", [
    ("xgboost", ["n_estimators=10"], "model.json"),
    ("lightgbm", ["n_estimators=10"], "model.txt"),
    ("catboost", ["n_estimators=10"], "model.cbm"),
    ("gcn", ["epochs=1", "hidden=8", "layers=1"], "model.pt"),
])
def test_truncated_native_model_file(capsys, work, tmp_path, family, params, native):
    folder = tmp_path / family
    args = [a for p in params for a in ("--param", p)]
    code, _, err = run_leti(capsys, "fit", "--dataset", work / "ds64.parquet", "--predictor", family, *args,
                            "--out", folder)
    assert code == 0, err
    truncate(folder / native)
    code, _, err = run_leti(capsys, "predict", "--predictor", folder, "--cells", work / "c64" / "cells.parquet")
    assert code == 1
    assert err.strip() == (f"error: {folder / native}: model file is truncated or damaged (its SHA-256 differs "
                           f"from the one recorded in manifest.json)")
    # a predictor saved before the checksums: the library's own failure, in one line naming the file
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_leti(capsys, "predict", "--predictor", folder, "--cells", work / "c64" / "cells.parquet")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / native}: not a readable "), err


def test_fit_out_that_cannot_be_written(capsys, work, tmp_path):
    before = (work / "ds64.parquet").read_bytes()
    for label, place in unwritable_places(tmp_path):
        code, _, err = run_leti(capsys, "fit", "--dataset", work / "ds64.parquet", "--predictor", "ransac",
                                "--out", place)
        assert code == 1, label
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --out {place}: cannot write there ("), (label, err)
    assert (work / "ds64.parquet").read_bytes() == before


def test_predict_out_that_cannot_be_written(capsys, work, tmp_path):
    for label, place in unwritable_places(tmp_path):
        target = f"{place}/pred.parquet"
        code, _, err = run_leti(capsys, "predict", "--predictor", work / "ransac", "--cells",
                                work / "c64" / "cells.parquet", "--out", target)
        assert code == 1, label
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --out {target}: cannot write there ("), (label, err)


@pytest.mark.parametrize("args, message", [
    (["fit", "--predictor", "ransac", "--train-size", "5", "--seed", "-1"],
     "--seed must be zero or a positive whole number, got -1"),
    (["evaluate", "--predictors", "flops", "--train-size", "5", "--seeds", "0,-2"],
     "--seeds must be zero or positive whole numbers, got '0,-2'"),
    (["evaluate", "--predictors", "flops", "--train-size", "5", "--folds", "0"],
     "--folds must be at least 1 (1 = no model selection), got 0"),
])
def test_fit_and_evaluate_refuse_bad_numbers(capsys, work, tmp_path, args, message):
    code, _, err = run_leti(capsys, *args, "--dataset", work / "ds64.parquet", "--out", tmp_path / "o")
    assert code == 1 and err.strip() == f"error: {message}"
    assert not (tmp_path / "o").exists()


def test_table_without_model_description_is_predicted_with_a_warning(capsys, work, tmp_path):
    plain = tmp_path / "plain.parquet"
    pd.read_parquet(work / "c16" / "cells.parquet").to_parquet(plain)  # pandas drops LETI's metadata
    code, out, err = run_leti(capsys, "predict", "--predictor", work / "ransac", "--cells", plain)
    assert code == 0 and len(out.strip().splitlines()) == 25
    assert err.strip() == (f"warning: {plain} does not record which model its cells stand for (not a table LETI "
                           f"wrote); cannot check it is one cell on 32x32x64 (64 channels), what "
                           f"{work / 'ransac'} was fitted on")
