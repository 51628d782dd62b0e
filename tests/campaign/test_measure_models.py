"""``leti measure --models``: any model files measured with the same protocol, store, resume and
export as cell campaigns, as a user runs the command (the ``leti`` entry point in-process)."""

import shutil
import sqlite3

import pandas as pd
import pytest

from tests.device.conftest import run_leti
from tests.engine.models_for_import import tiny_keras, tiny_torch_onnx

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("measure-models-zoo")

FAST = ("--runs", 5, "--warmup", 1, "--max-rel-std", 100, "--passes", 2)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A folder with two tiny .tflite files, and an engine folder with a .keras and an .onnx file."""
    import keras

    from leti.models.tflite import convert_keras

    root = tmp_path_factory.mktemp("zoo")
    tfl = root / "tflite"
    tfl.mkdir()
    inp = keras.Input((8, 8, 3), batch_size=1)
    data = convert_keras(keras.Model(inp, keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)))
    for i in range(2):  # the same bytes under two names: two models (the name is part of the identity)
        (tfl / f"net{i}.tflite").write_bytes(data)
    (tfl / "notes.txt").write_text("not a model")
    eng = root / "engine"
    eng.mkdir()
    tiny_keras(8).save(eng / "tiny.keras")
    tiny_torch_onnx(eng / "tiny.onnx", 8)
    return tfl, eng


def rows(db):
    with sqlite3.connect(db) as c:
        return pd.read_sql_query("SELECT hash, pass, status FROM measurements ORDER BY hash, pass", c)


def test_local_tflite_folder_measures_resumes_and_exports_model_names(zoo, tmp_path, capsys):
    tfl, _ = zoo
    db = tmp_path / "zoo.sqlite"
    code, out, err = run_leti(capsys, "measure", "--models", tfl, "--device", "local", "--db", db, *FAST)
    assert code == 0, err
    assert "measured 4, failed 0, already done 0" in out
    first = rows(db)
    assert len(first) == 4 and set(first["status"]) == {"ok"} and first["hash"].str.len().eq(32).all()
    code, out, err = run_leti(capsys, "measure", "--models", tfl, "--device", "local", "--db", db, *FAST)
    assert code == 0 and "measured 0, failed 0, already done 4" in out, err
    pd.testing.assert_frame_equal(rows(db), first)
    data = tmp_path / "zoo.parquet"
    code, out, err = run_leti(capsys, "export", "--db", db, "--out", data, "--max-pass-spread", 100)
    assert code == 0, err
    df = pd.read_parquet(data)
    assert sorted(df["model"].unique()) == ["net0.tflite", "net1.tflite"] and len(df) == 4
    assert (df["mean_ms"] > 0).all() and df["matrix"].isna().all()
    # a changed file is a new model: refused without --extend, measured with it
    shutil.copyfile(tfl / "net0.tflite", tmp_path / "net0.tflite")
    (tmp_path / "net0.tflite").write_bytes((tmp_path / "net0.tflite").read_bytes() + b"\0")
    code, out, err = run_leti(capsys, "measure", "--models", tfl / "net1.tflite", "--models", tmp_path / "net0.tflite",
                              "--device", "local", "--db", db, *FAST)
    assert code != 0 and err.count("\n") == 1 and "1 of the 2 given are not in it" in err and "--extend" in err
    pd.testing.assert_frame_equal(rows(db), first)


def test_engine_device_converts_keras_and_onnx_on_the_fly(zoo, tmp_path, capsys):
    _, eng = zoo
    db = tmp_path / "engine.sqlite"
    code, out, err = run_leti(capsys, "measure", "--models", eng / "tiny.keras", "--models", eng / "tiny.onnx",
                              "--device", "engine", "--db", db, *FAST)
    assert code == 0, err
    assert "measured 4, failed 0" in out
    data = tmp_path / "engine.parquet"
    assert run_leti(capsys, "export", "--db", db, "--out", data, "--max-pass-spread", 100)[0] == 0
    df = pd.read_parquet(data)
    assert sorted(df["model"].unique()) == ["tiny.keras", "tiny.onnx"] and set(df["runtime"]) == {"leti-engine"}


def test_onnx_on_a_tflite_device_is_a_stored_failure_and_bad_input_is_one_line(zoo, tmp_path, capsys):
    tfl, eng = zoo
    db = tmp_path / "mixed.sqlite"
    code, out, err = run_leti(capsys, "measure", "--models", tfl / "net0.tflite", "--models", eng / "tiny.onnx",
                              "--device", "local", "--db", db, *FAST)
    assert code == 0 and "measured 2, failed 2" in out, err
    assert set(rows(db)["status"]) == {"ok", "convert_failed"}
    for args, msg in [
        (("--models", tfl, "--cells", tmp_path / "c.parquet"), "give either --cells (a cell table) or --models"),
        ((), "give either --cells (a cell table) or --models (model files), not neither"),
        (("--models", tmp_path / "missing"), "no such model file or folder"),
        (("--models", tfl / "notes.txt"), "not a model file"),
        (("--models", tfl, "--network"), "--network/--cell applies to --cells campaigns"),
        (("--models", tfl, "--reference", "nothere.tflite"),
         "--reference 'nothere.tflite' is neither 'auto', 'none' nor one of the --models files"),
    ]:
        code, out, err = run_leti(capsys, "measure", *args, "--device", "local", "--db", tmp_path / "bad.sqlite", *FAST)
        assert code != 0 and err.startswith("error: ") and err.count("\n") == 1 and msg in err, (args, err)


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """Three .tflite files of 4, 8 and 16 output channels (multiply-accumulates grow with the width)."""
    import keras

    from leti.models.tflite import convert_keras

    root = tmp_path_factory.mktemp("sized")
    for name, c in (("small", 4), ("mid", 8), ("big", 16)):
        inp = keras.Input((8, 8, 3), batch_size=1)
        (root / f"{name}.tflite").write_bytes(convert_keras(keras.Model(inp, keras.layers.Conv2D(c, 3)(inp))))
    return root


def test_reference_auto_is_the_model_of_median_macs_and_a_name_picks_a_file(sized):
    from leti.campaign.measure_models import collect_models, pick_reference_model

    entries = collect_models([sized])
    assert pick_reference_model("auto", entries).name == "mid.tflite"
    assert pick_reference_model("big", entries).name == "big.tflite"
    assert pick_reference_model("small.tflite", entries).name == "small.tflite"
    assert pick_reference_model("none", entries) is None


def test_paired_model_campaign_stores_ratios_and_the_datasheet_names_the_reference(sized, tmp_path, capsys):
    db = tmp_path / "paired.sqlite"
    code, out, err = run_leti(capsys, "measure", "--models", sized, "--device", "local", "--db", db,
                              "--reference", "auto", *FAST)
    assert code == 0 and "measured 6, failed 0" in out, err
    with sqlite3.connect(db) as c:
        got = pd.read_sql_query("SELECT hash, ratio, ref_ms FROM measurements", c)
    assert got["ratio"].notna().all() and (got["ref_ms"] > 0).all()
    data = tmp_path / "paired.parquet"
    assert run_leti(capsys, "export", "--db", db, "--out", data, "--max-pass-spread", 100)[0] == 0
    df = pd.read_parquet(data)
    by_model = df.groupby("model")["corrected_ms"].median()
    assert (df["corrected_ms"] > 0).all() and by_model["mid.tflite"] == pytest.approx(
        df["ref_ms"].median() * df[df["model"] == "mid.tflite"]["ratio"].median(), rel=0.5)
    sheet = (tmp_path / "paired.README.md").read_text()
    assert "reference model mid.tflite (" in sheet
    # the campaign's reference is part of its identity: another one is refused, rows kept
    code, out, err = run_leti(capsys, "measure", "--models", sized, "--device", "local", "--db", db,
                              "--reference", "big", *FAST)
    assert code != 0 and err.startswith("error: ") and err.count("\n") == 1 and "reference" in err, err
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 6


def test_cpu_clock_campaign_records_its_clock_and_refuses_what_it_cannot_honour(sized, tmp_path, capsys):
    import json

    db = tmp_path / "cpu.sqlite"
    for args, msg in [
        (("--clock", "sundial"), "unknown clock 'sundial'; known: wall, cpu"),
        (("--clock", "cpu", "--threads", "2"), "--clock cpu: local times runs by wall only"),
    ]:
        code, out, err = run_leti(capsys, "measure", "--models", sized, "--device", "local", "--db", db, *args, *FAST)
        assert code != 0 and err.startswith("error: ") and err.count("\n") == 1 and msg in err, (args, err)
        if db.exists():
            with sqlite3.connect(db) as c:
                assert c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 0
    code, out, err = run_leti(capsys, "measure", "--cells", tmp_path / "cells.parquet", "--cluster", "auto",
                              "--device", "all", "--db", db, "--clock", "cpu")
    assert code != 0 and err.count("\n") == 1 and "the devices of a --cluster use the wall clock" in err, err
    code, out, err = run_leti(capsys, "measure", "--models", sized, "--device", "local", "--db", db,
                              "--clock", "cpu", "--reference", "auto", *FAST)
    assert code == 0 and "measured 6, failed 0" in out, err
    data = tmp_path / "cpu.parquet"
    assert run_leti(capsys, "export", "--db", db, "--out", data, "--max-pass-spread", 100)[0] == 0
    assert json.loads((tmp_path / "cpu.device.json").read_text())["protocol"]["clock"] == "cpu"
    assert (pd.read_parquet(data)["corrected_ms"] > 0).all()
    # the clock is part of the campaign's protocol: resuming it on the wall clock is refused, rows kept
    code, out, err = run_leti(capsys, "measure", "--models", sized, "--device", "local", "--db", db,
                              "--reference", "auto", *FAST)
    assert code != 0 and err.count("\n") == 1 and "protocol" in err, err
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 6
