"""LETI's engine as a measured device: EngineDevice on the CPU, the `engine` / `cuda-engine` names, a
campaign through the CLI (`leti measure --device engine` → `leti export`; exports that put several
runtimes in one file are in tests/campaign/test_export.py). The cuda-engine tests need a GPU with CuPy and
skip cleanly without one."""

import json
import sqlite3

import pandas as pd
from pathlib import Path

import pytest

from tests.device.conftest import run_leti

from leti.errors import CorruptModelError, DeviceError
from leti.spaces.spec import ModelSpec
from leti.spaces.table_file import cell_table, write_table

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("engine-device-models")

SPEC = ModelSpec("cell", (8, 8, 4), 4)


def _has_cuda_engine() -> bool:
    from leti.engine.backends.cuda import available

    return available()


def leti(capsys, *args) -> tuple[int, str, str]:
    return run_leti(capsys, *args)


@pytest.fixture(scope="module")
def leti_models(tmp_path_factory, cells):
    """.leti files of three real cells (tiny input), written by the export format registry."""
    from leti.models.export import export_models

    root = tmp_path_factory.mktemp("leti-models")
    recs = export_models(cells[:3], root, SPEC, formats=("leti",))
    return [rec["paths"]["leti"] for rec in recs]


@pytest.fixture(scope="module")
def table(tmp_path_factory, cells):
    chosen = cells[:3]
    path = write_table(cell_table(chosen, SPEC), tmp_path_factory.mktemp("table") / "cells.parquet", SPEC)
    return path, [c.hash for c in chosen]


def rows(db) -> pd.DataFrame:
    with sqlite3.connect(db) as c:
        return pd.read_sql_query("SELECT * FROM measurements", c)


# ---- the device --------------------------------------------------------------------------------
def test_engine_device_times_leti_models_under_the_protocol(leti_models):
    from leti.device.protocol import Protocol, measure
    from leti.device.engine import EngineDevice

    with EngineDevice("cpu", threads=1) as dev:
        info = dev.info()
        assert (info["id"], info["backend"], info["runtime"], info["threads"]) == ("engine", "cpu", "leti-engine", 1)
        assert dev.artifact == "leti" and dev.shares_host_cpu
        assert "numba" in dev.tool_versions()
        m = measure(dev, leti_models[0], Protocol(runs=30, warmup=2, max_rel_std=100))
        assert m.runs == 30 and m.attempts == 1 and m.stable and m.delegation == "cpu"
        assert 0 < m.min_ms <= m.median_ms <= m.max_ms and m.min_ms <= m.mean_ms <= m.max_ms
        a = measure(dev, leti_models[1], Protocol(runs=60, warmup=2, adaptive=True, ci_rel=0.5, max_rel_std=100,
                                                  max_attempts=1))
        assert 20 <= a.runs <= 60  # batches pooled: stops at the target or at the cap, never before min_runs
        assert a.ci_half_width_ms <= 0.5 * a.mean_ms or a.runs == 60
        b = dev.run(leti_models[1], 3, 0)
        assert b.n == 3 and len(b.samples) == 3  # per-run samples are kept (exact median)
        # paired with a reference: both sessions stay loaded, the ratio of the model to itself is one
        # (six blocks of each, so that one block disturbed by the shared host cannot move the median)
        pm = measure(dev, leti_models[1], Protocol(runs=300, warmup=2, max_rel_std=100), reference=leti_models[1])
        assert pm.ratio == pytest.approx(1.0, rel=0.2) and pm.ref_ms > 0
        pm = measure(dev, leti_models[1], Protocol(runs=40, warmup=2, max_rel_std=100), reference=leti_models[0])
        assert pm.ratio > 0 and len(dev._loaded) == 2
        dev.release(leti_models[1])
        assert Path(leti_models[1]) not in dev._loaded and len(dev._loaded) == 1
        dev.close()
        assert not dev._loaded


def test_a_broken_leti_file_is_a_corrupt_model_and_a_missing_one_too(tmp_path):
    from leti.device.engine import EngineDevice

    bad = tmp_path / "bad.leti"
    bad.write_bytes(b"LETI" + b"\x00" * 40)
    with EngineDevice("cpu") as dev:
        with pytest.raises(CorruptModelError):
            dev.run(bad, 3, 0)
        with pytest.raises(CorruptModelError, match="not found"):
            dev.run(tmp_path / "gone.leti", 3, 0)


def test_registry_names_the_engine_and_cuda_devices():
    from leti.device.engine import EngineDevice
    from leti.device.registry import KINDS, open_device

    assert {"local", "engine", "cuda", "cuda-engine"} <= set(KINDS)
    dev = open_device("engine", threads=2)
    assert isinstance(dev, EngineDevice) and dev.backend == "cpu" and dev.threads == 2
    with pytest.raises(DeviceError, match="cuda device measures on the GPU"):
        open_device("cuda", backend="cpu")
    with pytest.raises(DeviceError, match="unknown backend"):
        open_device("engine", backend="npu")
    with pytest.raises(DeviceError, match="threads must be"):
        open_device("engine", threads=0)


@pytest.mark.skipif(_has_cuda_engine(), reason="checks the message on machines without a GPU")
def test_cuda_engine_without_a_gpu_is_one_clear_line():
    from leti.device.registry import open_device

    for name, backend in (("cuda-engine", None), ("engine", "gpu")):
        with pytest.raises(DeviceError, match="needs CuPy and an NVIDIA GPU") as e:
            open_device(name, backend=backend)
        assert "\n" not in str(e.value)


# ---- a campaign through the CLI ----------------------------------------------------------------
def test_cli_campaign_on_the_engine_resumes_and_exports(capsys, table, tmp_path):
    path, hashes = table
    db, out = tmp_path / "engine.sqlite", tmp_path / "ds" / "engine_cpu.parquet"
    args = ("measure", "--device", "engine", "--cells", path, "--db", db, "--runs", 8, "--warmup", 1,
            "--passes", 2, "--max-rel-std", 100, "--threads", 1)
    code, out_text, err = leti(capsys, *args)
    assert code == 0, err
    assert "measured 6, failed 0" in out_text
    r = rows(db)
    assert len(r) == 6 and set(r["status"]) == {"ok"} and set(r["hash"]) == set(hashes)
    assert set(r["device_id"]) == {"engine"} and set(r["delegation"]) == {"cpu"} and set(r["runs"]) == {8}
    assert sorted(p.suffix for p in (tmp_path / "engine.sqlite.models").iterdir()) == [".leti"] * 3

    code, out_text, _ = leti(capsys, *args)  # rerun: resumes, measures nothing twice
    assert code == 0 and "measured 0, failed 0, already done 6" in out_text
    assert len(rows(db)) == 6

    code, out_text, err = leti(capsys, "export", "--db", db, "--out", out, "--max-pass-spread", 100)  # tiny, noisy
    assert code == 0, err
    df = pd.read_parquet(out)
    assert len(df) == 6 and set(df["runtime"]) == {"leti-engine"} and set(df["device_id"]) == {"engine"}
    assert set(df["pass"]) == {1, 2} and (df["flops"] > 0).all() and (df["median_ms"] > 0).all()
    side = json.loads(out.with_name("engine_cpu.device.json").read_text())
    assert side["device"]["runtime"] == "leti-engine" and side["model_spec"] == SPEC.to_dict()
    assert "runtime leti-engine" in out.with_name("engine_cpu.README.md").read_text()


def test_cli_refuses_a_gpu_backend_on_the_local_device(capsys, table, tmp_path):
    path, _ = table
    code, _, err = leti(capsys, "measure", "--device", "local", "--backend", "gpu", "--cells", path,
                        "--db", tmp_path / "x.sqlite")
    assert code != 0 and err.startswith("error: the local device has no 'gpu' backend")
    assert len(err.strip().splitlines()) == 1


# ---- on a GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda_engine(), reason="no CUDA GPU with CuPy")
def test_cuda_engine_measures_with_cuda_graphs(leti_models):
    from leti.device.protocol import Protocol, measure
    from leti.device.registry import open_device

    with open_device("cuda-engine") as dev:
        info = dev.info()
        assert (info["id"], info["backend"], info["runtime"], info["cuda_graphs"]) == ("cuda-engine", "gpu",
                                                                                       "leti-engine", True)
        m = measure(dev, leti_models[2], Protocol(runs=50, warmup=5, max_rel_std=100))
        assert m.runs == 50 and m.delegation == "cuda" and 0 < m.min_ms <= m.median_ms <= m.max_ms
        assert m.mem_peak_mb > 0
        assert dev._loaded[Path(leti_models[2])][0].captured >= 1  # the run is one CUDA graph replay
