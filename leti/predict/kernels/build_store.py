"""The state of a kernel build in SQLite (``out/kernels.sqlite``): what was planned, what was measured.

Why SQLite, row by row: a build runs for an hour on a shared machine and may be stopped at any moment. Each
planned model (a kernel, a calibration model, a probe) is a row written before it is measured (``pending``)
and completed the moment its measurement ends (``ok`` with the split kernels and the paired ratio, or
``failed`` with the reason), in its own transaction: an interrupted build loses at most the model it was
timing, and a rerun measures the pending rows of the round it was in before planning anything new. The
wall time spent (conversion, measurement, fits) is kept here after every row, so a rerun with the same
budget only spends what is left. Values are JSON text; nothing is pickled.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from leti.errors import DatasetError, LetiError

FORMAT = "leti-kernel-build"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,                     -- kernel | calibration | network | probe
    name TEXT NOT NULL UNIQUE,
    round INTEGER NOT NULL,
    origin TEXT NOT NULL,                   -- real | uniform | adaptive | calibration | probe
    kernel_type TEXT NOT NULL,
    config TEXT NOT NULL,                   -- JSON: a KernelConfig, or {"steps": [...], "seed": s}
    status TEXT NOT NULL DEFAULT 'pending', -- pending | ok | failed
    kernels TEXT,                           -- JSON records: the split kernel rows
    ratio REAL, ratio_std REAL, ref_ms REAL, mean_ms REAL, runs INTEGER,
    seconds REAL, error TEXT, measured_at TEXT
);
CREATE TABLE IF NOT EXISTS rounds (round INTEGER PRIMARY KEY, planned INTEGER NOT NULL, fit_s REAL,
                                   cv TEXT, finished_at TEXT);
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class BuildStore:
    """One build's SQLite file. ``bind(**identity)`` fixes what the build is (device, runtime, seed, ...): a
    rerun with another identity is refused, naming the difference."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._host_noted = False
        try:
            self.db = sqlite3.connect(self.path)
            self.db.executescript(SCHEMA)
            fmt = self.get("format")
        except sqlite3.DatabaseError as exc:
            raise DatasetError(f"{self.path}: not a kernel build database ({exc})") from None
        if fmt is None:
            self.set("format", FORMAT)
        elif fmt != FORMAT:
            raise DatasetError(f"{self.path}: not a kernel build database (format {fmt!r})")

    # ---- meta ----------------------------------------------------------------------------------
    def get(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set(self, key: str, value) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def bind(self, **identity) -> None:
        have = self.get("identity")
        if have is None:
            self.set("identity", identity)
            return
        diff = [f"{k} {have.get(k)!r} (asked {v!r})" for k, v in identity.items() if have.get(k) != v]
        if diff:
            raise LetiError(f"{self.path.parent} holds a kernel build with other settings: {'; '.join(diff)}; "
                            "rerun with those settings to continue it, or use another --out")

    def spent_s(self) -> float:
        """Wall seconds this build has spent so far, over every run of it."""
        return float(self.get("spent_s", 0.0))

    def set_spent(self, seconds: float) -> None:
        self.set("spent_s", float(seconds))

    # ---- items ---------------------------------------------------------------------------------
    def plan(self, kind: str, items: list[tuple[str, str, str, dict]], round_: int) -> int:
        """Add ``(name, origin, kernel_type, config)`` rows as pending (names already present are kept)."""
        with self.db:
            cur = self.db.executemany(
                "INSERT OR IGNORE INTO items (kind, name, round, origin, kernel_type, config) VALUES (?,?,?,?,?,?)",
                [(kind, n, round_, o, t, json.dumps(c, sort_keys=True)) for n, o, t, c in items])
        return cur.rowcount

    def pending(self, kind: str | None = None) -> list[dict]:
        q = "SELECT id, kind, name, round, origin, kernel_type, config FROM items WHERE status='pending'"
        args: tuple = ()
        if kind:
            q += " AND kind=?"
            args = (kind,)
        cols = ("id", "kind", "name", "round", "origin", "kernel_type", "config")
        return [dict(zip(cols, r), config=json.loads(r[6])) for r in self.db.execute(q + " ORDER BY id", args)]

    def hosts(self) -> list[dict]:
        """The machines this build measured on (:func:`~leti.device.host.host_identity`), in order; empty for a store
        of before session 47, which did not record them."""
        return list(self.get("hosts", []))

    def _note_host(self) -> None:
        """Add this machine to :meth:`hosts` (a build continued on another machine lists both), once per store."""
        from leti.device.host import host_identity

        here, hosts = host_identity(), self.hosts()
        if not any(h.get("id") == here["id"] for h in hosts):
            self.set("hosts", [*hosts, here])
        self._host_noted = True

    def done(self, item_id: int, kernels: pd.DataFrame, m, seconds: float) -> None:
        if not self._host_noted:  # once, not a meta read per measured item
            self._note_host()
        with self.db:
            self.db.execute(
                "UPDATE items SET status='ok', kernels=?, ratio=?, ratio_std=?, ref_ms=?, mean_ms=?, runs=?, "
                "seconds=?, measured_at=? WHERE id=?",
                (kernels.to_json(orient="records"), float(m.ratio), float(m.ratio_std), float(m.ref_ms),
                 float(m.mean_ms), int(m.runs), float(seconds), _now(), item_id))

    def failed(self, item_id: int, error: str, seconds: float) -> None:
        with self.db:
            self.db.execute("UPDATE items SET status='failed', error=?, seconds=?, measured_at=? WHERE id=?",
                            (error[:500], float(seconds), _now(), item_id))

    def measured(self, kind: str) -> pd.DataFrame:
        """The ``ok`` rows of ``kind`` with their measurement columns (``config`` decoded, ``kernels`` as a list
        of kernel-row dicts)."""
        df = pd.read_sql_query("SELECT * FROM items WHERE kind=? AND status='ok' ORDER BY id", self.db,
                               params=(kind,))
        df["config"] = df["config"].map(json.loads)
        df["kernels"] = df["kernels"].map(json.loads)
        return df

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for kind, status, n in self.db.execute("SELECT kind, status, COUNT(*) FROM items GROUP BY kind, status"):
            out.setdefault(kind, {})[status] = n
        return out

    def expected_s(self, kind: str, guess_s: float) -> float:
        """Seconds the pending rows of ``kind`` are expected to take: their count times the mean of those of the kind
        measured (``guess_s`` before any was)."""
        pending, mean = self.db.execute("SELECT SUM(status='pending'), AVG(CASE WHEN status='ok' THEN seconds END) "
                                        "FROM items WHERE kind=?", (kind,)).fetchone()
        return float(pending or 0) * (guess_s if mean is None else float(mean))

    def kernel_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """(raw mean ms, seconds spent) of every measured kernel, ordered by ms: what measuring a kernel costs."""
        rows = self.db.execute("SELECT mean_ms, seconds FROM items WHERE kind='kernel' AND status='ok' "
                               "AND seconds > 0 AND mean_ms > 0 ORDER BY mean_ms").fetchall()
        costs = np.array(rows, np.float64).reshape(-1, 2)
        return costs[:, 0], costs[:, 1]

    def names(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM items")}

    # ---- rounds --------------------------------------------------------------------------------
    def rounds(self) -> list[dict]:
        cols = ("round", "planned", "fit_s", "cv", "finished_at")
        return [dict(zip(cols, r), cv=json.loads(r[3]) if r[3] else None)
                for r in self.db.execute("SELECT * FROM rounds ORDER BY round")]

    def start_round(self, round_: int, planned: int) -> None:
        with self.db:
            self.db.execute("INSERT OR IGNORE INTO rounds (round, planned) VALUES (?, ?)", (round_, planned))

    def finish_round(self, round_: int, fit_s: float, cv: dict) -> None:
        with self.db:
            self.db.execute("UPDATE rounds SET fit_s=?, cv=?, finished_at=? WHERE round=?",
                            (float(fit_s), json.dumps(cv), _now(), round_))

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> BuildStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
