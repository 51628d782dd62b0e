"""``leti engine``: convert models to ``.leti``, run, profile, inspect and check them on the engine.

Thin wrappers over :mod:`leti.engine.tools` (backend policy, sessions, the TFLite check) and the
engine's API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from leti.cli.progress import progress
from leti.errors import LetiError

engine_app = typer.Typer(help="LETI's own inference engine (.leti models; CPU and CUDA backends, hybrid plans).", no_args_is_help=True)


@engine_app.command("convert")
def convert(
    source: str = typer.Argument(..., help="A .tflite, .keras, .onnx or .leti file, or a cell as JSON (a file or the "
                                 "JSON text)."),
    out: Path = typer.Option(..., "--out", "-o", help="The .leti file to write."),
    network: bool = typer.Option(False, "--network/--cell", help="Cell JSON: stacked network or one cell."),
    input_size: int = typer.Option(32, help="Cell JSON: input height and width."),
    channels: int = typer.Option(128, help="Cell JSON: cell input/output channels, or network stem channels."),
    seed: int = typer.Option(0, help="Cell JSON: weight seed."),
) -> None:
    """Convert a TFLite, Keras or ONNX model or a NB101 cell to a .leti model.

    Example: leti engine convert model.tflite -o model.leti

    Example: leti engine convert resnext.onnx -o resnext.leti  (4-D inputs become NHWC)
    Example: leti engine convert '{"matrix": [[0,1],[0,0]], "ops": ["input","output"]}' --network -o net.leti
    """
    from leti.engine import format as fmt
    from leti.engine.convert.from_cell import write_leti
    from leti.engine.convert import MODEL_SUFFIXES, load_model
    from leti.spaces.cell import Cell
    from leti.spaces.nb101_network import NetworkConfig

    src = Path(source)
    accepted = "convert takes a model file (.tflite, .keras, .onnx), a cell as a .json file, or the cell's JSON text"
    if src.suffix == ".leti":
        raise LetiError(f"{src} is already an engine model (.leti): run it as it is (leti engine run {src}); "
                        f"{accepted}")
    if src.suffix.lower() in MODEL_SUFFIXES:
        path = fmt.save(load_model(src), out)
    else:
        looks_json = source.lstrip().startswith("{")
        if not looks_json and src.suffix != ".json":
            what = "an existing file" if src.exists() else "not a file"
            raise LetiError(f"{source!r} ({what}) is neither a model file nor a cell: {accepted}")
        if src.suffix == ".json" and not src.is_file():
            raise LetiError(f"{src}: no such file ({accepted})")
        text = src.read_text() if src.suffix == ".json" else source
        cell = Cell.from_json(text)
        if network:
            path = write_leti(cell, out, kind="network", seed=seed,
                              config=NetworkConfig(input_size=input_size, stem_channels=channels))
        else:
            path = write_leti(cell, out, kind="cell", input_shape=(input_size, input_size, channels), seed=seed)
    g = fmt.load(path)
    typer.echo(f"wrote {path} ({path.stat().st_size:,} bytes, {len(g.nodes)} nodes, {g.num_params():,} weights)")


PRECISION_HELP = ("fp32, tf32, fp16 or bf16: how the CUDA backend computes (tf32: tensor-core products and "
                  "convolutions; fp16/bf16: tensors stored in 16 bits on the GPU). Needs --backend cuda or auto "
                  "for anything but fp32.")


@engine_app.command("run")
def run(
    model: Path = typer.Argument(..., help=".leti (or .tflite, converted on the fly) model."),
    runs: int = typer.Option(50, help="Timed runs."),
    warmup: int = typer.Option(5, help="Untimed runs first (numba compiles on the first one)."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (numba and BLAS); default: all."),
    backend: str = typer.Option("cpu", help="auto (CUDA+CPU planned by a cost model), cpu, cuda, or a list "
                                             "in order of preference (cpu:1,cpu:2 = CPU with 1 and 2 threads)."),
    scheme: Optional[str] = typer.Option(None, help="Force a conv scheme: gemm, strassen, winograd, im2col."),
    table: Optional[Path] = typer.Option(None, help="Op cost table (from 'profile --table') for planning."),
    graphs: bool = typer.Option(True, "--graphs/--no-graphs", help="CUDA: replay captured CUDA graphs."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    precision: str = typer.Option("fp32", help=PRECISION_HELP),
) -> None:
    """Latency of a model on the engine (count, mean, std, min, max, median in ms).

    Example: leti engine run net.leti --runs 100 --threads 1
    Example: leti engine run net.leti --backend auto
    """
    import time

    from leti.engine.tools import open_session, random_feeds

    s = open_session(model, backend, threads, scheme, table, graphs=graphs, precision=precision)
    feeds = random_feeds(s)
    samples = []
    with progress() as prog:
        task = prog.add_task("running", total=warmup + runs)
        for i in range(warmup + runs):
            t0 = time.perf_counter()
            s.run(feeds, copy=False)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1e3)
            prog.advance(task)
    a = np.asarray(samples)
    stats = {"model": str(model), "count": int(a.size), "mean_ms": float(a.mean()),
             "std_ms": float(a.std(ddof=1)) if a.size > 1 else 0.0, "min_ms": float(a.min()),
             "max_ms": float(a.max()), "median_ms": float(np.median(a)), "threads": threads,
             "backends": sorted({st.backend.cost_key for st in s.steps})}
    if s.plan is not None:
        stats["predicted_ms"] = s.plan.total_ms
    if as_json:
        typer.echo(json.dumps(stats))
    else:
        typer.echo(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()))


@engine_app.command("profile")
def profile(
    model: Path = typer.Argument(..., help=".leti or .tflite model."),
    runs: int = typer.Option(10, help="Runs per op (median)."),
    threads: Optional[int] = typer.Option(None, help="CPU threads."),
    backend: str = typer.Option("cpu", help="auto, cpu, cuda, or a list (cpu:1,cpu:2)."),
    scheme: Optional[str] = typer.Option(None, help="Force a conv scheme."),
    table: Optional[Path] = typer.Option(None, "--table", help="Add the per-op times to this cost table "
                                                                 "(JSON; created or extended)."),
    precision: str = typer.Option("fp32", help=PRECISION_HELP),
    in_run: bool = typer.Option(False, "--in-run", help="Time each op inside whole runs (a native program's ops by its "
                                                         "step clock), not as a program of its own."),
) -> None:
    """Per-op time, backend, chosen scheme and buffer sizes; optionally fills a cost table.

    Example: leti engine profile net.leti --runs 20
    Example: leti engine profile net.leti --threads 2 --in-run
    Example: leti engine profile net.leti --backend cuda --table costs.json
    """
    from rich.console import Console
    from rich.table import Table

    from leti.engine.tools import open_session, random_feeds

    s = open_session(model, backend, threads, scheme, precision=precision)
    feeds = random_feeds(s)
    s.run(feeds)  # compile kernels before timing
    rows = s.profile(feeds, runs=runs, in_run=in_run)
    total = sum(r["ms"] for r in rows)
    t = Table("op", "name", "backend", "scheme", "ms", "%", "out shape", "out B", "scratch B")
    for r in rows:
        t.add_row(r["op"], r["name"][-40:], r["backend"], r["scheme"], f"{r['ms']:.3f}",
                  f"{100 * r['ms'] / total:.1f}" if total else "0", str(r["out_shape"][0]), f"{r['out_bytes']:,}",
                  f"{r['scratch_bytes']:,}")
    console = Console(width=200)
    console.print(t)
    console.print(f"total {total:.3f} ms; " + "; ".join(f"{d}: {p.summary()}" for d, p in s.memory.items()))
    if table is not None:
        from leti.engine.cost import OpTable

        tab = OpTable.load(table) if table.exists() else OpTable()
        added = tab.add_profile(s, rows)
        tab.save(table)
        console.print(f"cost table {table}: {added} ops recorded, {len(tab)} entries")


@engine_app.command("plan")
def plan(
    model: Path = typer.Argument(..., help=".leti or .tflite model."),
    backend: str = typer.Option("auto", help="auto (CUDA+CPU if present), or a list such as cuda,cpu or cpu:1,cpu:2."),
    table: Optional[Path] = typer.Option(None, help="Op cost table (from 'profile --table'): the learned model."),
    calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate",
                                   help="Analytic model: microbenchmark each backend once (cached) or MNN's constants."),
    batch: Optional[int] = typer.Option(None, help="Plan for this batch size."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan summary as JSON."),
) -> None:
    """The hybrid plan: a backend per op minimising predicted latency, transfers included.

    Example: leti engine plan net.leti --backend cpu:1,cpu:2 --no-calibrate
    Example: leti engine plan net.leti --backend cuda,cpu --table costs.json
    """
    from leti.engine.session import Session
    from leti.engine.tools import choose_backends, default_cost_model, load_graph

    names, cm = choose_backends(backend, table, calibrate)
    if cm is None:
        cm = default_cost_model(table, calibrate)
    if not calibrate:
        typer.echo("note: --no-calibrate predicts from fixed constants (CPU: 16 GMUL/s a thread), a guess within a "
                   "factor ~2; without it each backend is measured once on this machine (cached) for a real "
                   "estimate", err=True)
    g = load_graph(model)
    shapes = {t: (batch,) + tuple(g.tensors[t].shape[1:]) for t in g.inputs} if batch else None
    s = Session(g, backends=names, cost_model=cm).resize(shapes)
    if as_json:
        typer.echo(json.dumps({**s.plan.summary(), "assignment": s.plan.assignment()}))
    else:
        typer.echo(s.plan.format())


@engine_app.command("info")
def info(model: Path = typer.Argument(..., help=".leti or .tflite model.")) -> None:
    """Inputs, outputs, passes, ops, schemes and the memory plan of a model.

    Example: leti engine info net.leti
    """
    from leti.engine import format as fmt
    from leti.engine.tools import open_session

    s = open_session(model, "cpu,reference")
    d = s.describe()
    if model.suffix.lower() not in (".tflite", ".keras", ".h5", ".onnx"):
        d["metadata"] = fmt.load(model, verify=False).metadata
    typer.echo(json.dumps(d, indent=2, default=str))


@engine_app.command("check")
def check(
    model: Path = typer.Argument(..., help="A .tflite model."),
    tolerance: float = typer.Option(1e-4, help="Largest relative error allowed (max |a-b| / max |b|)."),
    seed: int = typer.Option(0, help="Seed of the random input."),
) -> None:
    """Engine outputs against the TFLite interpreter, op by op where TFLite keeps the tensor.

    Example: leti engine check model.tflite --tolerance 1e-4
    """
    from leti.engine.tools import check_against_tflite

    r = check_against_tflite(model, seed)
    typer.echo(f"op by op (reference vs TFLite, {r.compared} tensors): max rel error {r.worst_op:.2e}")
    typer.echo(f"outputs (engine CPU vs TFLite): max rel error {r.worst_output:.2e} (tolerance {tolerance:g})")
    r.verify(tolerance)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
