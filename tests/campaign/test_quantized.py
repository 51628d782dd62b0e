"""int8 campaigns on the local CPU as a user runs them: `leti measure` → `leti export` → `leti fit`, the
precision in the campaign identity, delegate coverage in every row (a partly delegated int8 model), the
fp32/int8 speed-up join, the fp32↔int8 predictor refusal, and databases written before these columns."""

import json
import sqlite3
import sys

import pandas as pd
import pytest

from tests.device.conftest import run_leti

from leti.cli import main
from leti.errors import DatasetError
from leti.predict.speedup import quantization_speedup
from leti.spaces.spec import ModelSpec
from leti.spaces.table_file import cell_table, write_table

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("quantized-campaigns")

INT8 = ModelSpec("cell", (8, 8, 4), 4, precision="int8")
FP32 = ModelSpec("cell", (8, 8, 4), 4)
FULL, PARTIAL = "b4943b7a73a0e9a0bb4de5b7bc5063b3", "48ad917faf1c9bba4243a98be6c58df0"
FAST = ("--runs", 5, "--warmup", 1, "--passes", 2, "--max-rel-std", 100)


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory, cells):
    """The same two cells measured as int8 and as fp32 on the local CPU, each exported."""
    root = tmp_path_factory.mktemp("int8")
    chosen = [c for c in cells if c.hash in (FULL, PARTIAL)]
    assert len(chosen) == 2
    out = {}
    for name, spec in (("int8", INT8), ("fp32", FP32)):
        table = write_table(cell_table(chosen, spec), root / name / "cells.parquet", spec)
        db, ds = root / f"{name}.sqlite", root / f"{name}.parquet"
        for args in (("measure", "--device", "local", "--cells", table, "--db", db, *FAST),
                     ("export", "--db", db, "--out", ds, "--max-pass-spread", 100)):
            old, sys.argv = sys.argv, ["leti", *map(str, args)]
            try:
                main()
            except SystemExit as e:
                assert not e.code, args
            finally:
                sys.argv = old
        out[name] = (table, db, ds)
    return out


def test_int8_rows_carry_precision_and_delegate_coverage(campaigns):
    _, db, ds = campaigns["int8"]
    df = pd.read_parquet(ds)
    assert set(df["precision"]) == {"int8"} and set(df["delegate"]) == {"XNNPACK"}
    full, part = df[df["hash"] == FULL], df[df["hash"] == PARTIAL]
    assert len(full) == 2 and len(part) == 2
    assert (full["cpu_nodes"] == 0).all() and full["fully_delegated"].all()
    # XNNPACK has no int8 kernel for one node of this cell: it runs on TFLite's own kernels, and says so
    assert (part["cpu_nodes"] == 1).all() and (part["total_nodes"] == 11).all() and not part["fully_delegated"].any()
    sheet = ds.with_name("int8.README.md").read_text()
    assert "Precision of the models: int8" in sheet
    assert "**2 rows partly delegated**" in sheet and "1 cells, up to 1 nodes" in sheet
    meta = json.loads(ds.with_name("int8.device.json").read_text())
    assert meta["model_spec"]["precision"] == "int8" and meta["summary"]["partly_delegated_rows"] == 2
    fp32 = pd.read_parquet(campaigns["fp32"][2])
    assert set(fp32["precision"]) == {"fp32"} and fp32[fp32["hash"] == FULL]["fully_delegated"].all()
    assert fp32["cpu_nodes"].notna().all()  # float rows carry their coverage too


def test_fp32_and_int8_campaigns_are_distinct(capsys, campaigns):
    table, db, _ = campaigns["int8"]
    before = sqlite3.connect(db).execute("SELECT count(*) FROM measurements").fetchone()[0]
    code, out, err = run_leti(capsys, "measure", "--device", "local", "--cells", table, "--db", db,
                              "--precision", "fp32", *FAST)
    assert code != 0 and err.count("\n") == 1
    assert f"{db} holds a campaign with model_spec=" in err and '"precision": "int8"' in err
    assert sqlite3.connect(db).execute("SELECT count(*) FROM measurements").fetchone()[0] == before
    with sqlite3.connect(campaigns["fp32"][1]) as c:  # the float campaign's stored spec is the old form
        spec = json.loads(c.execute("SELECT value FROM meta WHERE key='model_spec'").fetchone()[0])
    assert spec == {"kind": "cell", "input_shape": [8, 8, 4], "channels": 4}


def test_speedup_joins_on_hash(campaigns):
    s = quantization_speedup(campaigns["fp32"][2], campaigns["int8"][2])
    assert sorted(s["hash"]) == sorted([FULL, PARTIAL]) and list(s.columns) == ["hash", "fp32_ms", "int8_ms", "speedup"]
    assert (s["speedup"] > 0).all() and (s["speedup"] == s["fp32_ms"] / s["int8_ms"]).all()
    with pytest.raises(DatasetError, match="both hold int8 models"):
        quantization_speedup(campaigns["int8"][2], campaigns["int8"][2])


def test_fit_on_int8_and_refuse_fp32_cells(capsys, campaigns, tmp_path):
    code, out, err = run_leti(capsys, "fit", "--dataset", campaigns["int8"][2], "--predictor", "lightgbm",
                              "--out", tmp_path / "p8")
    assert code == 0, err
    assert json.loads((tmp_path / "p8" / "manifest.json").read_text())["model"]["precision"] == "int8"
    code, out, err = run_leti(capsys, "predict", "--predictor", tmp_path / "p8", "--cells", campaigns["int8"][0])
    assert code == 0 and FULL in out
    code, out, err = run_leti(capsys, "predict", "--predictor", tmp_path / "p8", "--cells", campaigns["fp32"][0])
    assert code != 0 and err.count("\n") == 1
    assert "(int8 models, not fp32: quantized and float latencies differ)" in err
    assert "one cell on 8x8x4 (4 channels, int8)" in err and "describes one cell on 8x8x4 (4 channels)" in err
    # and the reverse: a float predictor on an int8 table
    run_leti(capsys, "fit", "--dataset", campaigns["fp32"][2], "--predictor", "lightgbm", "--out", tmp_path / "p32")
    code, out, err = run_leti(capsys, "predict", "--predictor", tmp_path / "p32", "--cells", campaigns["int8"][0])
    assert code != 0 and "(fp32 models, not int8" in err


def test_a_database_without_the_new_columns_still_exports(capsys, campaigns, tmp_path):
    """A campaign written before precision and coverage existed: exported read-only, new columns empty."""
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(campaigns["fp32"][1]) as src, sqlite3.connect(old) as dst:
        src.backup(dst)
    with sqlite3.connect(old) as c:  # back to the first schema's columns
        for col in ("delegate", "delegated_nodes", "total_nodes"):
            c.execute(f"ALTER TABLE measurements DROP COLUMN {col}")
    code, out, err = run_leti(capsys, "export", "--db", old, "--out", tmp_path / "old.parquet", "--max-pass-spread", 100)
    assert code == 0, err
    df = pd.read_parquet(tmp_path / "old.parquet")
    assert set(df["precision"]) == {"fp32"} and df["delegated_nodes"].isna().all()
    assert df["fully_delegated"].isna().all() and len(df) == 4
    assert "Delegate coverage: not reported by this device." in (tmp_path / "old.README.md").read_text()
    assert {r[1] for r in sqlite3.connect(old).execute("PRAGMA table_info(measurements)")}.isdisjoint(
        {"delegate", "total_nodes"})  # exporting wrote nothing
