"""``leti devices``, ``leti measure``, ``leti export``: thin wrappers over `leti.device` and `leti.campaign`."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from leti.cli.progress import progress


def devices() -> None:
    """List the devices `leti measure --device` accepts: local, engine, cuda and cuda-engine (when a GPU is
    present) and adb serials.

    Example: leti devices

    adb devices are read from the adb server (ANDROID_ADB_SERVER_PORT selects a non-default port).
    """
    from leti.device.registry import list_devices

    found, note = list_devices()
    for name, desc in found:
        typer.echo(f"{name}\t{desc}")
    if note:
        typer.echo(note)


def measure(
    device: str = typer.Option("local", "--device", help="local (TFLite), engine (LETI's engine), cuda (Keras, "
                               "torch backend), cuda-engine (LETI's engine on CUDA), or an adb serial "
                               "(see `leti devices`)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="cpu or gpu (gpu requires full delegation); "
                                          "adb phones also nnapi and external (--delegate); "
                                          "default: the device's own (gpu for cuda devices, else cpu)."),
    cells_path: Optional[Path] = typer.Option(None, "--cells", help="Cell table written by `leti generate` (Parquet)."),
    models: Optional[list[Path]] = typer.Option(None, "--models", help="Model files (.tflite, .keras, .onnx, .leti) or "
                                                "folders of them, instead of --cells; repeat it for several. "
                                                "Identified by a hash of their content and name."),
    db: Path = typer.Option(..., "--db", help="Campaign database (SQLite); rerun the same command to resume."),
    network: Optional[bool] = typer.Option(None, "--network/--cell",
                                           help="Model kind; must match the table (default: the table's)."),
    runs: int = typer.Option(300, help="Timed runs per experiment (the cap when --adaptive)."),
    warmup: int = typer.Option(10, help="Untimed warm-up runs before each experiment."),
    max_rel_std: float = typer.Option(0.1, help="Rerun an experiment whose std exceeds this fraction of the mean."),
    max_attempts: int = typer.Option(3, help="Experiments per model before it is marked unstable."),
    passes: int = typer.Option(3, help="Times the whole collection is measured, each in shuffled order."),
    adaptive: bool = typer.Option(False, "--adaptive", help="Stop once the 95% CI half-width is within ±2%."),
    benchmark_binary: Optional[Path] = typer.Option(None, help="adb: TFLite's benchmark_model for the device."),
    threads: int = typer.Option(1, help="CPU threads."),
    xnnpack: bool = typer.Option(True, "--xnnpack/--no-xnnpack", help="CPU: use the XNNPACK delegate."),
    seed: int = typer.Option(0, help="Seed of the pass orders."),
    cache_mb: int = typer.Option(2048, help="On-disk model cache bound (MB)."),
    cache_dir: Optional[Path] = typer.Option(None, help="Model cache folder, shareable between campaigns of the "
                                             "same table (default: next to --db)."),
    offline_wait: float = typer.Option(300.0, help="Seconds to wait for a device that went offline."),
    cooldown_above: Optional[float] = typer.Option(None, help="Cool down before a model above this °C."),
    max_secs: float = typer.Option(150.0, help="adb: benchmark_model's own limit per phase (--max_secs)."),
    command_timeout: Optional[float] = typer.Option(None, help="adb: seconds before a run is stopped "
                                                    "(default 2 × max-secs + 60)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Measure again the models that failed."),
    reference: str = typer.Option("none", help="Paired measurement against a reference cell, which cancels the "
                                  "host's speed drift (local, engine): 'auto' (the table's cell of median FLOPs), "
                                  "a cell hash, or 'none'. With --models: 'auto' (the model of median "
                                  "multiply-accumulates) or one of the files (name or hash)."),
    extend: bool = typer.Option(False, "--extend", help="Add the table's cells to a campaign database that holds "
                                "other cells (refused without it)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Measure on the devices of a Ray cluster: its head "
                                          "HOST:PORT or 'auto'; --device then names farm devices (ID[,ID...] or "
                                          "'all' phones; see `leti farm devices`)."),
    split: bool = typer.Option(False, "--split", help="--cluster: share one cell list across identical devices "
                               "(same model and build) once they agree on a few reference cells."),
    split_tolerance: float = typer.Option(0.10, help="--split: largest spread allowed on the reference cells."),
    delegate: Optional[str] = typer.Option(None, "--delegate", help="adb: path ON THE PHONE of an external "
                                           "(vendor) delegate library for benchmark_model; checked before the "
                                           "campaign starts. Implies --backend external."),
    allow_partial_delegation: bool = typer.Option(False, "--allow-partial-delegation", help="adb delegates: time "
                                                  "models the delegate runs only partly (rows record the nodes "
                                                  "that fell back to the CPU) instead of refusing them."),
    op_profiling: bool = typer.Option(False, "--op-profiling", help="adb phones: after each measurement, one more "
                                      "benchmark_model run with --enable_op_profiling=true (never the timed runs: "
                                      "the profiler slows them); its per-op times are stored, and `leti export` "
                                      "writes them as <out>.ops.parquet, a kernel table."),
    clock: str = typer.Option("wall", "--clock", help="What runs are timed by: wall (default) or cpu, the "
                              "measuring thread's CPU time, which other processes preempting it on a shared host "
                              "cannot inflate (local or engine CPU, --threads 1). Part of the campaign's protocol."),
    precision: Optional[str] = typer.Option(None, "--precision", help="Models' precision: fp32, int8, fp16 or "
                                            "dynamic (default: the table's, set by `leti generate --format "
                                            "tflite-int8` etc.). Part of the campaign's identity."),
) -> None:
    """Measure every cell of a table on a device, resumably, into a campaign database.

    Example: leti measure --device local --cells cells/cells.parquet --db campaign.sqlite --runs 100 --passes 3

    Example (phone): leti measure --device R58M123ABC --backend gpu --benchmark-binary ./benchmark_model
    --cells cells/cells.parquet --db pixel.sqlite

    Example (LETI's engine on the CPU): leti measure --device engine --cells cells/cells.parquet --db engine.sqlite

    Example (a shared or throttling host: pair every experiment with a reference cell):
    leti measure --device local --cells cells/cells.parquet --db local.sqlite --adaptive --reference auto

    Example (a host shared with other busy processes: time runs by the thread's CPU time as well):
    leti measure --device local --models zoo/ --db zoo.sqlite --adaptive --reference auto --clock cpu

    Example (a third pass on a finished campaign): rerun the same command with --passes 3

    Example (add a table's new cells to a campaign): ... --cells more/cells.parquet --db campaign.sqlite --extend

    Example (every phone of a Ray cluster, one database): leti measure --cluster auto --device all
    --benchmark-binary ./benchmark_model --cells cells/cells.parquet --db farm.sqlite

    Example (per-op times too, a phone): leti measure --models zoo/ --device R58M123ABC --benchmark-binary
    ./benchmark_model --db zoo_phone.sqlite --op-profiling; leti export --db zoo_phone.sqlite --out zoo.parquet
    (also writes zoo.ops.parquet, for leti fit --kernels)

    Example (any model files): leti measure --models zoo/ --device local --db zoo.sqlite;
    leti measure --models net.onnx --models net2.keras --device engine --db zoo_engine.sqlite

    Example (a CUDA GPU, through Keras and through the engine; `leti export` takes both databases):
    leti measure --device cuda --cells cells/cells.parquet --db gpu_keras.sqlite;
    leti measure --device cuda-engine --cells cells/cells.parquet --db gpu_engine.sqlite
    """
    from leti.campaign.measure import measure_table
    from leti.errors import LetiError

    protocol = dict(runs=runs, warmup=warmup, max_rel_std=max_rel_std, max_attempts=max_attempts,
                    adaptive=adaptive, cooldown_above_c=cooldown_above, clock=clock)
    if (cells_path is None) == (not models):
        raise LetiError("give either --cells (a cell table) or --models (model files), not "
                        + ("both" if models else "neither"))
    if models:
        if cluster is not None:
            raise LetiError("--cluster measures --cells tables; --models campaigns run on one device")
        from leti.campaign.measure_models import measure_models

        if network is not None:
            raise LetiError("--network/--cell applies to --cells campaigns, not to --models")
        done = measure_models(models, device, db, backend=backend, protocol=protocol, passes=passes, seed=seed,
                              threads=threads, xnnpack=xnnpack, benchmark_binary=benchmark_binary, max_secs=max_secs,
                              command_timeout=command_timeout, cache_dir=cache_dir, cache_bytes=cache_mb * 2**20,
                              offline_wait_s=offline_wait, retry_failed=retry_failed, extend=extend,
                              op_profiling=op_profiling, reference=reference, echo=typer.echo,
                              track=_progress_bar)
        _report(done)
        return
    if cluster is not None:
        if op_profiling:
            raise LetiError("--op-profiling measures one adb phone (--device SERIAL), not a --cluster")
        from leti.cli.farm import measure_cluster

        if clock != "wall":
            raise LetiError(f"--clock {clock} times runs on this host; the devices of a --cluster use the wall clock")

        return measure_cluster(cluster, device, cells_path=cells_path, db=db, backend=backend, network=network,
                               protocol=protocol, passes=passes, seed=seed, threads=threads, xnnpack=xnnpack,
                               benchmark_binary=benchmark_binary, max_secs=max_secs, command_timeout=command_timeout,
                               cache_dir=cache_dir, cache_bytes=cache_mb * 2**20, offline_wait_s=offline_wait,
                               retry_failed=retry_failed, reference=reference, split=split,
                               split_tolerance=split_tolerance)
    if split:
        raise typer.BadParameter("--split needs --cluster")
    done = measure_table(cells_path, device, db, backend=backend, network=network, protocol=protocol, passes=passes,
                         seed=seed, threads=threads, xnnpack=xnnpack, benchmark_binary=benchmark_binary,
                         max_secs=max_secs, command_timeout=command_timeout, cache_dir=cache_dir,
                         cache_bytes=cache_mb * 2**20, offline_wait_s=offline_wait, retry_failed=retry_failed,
                         reference=reference, extend=extend, precision=precision,
                         delegate_path=delegate, require_full_delegation=not allow_partial_delegation,
                         op_profiling=op_profiling, echo=typer.echo, track=_progress_bar)
    _report(done)


def _report(done: dict) -> None:
    stats, s = done["stats"], done["summary"]
    typer.echo(f"measured {stats['measured']}, failed {stats['failed']}, already done {stats['skipped']}; "
               f"{s['unstable']} unstable, {len(s['flagged'])} cells with disagreeing passes")
    for pair, c in s["pass_correlation"].items():
        typer.echo(f"pass {pair} correlation: pearson {c['pearson']:.4f}, spearman {c['spearman']:.4f} (n={c['n']})")


@contextmanager
def _progress_bar(description: str):
    """The campaign's progress callback on the shared progress bar; failures and notes print above it."""
    with progress() as bar:
        task = bar.add_task(description, total=None)

        def on_progress(p):
            bar.update(task, total=p.total, completed=p.done)
            if p.status not in ("", "ok"):
                # messages quote device output: plain text, not markup, not wrapped
                bar.console.out(f"{p.status}: {p.hash[:12]} pass {p.pass_}" + (f": {p.message}" if p.message else ""),
                                highlight=False)
            elif p.message:
                bar.console.out(p.message, highlight=False)

        yield on_progress


def export(
    db: list[Path] = typer.Option(..., "--db", help="Campaign database written by `leti measure`; repeat it to "
                                  "export several campaigns (say one GPU through two runtimes) into one file."),
    out: Path = typer.Option(..., "--out", help="Parquet dataset to write (device info and datasheet beside it)."),
    max_pass_spread: float = typer.Option(0.10, help="Leave out cells whose pass means differ by more than this."),
) -> None:
    """Export a campaign to a Parquet dataset (+ .device.json and .README.md datasheet beside it).

    Example: leti export --db campaign.sqlite --out datasets/local_cpu.parquet

    Example: leti export --db gpu_keras.sqlite --db gpu_engine.sqlite --out datasets/gpu.parquet

    Campaigns measured with --op-profiling also give <out stem>.ops.parquet: the per-op times, with LETI's
    kernel shapes where a model's kernel split lines up with its op rows (a kernel table for leti fit --kernels).
    """
    from leti.campaign.export import export_dataset
    from leti.predict.kernels.profiled import op_kernel_table

    s = export_dataset(db, out, max_pass_spread, op_kernels=op_kernel_table)
    typer.echo(f"wrote {s['exported_rows']} rows to {out} ({len(s['flagged'])} cells left out for disagreeing passes)")
    if "op_table" in s:
        t = s["op_table"]
        typer.echo(f"wrote {t['rows']} op rows of {t['models']} models to {out.with_name(t['file'])}: "
                   f"{t['aligned_rows']} lined up with the models' kernels, {t['usable_rows']} usable by "
                   "leti fit --kernels (see the datasheet)")


def register(app: typer.Typer) -> None:
    app.command("devices")(devices)
    app.command("measure")(measure)
    app.command("export")(export)
