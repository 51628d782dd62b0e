"""Memory of an engine session against a TFLite interpreter on the same model (issue 20's memory target:
process growth of a session <= 1.5x TFLite's, and the engine's activation arena <= TFLite's).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_engine_memory.py [--resnet] [--threads 1]

Each (runtime, model) runs in a fresh child process, which reads its resident set size (``/proc/self/statm``):

* ``import``: after importing the runtime (``ai_edge_litert``; ``leti.engine`` with its CPU kernels module);
* ``cold``: growth from there to after the first session of the model ran once — what a user's first
  session costs, libraries loaded on first use included (LETI's C kernels, or MKL from torch's wheel with
  ``LETI_BLAS=mkl``, numba's compiled kernels read from its cache, XNNPACK's packed weights);
* ``warm``: growth of a second session of the same model, made while the first is still open (freed pages
  would be reused and hide it) — the session's own memory (model read from the file, weights, packed copies,
  arena), with every library already in memory.

The engine's arena is its memory plan's (``Session.describe()["memory"]``); TFLite does not expose its arena
to Python, so its column is the interpreter's whole warm growth, an upper bound of its arena. Runtimes run
one after the other (memory, unlike time, does not drift with the host's load); the load average is printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def child(runtime: str, path: str, threads: int) -> dict:
    """Run in a fresh process: import, one session (cold), close it, a second one (warm)."""
    import numpy as np

    if runtime == "tflite":
        from ai_edge_litert.interpreter import Interpreter

        def session():
            it = Interpreter(model_path=path, num_threads=threads)
            it.allocate_tensors()
            d = it.get_input_details()[0]
            it.set_tensor(d["index"], np.zeros(d["shape"], np.float32))
            it.invoke()
            return it, None
    else:
        import leti.engine.backends.cpu.kernels  # noqa: F401 - the backend's kernels module, as an import
        from leti.engine.convert import load_model
        from leti.engine.session import Session

        def session():
            graph = load_model(path)  # inside: TFLite's interpreter reads its weights from the file too
            s = Session(graph, backends=("cpu",), threads=threads).resize()
            x = {t: np.zeros(shape, np.float32) for t, shape in s.shapes.items() if t in graph.inputs}
            s.run(x)
            return s, s.describe()["memory"]["host"]["arena_bytes"]
    base = rss_mib()
    first, arena = session()
    cold = rss_mib() - base
    gc.collect()
    mid = rss_mib()
    second, _ = session()  # the first stays alive: freed pages would be reused and hide the growth
    warm = rss_mib() - mid
    del first, second
    return {"import_mib": base, "cold_mib": cold, "warm_mib": warm, "arena_mib": None if arena is None else arena / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("RUNTIME", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--resnet", action="store_true", help="add ResNet50 (224)")
    ap.add_argument("--blas", default="leti,mkl,openblas", help="engine GEMM paths to compare (LETI_BLAS)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.threads)))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_engine_cpu import models

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.threads} thread(s)")
    tmp = Path(tempfile.mkdtemp(prefix="leti_mem_"))
    runtimes = [("tflite", {})] + [(f"engine/{b}", {"LETI_BLAS": b}) for b in args.blas.split(",")]
    print(f"{'model':28s} {'runtime':15s} {'import':>7s} {'cold':>7s} {'warm':>7s} {'arena':>7s}   (MiB)")
    worst = []
    for name, data in models(1, True, resnet=args.resnet):
        path = tmp / f"{name.replace(' ', '_')}.tflite"
        path.write_bytes(data)
        rows = {}
        for rt, env in runtimes:
            out = subprocess.run([sys.executable, __file__, "--child", rt.split("/")[0], str(path),
                                  "--threads", str(args.threads)], capture_output=True, text=True,
                                 env={**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "3"})
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
            if line is None:
                print(f"{name:28s} {rt:15s} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
            r = rows[rt] = json.loads(line)
            arena = "" if r["arena_mib"] is None else f"{r['arena_mib']:7.1f}"
            print(f"{name:28s} {rt:15s} {r['import_mib']:7.1f} {r['cold_mib']:7.1f} {r['warm_mib']:7.1f} {arena:>7s}",
                  flush=True)
        t = rows.get("tflite")
        for rt, r in rows.items():
            if rt != "tflite" and t:
                worst.append((r["cold_mib"] / max(t["cold_mib"], 1e-3), r["warm_mib"] / max(t["warm_mib"], 1e-3),
                              r["arena_mib"] / max(t["warm_mib"], 1e-3), name, rt))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for cold, warm, arena, name, rt in worst:
        print(f"{name:28s} {rt:15s} engine/tflite growth: cold {cold:5.2f}x  warm {warm:5.2f}x  "
              f"arena/tflite-warm {arena:5.2f}x")
    # The last line is the engine as shipped (its own GEMMs, `engine/leti`); MKL and OpenBLAS are fallbacks
    # (`LETI_BLAS`) whose libraries alone cost 50-190 MiB, reported on the line above it.
    default = [r for r in worst if r[4] == "engine/leti"]
    for label, rows in (("every GEMM path", worst), ("the engine's own GEMMs", default)):
        if rows:
            w, a = max(rows, key=lambda r: r[0]), max(rows, key=lambda r: r[2])
            print(f"engine/tflite worst session growth (cold), {label}: {w[0]:.2f} ({w[3]}, {w[4]}); "
                  f"worst arena/tflite-warm {a[2]:.2f} ({a[3]})")


if __name__ == "__main__":
    main()
