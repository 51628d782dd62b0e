"""`leti measure` / `leti export` on bad input and over a campaign's life, as a user runs them (the ``leti``
entry point: one-line errors, exit codes), on the local device with tiny cells: every refusal names what
and where, exits non-zero, and leaves the rows already stored as they were."""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.device.conftest import run_leti

from leti.spaces.spec import ModelSpec
from leti.spaces.table_file import cell_table, write_table

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("cli-edges-campaign")

SPEC = ModelSpec("cell", (8, 8, 4), 4)
FAST = ("--device", "local", "--runs", 5, "--warmup", 1, "--max-rel-std", 100)


def leti(capsys, *args) -> tuple[int, str, str]:
    """The ``leti`` entry point in-process, as the console script runs it: exit code, stdout, stderr."""
    return run_leti(capsys, *args)


def one_line(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def rows(db):
    with sqlite3.connect(db) as c:
        return pd.read_sql_query("SELECT hash, pass, status, finished_at FROM measurements ORDER BY hash, pass", c)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tables(tmp_path_factory, cells):
    """Two tables: A (cells 0-1) and B (cells 1-2), written by the library as `leti generate` does."""
    root = tmp_path_factory.mktemp("tables")
    a = write_table(cell_table(cells[:2], SPEC), root / "a" / "cells.parquet", SPEC)
    b = write_table(cell_table(cells[1:3], SPEC), root / "b" / "cells.parquet", SPEC)
    return a, b


@pytest.fixture(scope="session")
def finished(tmp_path_factory, tables, shared_cache):
    """A finished one-pass campaign of table A (copied by the tests that change it)."""
    from leti.campaign.measure import measure_table

    db = tmp_path_factory.mktemp("finished") / "a.sqlite"
    measure_table(tables[0], "local", db, protocol={"runs": 5, "warmup": 1, "max_rel_std": 100.0}, passes=1,
                  cache_dir=shared_cache)
    return db


def copy_db(db, to):
    to.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, to / db.name)
    return to / db.name


def test_bad_counts_and_empty_or_null_tables_are_refused_and_rows_kept(capsys, tables, finished, tmp_path,
                                                                       shared_cache):
    db = copy_db(finished, tmp_path)
    before = rows(db)
    base = ("measure", *FAST, "--cells", tables[0], "--db", db, "--cache-dir", shared_cache)
    for option, value, message in (("--passes", 0, "--passes must be at least 1, not 0"),
                                   ("--passes", -1, "--passes must be at least 1, not -1"),
                                   ("--runs", 0, "--runs must be at least 1, not 0"),
                                   ("--warmup", -1, "--warmup must be at least 0, not -1"),
                                   ("--max-attempts", 0, "--max-attempts must be at least 1, not 0"),
                                   ("--threads", 0, "--threads must be at least 1, not 0"),
                                   ("--cache-mb", 0, "--cache-mb must be at least 1, not 0")):
        code, _, err = leti(capsys, *base, option, value)
        assert code == 1 and one_line(err) and message in err, (option, err)

    df = pq.read_table(tables[0])
    empty = tmp_path / "empty.parquet"
    pq.write_table(df.slice(0, 0), empty)
    code, _, err = leti(capsys, "measure", *FAST, "--cells", empty, "--db", db)
    assert code == 2 and err == f"error: {empty} has no cells; nothing to measure\n"

    frame = df.to_pandas()
    frame["matrix"] = [m if i != 1 else None for i, m in enumerate(frame["matrix"])]
    null = tmp_path / "null.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(df.schema.metadata), null)
    code, _, err = leti(capsys, "measure", *FAST, "--cells", null, "--db", db)
    assert code == 2 and one_line(err)
    assert err == f"error: {null} row 1 (hash {frame['hash'][1]}): 'matrix' is empty\n"
    pd.testing.assert_frame_equal(rows(db), before)


def test_another_table_is_refused_unless_extend_and_passes_can_be_added(capsys, tables, finished, tmp_path,
                                                                        shared_cache):
    db = copy_db(finished, tmp_path)
    before = rows(db)
    assert len(before) == 2
    base = ("measure", *FAST, "--db", db, "--cache-dir", shared_cache)
    code, _, err = leti(capsys, *base, "--cells", tables[1], "--passes", 1)
    assert code == 1 and one_line(err)
    assert err == (f"error: {db} holds a campaign of 2 cells, but {tables[1]} has 2, 1 of them not in the "
                   "campaign; pass --extend to add them to this campaign, or use another --db\n")
    pd.testing.assert_frame_equal(rows(db), before)

    code, out, err = leti(capsys, *base, "--cells", tables[1], "--passes", 1, "--extend")
    assert code == 0, err
    assert "adding 1 cells of" in out and "measured 1, failed 0, already done 2" in out
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM cells").fetchone()[0] == 3

    # the first table again (part of the campaign now), with a second pass added later
    code, out, err = leti(capsys, *base, "--cells", tables[0], "--passes", 2)
    assert code == 0, err
    assert "adding pass 2 to the campaign's 1" in out and "measured 3, failed 0, already done 3" in out
    after = rows(db)
    assert len(after) == 6 and not after.duplicated(["hash", "pass"]).any()
    kept = after.merge(before, on=["hash", "pass"], suffixes=("", "_0"))
    assert len(kept) == 2 and (kept["finished_at"] == kept["finished_at_0"]).all()

    code, _, err = leti(capsys, *base, "--cells", tables[0], "--passes", 1)
    assert code == 1 and one_line(err) and f"{db} holds a campaign of 2 passes; --passes 1 would drop some" in err
    pd.testing.assert_frame_equal(rows(db), after)
    out_path = tmp_path / "ds.parquet"
    assert leti(capsys, "export", "--db", db, "--out", out_path)[0] == 0
    assert '"passes": 2' in (tmp_path / "ds.device.json").read_text()


def test_corrupt_models_all_fail_exit_non_zero_and_retry_regenerates_them(capsys, cells, tmp_path):
    table = write_table(cell_table(cells[3:5], SPEC), tmp_path / "t" / "cells.parquet", SPEC)
    (tmp_path / "t" / "tflite").mkdir()
    for c in cells[3:5]:
        (tmp_path / "t" / "tflite" / f"{c.hash}.tflite").write_bytes(b"not a flatbuffer" * 8)
    db = tmp_path / "c.sqlite"
    base = ("measure", *FAST, "--cells", table, "--db", db, "--passes", 1)
    code, out, err = leti(capsys, *base)
    assert code == 1 and one_line(err)
    assert err.startswith("error: every measurement failed (2 of 2: 2 load_failed); first, cell ")
    assert f"The rows are kept in {db}; fix the cause and rerun with --retry-failed" in err
    assert set(rows(db)["status"]) == {"load_failed"} and len(rows(db)) == 2

    code, out, err = leti(capsys, *base, "--retry-failed")
    assert code == 0, err
    assert "retrying 2 failed measurements" in out
    assert f"regenerating 2 models that failed to load instead of reusing their files in {tmp_path / 't' / 'tflite'}" in out
    assert set(rows(db)["status"]) == {"ok"} and len(rows(db)) == 2


def read_only(folder):
    """Make ``folder`` read-only for a `leti` run: a command prefix (chmod for a user; as root, where chmod
    stops nothing, a read-only bind mount in a private user/mount namespace), or None when neither works."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    q = str(folder).replace("'", "")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind '{q}' '{q}' && mount -o remount,ro,bind "
                            f"'{q}' '{q}' && ! touch '{q}/.probe' 2>/dev/null"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        return None
    return ["unshare", "-rm", "sh", "-c", f"mount --bind '{q}' '{q}' && mount -o remount,ro,bind '{q}' '{q}' "
            '&& exec "$@"', "sh"]


def leti_cmd(*args):
    return [os.path.join(os.path.dirname(sys.executable), "leti"), *map(str, args)]


def test_unwritable_db_and_out_paths_are_one_line_and_read_only_export_works(capsys, tables, finished, tmp_path):
    a_file = tables[0]  # a regular file: nothing can be made under it
    code, _, err = leti(capsys, "measure", *FAST, "--cells", a_file, "--db", a_file / "x" / "c.sqlite")
    assert code == 2 and err == (f"error: cannot write the campaign database {a_file / 'x' / 'c.sqlite'}: "
                                 f"{a_file} is a file, not a folder\n")
    code, _, err = leti(capsys, "measure", *FAST, "--cells", a_file, "--db", "/proc/leti/c.sqlite")
    assert code == 2 and err == "error: cannot write the campaign database /proc/leti/c.sqlite: No such file or directory\n"
    for out in (a_file / "ds.parquet", "/proc/ds.parquet"):
        code, _, err = leti(capsys, "export", "--db", finished, "--out", out)
        assert code == 2 and one_line(err) and err.startswith(f"error: cannot write the dataset {out}: ")
    assert not os.path.exists("/proc/ds.parquet.tmp")

    media = tmp_path / "media"
    db = copy_db(finished, media)
    before = rows(db)
    prefix = read_only(media)
    if prefix is None:
        pytest.skip("cannot make a read-only folder here (root without user namespaces); the other cases ran")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = lambda *a: subprocess.run(prefix + leti_cmd(*a), capture_output=True, text=True, env=env, timeout=300)
    try:
        r = run("export", "--db", db, "--out", tmp_path / "ds" / "a.parquet")
        assert r.returncode == 0, r.stderr
        assert "wrote 2 rows" in r.stdout and len(pd.read_parquet(tmp_path / "ds" / "a.parquet")) == 2
        r = run("export", "--db", db, "--out", media / "a.parquet")
        assert r.returncode == 2 and r.stderr.startswith(f"error: cannot write the dataset {media / 'a.parquet'}: ")
        assert r.stderr.count("\n") == 1
        r = run("measure", *FAST, "--cells", tables[0], "--db", db, "--passes", 2)
        assert r.returncode == 2 and r.stderr.startswith(f"error: cannot write the campaign database {db}: ")
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    finally:
        media.chmod(0o755)
    pd.testing.assert_frame_equal(rows(db), before)


def test_a_killed_run_leaves_nothing_in_tmp_and_its_work_folder_goes_next_time(capsys, cells, tmp_path):
    table = write_table(cell_table(cells[5:9], SPEC), tmp_path / "t" / "cells.parquet", SPEC)
    db = tmp_path / "c.sqlite"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(leti_cmd("measure", *FAST, "--cells", table, "--db", db, "--passes", 1), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    work = tmp_path / "c.sqlite.work"
    while time.monotonic() < deadline and not (work.is_dir() and any(work.iterdir())):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert work.is_dir(), "the run never made its work folder"
    assert not list(tmp.iterdir())  # nothing left under TMPDIR: the work files were in the work folder
    code, out, err = leti(capsys, "measure", *FAST, "--cells", table, "--db", db, "--passes", 1)
    assert code == 0, err
    assert not work.exists() and len(rows(db)) == 4
