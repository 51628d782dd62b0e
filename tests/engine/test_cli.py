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
