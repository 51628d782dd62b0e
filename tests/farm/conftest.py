"""One real multi-node Ray cluster for the farm tests (``leti.farm.rehearse``: 2 nodes, each with its own
adb server and 2 loopback phones whose runs take a fixed time), shared by the module, and the helpers
that run ``leti`` as a user does (a subprocess) against it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Phone models of the rehearsal: node2-phone2 is another model (for --split across models).
MODELS = ["LETI Loopback", "LETI Loopback", "LETI Loopback", "Pixel 7"]
PROTOCOL = ["--runs", "3", "--warmup", "1", "--max-rel-std", "1.0", "--max-attempts", "1"]


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """The running rehearsal; at the end every raylet, worker and adb server it started is gone."""
    import psutil

    from leti.farm.rehearse import Rehearsal

    r = Rehearsal(2, 2, root=tmp_path_factory.mktemp("farm"), run_ms=2, models=MODELS).start()
    pids = [p.process.pid for node in r.nodes.values() for procs in node.all_processes.values() for p in procs]
    ports = list(r.adb_ports.values())
    try:
        yield r
    finally:
        r.shutdown()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes of the rehearsal left running: {alive}"
    import socket

    for port in ports:  # each node's adb server is gone too
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"an adb server still listens on {port}"


@pytest.fixture(scope="module")
def table(tmp_path_factory, nb101_space) -> Path:
    """A cell table of 3 cells with a stand-in model file per cell beside it (the runner only times)."""
    from leti.spaces.spec import ModelSpec
    from leti.spaces.table_file import cell_table, write_table

    root = tmp_path_factory.mktemp("table")
    cells = list(nb101_space.sample(3, seed=11))
    spec = ModelSpec("cell", (32, 32, 64), 64)
    path = write_table(cell_table(cells, spec), root / "cells.parquet", spec)
    (root / "tflite").mkdir()
    for c in cells:
        (root / "tflite" / f"{c.hash}.tflite").write_bytes(b"TFL3" + bytes(64))
    return path


def leti(*args, timeout: float = 120, wait: bool = True):
    """``leti ARGS`` in a subprocess with this test's PYTHONPATH: (exit code, stdout, stderr), or the Popen."""
    cmd = [sys.executable, "-m", "leti", *map(str, args)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def measure_args(farm, table, db, device, *extra):
    return ["measure", "--cluster", farm.address, "--device", device, "--cells", table, "--db", db,
            "--benchmark-binary", farm.binary, *PROTOCOL, *extra]
