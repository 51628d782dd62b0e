"""Op profiling end to end, as a user runs it: `leti measure --models ... --device <serial> --op-profiling`
through adbutils, a real adb server and the loopback phone (whose benchmark_model stand-in prints the op
tables), the op rows stored, `leti export` writing `<stem>.ops.parquet` lined up with LETI's kernel split,
and `leti fit --kernels` on that file; old databases without the op tables still export."""

import json
import sqlite3

import pandas as pd
import pytest

from tests.device.conftest import run_leti

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("op-profiling-zoo")

FAST = ("--runs", 5, "--warmup", 1, "--passes", 2, "--max-rel-std", 100, "--offline-wait", 2)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Three small real CNNs as .tflite files (large enough that their convolutions take microseconds)."""
    import keras

    from leti.models.tflite import convert_keras

    root = tmp_path_factory.mktemp("opzoo")
    inp = keras.Input((32, 32, 8), batch_size=1)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(48, 1, activation="relu")(x)
    nets = {"mbblock": keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))}
    inp = keras.Input((24, 24, 16), batch_size=1)
    y = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    y = keras.layers.MaxPooling2D(2)(keras.layers.Add()([inp, y]))
    nets["residual"] = keras.Model(inp, keras.layers.Dense(8)(keras.layers.Flatten()(y)))
    inp = keras.Input((16, 16, 8), batch_size=1)
    nets["plain"] = keras.Model(inp, keras.layers.Conv2D(64, 3, activation="relu")(inp))
    for name, net in nets.items():
        (root / f"{name}.tflite").write_bytes(convert_keras(net))
    return root


def test_op_profiles_are_stored_exported_lined_up_and_fitted(capsys, phone, runner_binary, zoo, tmp_path):
    db = tmp_path / "phone.sqlite"
    code, out, err = run_leti(capsys, "measure", "--models", zoo, "--device", phone.serial, "--db", db,
                              "--benchmark-binary", runner_binary, "--op-profiling", *FAST)
    assert code == 0, err
    assert "measured 6, failed 0" in out
    with sqlite3.connect(db) as c:
        ops = pd.read_sql_query("SELECT * FROM op_times", c)
        profiles = pd.read_sql_query("SELECT * FROM op_profiles", c)
        timed = pd.read_sql_query("SELECT raw_log, runs FROM measurements", c)
    assert len(profiles) == 6 and (profiles["n_ops"] > 0).all()
    assert "--enable_op_profiling" not in " ".join(timed["raw_log"]) and (timed["runs"] == 5).all()  # timed runs unprofiled
    assert "Operator-wise Profiling Info for Regular Benchmark Runs" in profiles["raw_log"].iloc[0]
    assert not ops.duplicated(["hash", "pass", "op_index"]).any()
    assert set(ops["node_type"]) >= {"CONV_2D", "DEPTHWISE_CONV_2D", "MEAN", "FULLY_CONNECTED", "ADD", "MAX_POOL_2D"}
    assert "AllocateTensors" not in set(ops["node_type"])  # the initialization section is no op
    assert ops.groupby(["hash", "pass"]).size().to_dict() == profiles.set_index(["hash", "pass"])["n_ops"].to_dict()

    # a model file changed after its measurement: its rows cannot be lined up, and the datasheet says so
    (zoo / "plain.tflite").write_bytes((zoo / "plain.tflite").read_bytes() + b"\0")
    ds = tmp_path / "ds" / "phone.parquet"
    code, out, err = run_leti(capsys, "export", "--db", db, "--out", ds, "--max-pass-spread", 100)
    assert code == 0, err
    table = pd.read_parquet(ds.with_name("phone.ops.parquet"))
    assert f"op rows of 3 models to {ds.with_name('phone.ops.parquet')}" in out
    assert set(table["model"]) == {"mbblock.tflite", "residual.tflite", "plain.tflite"}
    assert (table["passes"] == 2).all() and (table["runtime"] == "tflite-xnnpack").all()
    mb = table[table["model"] == "mbblock.tflite"].set_index("kernel_index")
    assert mb["aligned"].all() and list(mb["kernel_type"]) == ["conv2d", "depthwise_conv2d", "conv2d", "mean", "dense"]
    assert (mb["input_h"].iloc[0], mb["input_c"].iloc[0], mb["output_c"].iloc[0], mb["kernel_h"].iloc[0]) == (32, 8, 32, 3)
    assert (mb["groups"].iloc[1], mb["output_c"].iloc[2], mb["fused"].iloc[0]) == (32, 48, "relu")
    res = table[table["model"] == "residual.tflite"]
    assert res["aligned"].sum() == len(res) - (res["kernel_type"] == "reshape").sum() > 0  # Flatten: a view
    plain = table[table["model"] == "plain.tflite"]
    assert not plain["aligned"].any() and not plain["usable"].any() and plain["input_h"].isna().all()
    assert list(plain["kernel_type"]) == ["conv2d"] and (plain["latency_ms"] > 0).all()  # the type and time kept
    assert (table["usable"] == (table["aligned"] & (table["latency_ms"] > 0))).all()
    sheet = ds.with_name("phone.README.md").read_text()
    assert "**2 rows keep only their type**: 1 of the 1 models that did not line up (below), 1 of ops that are no " \
        "kernel" in sheet and "- plain.tflite: its model file was not found" in sheet
    assert "6 exported measurements were followed by one op-profiled" in sheet
    side = json.loads(ds.with_name("phone.device.json").read_text())
    assert side["summary"]["op_table"]["usable_rows"] == int(table["usable"].sum())

    pred = tmp_path / "P"
    code, out, err = run_leti(capsys, "fit", "--kernels", ds.with_name("phone.ops.parquet"), "--out", pred)
    assert code == 0, err
    assert "wrote kernel-level predictor for device" in out and "'tflite-xnnpack'" in out
    assert f"left out {int((~table['usable']).sum())} rows" in out
    manifest = json.loads((pred / "manifest.json").read_text())
    assert {"conv2d", "depthwise_conv2d"} <= set(manifest["kernels"]["types"])

    # predicting every row of the file refuses the rows without shapes, naming one
    code, _, err = run_leti(capsys, "predict", "--kernels", ds.with_name("phone.ops.parquet"), "--predictor", pred)
    assert code != 0 and err.count("\n") == 1 and "has no shapes: its op profile did not line up" in err


def test_old_database_without_op_tables_exports_and_op_profiling_needs_a_phone(capsys, zoo, tmp_path):
    db = tmp_path / "old.sqlite"
    args = ("measure", "--models", zoo / "mbblock.tflite", "--device", "local", "--db", db, *FAST)
    assert run_leti(capsys, *args)[0] == 0
    with sqlite3.connect(db) as c:  # a database written before op profiling existed
        c.executescript("DROP TABLE op_times; DROP TABLE op_profiles;")
    ds = tmp_path / "old.parquet"
    code, out, err = run_leti(capsys, "export", "--db", db, "--out", ds, "--max-pass-spread", 100)
    assert code == 0, err
    assert len(pd.read_parquet(ds)) == 2 and not ds.with_name("old.ops.parquet").exists() and "op rows" not in out
    assert "Op profiles" not in ds.with_name("old.README.md").read_text()
    code, out, err = run_leti(capsys, *args)  # resumed for writing: migrated, nothing measured again
    assert code == 0 and "already done 2" in out, err
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM op_times").fetchone() == (0,)
    code, _, err = run_leti(capsys, *args, "--op-profiling")
    assert code != 0 and err.count("\n") == 1
    assert err.startswith("error: --op-profiling reads the op profiler of TFLite's benchmark_model: it needs an adb phone")


def test_a_cell_campaign_lines_up_from_its_model_cache(capsys, phone, runner_binary, cells, tmp_path):
    from leti.spaces.spec import ModelSpec
    from leti.spaces.table_file import cell_table, write_table

    spec = ModelSpec("cell", (8, 8, 4), 4)
    table = write_table(cell_table(cells[:2], spec), tmp_path / "t" / "cells.parquet", spec)
    db = tmp_path / "cells.sqlite"
    code, out, err = run_leti(capsys, "measure", "--cells", table, "--device", phone.serial, "--db", db,
                              "--benchmark-binary", runner_binary, "--op-profiling", *FAST[:4], "--passes", 1,
                              "--max-rel-std", 100)
    assert code == 0 and "measured 2, failed 0" in out, err
    ds = tmp_path / "cells.parquet"
    code, out, err = run_leti(capsys, "export", "--db", db, "--out", ds, "--max-pass-spread", 100)
    assert code == 0, err
    ops = pd.read_parquet(ds.with_name("cells.ops.parquet"))
    assert set(ops["model"]) == {c.hash for c in cells[:2]} and (ops["passes"] == 1).all()
    assert ops.groupby("model")["aligned"].any().all(), ops[["model", "kernel_type", "aligned"]]
    code, _, err = run_leti(capsys, "measure", "--cells", table, "--cluster", "auto", "--device", "all",
                            "--op-profiling", "--db", tmp_path / "farm.sqlite")
    assert code != 0 and err == "error: --op-profiling measures one adb phone (--device SERIAL), not a --cluster\n"
