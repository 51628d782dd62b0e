import json

from typer.testing import CliRunner

from leti.cli import app
from tests.engine.conftest import SMALL

runner = CliRunner()


def test_convert_info_run_profile(tmp_path):
    out = tmp_path / "c.leti"
    r = runner.invoke(app, ["engine", "convert", SMALL.to_json(), "--input-size", "8", "--channels", "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and "wrote" in r.output
    r = runner.invoke(app, ["engine", "info", str(out)])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["inputs"] == {"input": [1, 8, 8, 8]} and info["metadata"]["hash"] == SMALL.hash
    assert info["memory"]["host"]["arena_bytes"] <= info["memory"]["host"]["naive_bytes"]
    r = runner.invoke(app, ["engine", "run", str(out), "--runs", "3", "--warmup", "1", "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output.strip().splitlines()[-1])
    assert stats["count"] == 3 and stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
    r = runner.invoke(app, ["engine", "profile", str(out), "--runs", "2"])
    assert r.exit_code == 0 and "conv2d" in r.output and "arena" in r.output
    r = runner.invoke(app, ["engine", "profile", str(out), "--runs", "3", "--threads", "1", "--in-run"])
    assert r.exit_code == 0 and "conv2d" in r.output, r.output
    total = float(r.output.split("total ")[1].split(" ms")[0])
    assert total > 0


def test_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.leti"
    bad.write_bytes(b"garbage" * 40)
    from leti.cli import main
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "from leti.cli import main; main()", "engine", "info", str(bad)],
                       capture_output=True, text=True)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].startswith("error: ") and "not a .leti model" in p.stderr
    r = runner.invoke(app, ["engine", "check", str(bad)])
    assert r.exit_code != 0
    assert main is not None


def test_convert_refuses_a_leti_model_and_unknown_inputs(tmp_path, capsys):
    from tests.device.conftest import run_leti

    model = tmp_path / "c.leti"
    assert runner.invoke(app, ["engine", "convert", SMALL.to_json(), "--input-size", "8", "--channels", "8",
                               "-o", str(model)]).exit_code == 0
    before = model.read_bytes()
    code, _, err = run_leti(capsys, "engine", "convert", model, "-o", tmp_path / "again.leti")
    assert code == 1
    assert err.strip() == (f"error: {model} is already an engine model (.leti): run it as it is (leti engine run "
                           f"{model}); convert takes a model file (.tflite, .keras, .onnx), a cell as a .json file, or the "
                           f"cell's JSON text")
    assert model.read_bytes() == before and not (tmp_path / "again.leti").exists()
    code, _, err = run_leti(capsys, "engine", "convert", tmp_path / "net.txt", "-o", tmp_path / "x.leti")
    assert code == 1 and err.strip() == (f"error: '{tmp_path / 'net.txt'}' (not a file) is neither a model file "
                                         f"nor a cell: convert takes a model file (.tflite, .keras, .onnx), a cell as "
                                         f"a .json file, or the cell's JSON text")
    code, _, err = run_leti(capsys, "engine", "convert", tmp_path / "net.onnx", "-o", tmp_path / "x.leti")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "net.onnx" in err and err.startswith("error: ")


def test_uncalibrated_plan_is_close_to_the_calibrated_one(tmp_path, monkeypatch, capsys):
    """MNN's one-MUL-a-cycle constants made --no-calibrate ~9x too slow on a vectorised engine (issue 15). One thread:
    with the test run's other worker busy on both cores a two-thread calibration reads what the contention costs (a
    run's end waiting for its second thread: 6.9 ms for a 0.3 ms model in one CI run), which no minimum over runs
    removes; the one-thread constants are the same ones and read the same with the cores busy."""
    from tests.device.conftest import run_leti

    monkeypatch.setenv("LETI_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "c.leti"
    assert runner.invoke(app, ["engine", "convert", SMALL.to_json(), "--input-size", "32", "--channels", "64",
                               "-o", str(model)]).exit_code == 0
    code, out, err = run_leti(capsys, "engine", "plan", model, "--backend", "cpu:1", "--no-calibrate", "--json")
    assert code == 0 and "note: --no-calibrate predicts from fixed constants" in err
    guessed = json.loads(out)["predicted_ms"]
    code, out, err = run_leti(capsys, "engine", "plan", model, "--backend", "cpu:1", "--json")
    assert code == 0 and err == ""
    measured = json.loads(out)["predicted_ms"]
    assert measured / 4 < guessed < 3 * measured, (guessed, measured)
