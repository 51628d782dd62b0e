"""``leti demo``: the main job on the embedded default, end to end on this machine.

generate a seeded sample of NB101 cells with their TFLite models → measure them on the local CPU
(ai-edge-litert, XNNPACK, 1 thread) in a resumable SQLite campaign → export the Parquet dataset →
fit a latency predictor on it and report how well it predicts. Each step is the same ``leti`` command
a user would type, so the demo is also a smoke test of the CLI.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer


def steps(out: Path, sample: int, seed: int, runs: int, passes: int) -> list[list[str]]:
    cells = out / "cells.parquet"
    db = out / "campaign.sqlite"
    dataset = out / "dataset.parquet"
    return [
        ["generate", "--sample", str(sample), "--seed", str(seed), "--cell", "--input-size", "32",
         "--channels", "64", "--format", "tflite", "--out", str(out)],
        ["measure", "--device", "local", "--cells", str(cells), "--db", str(db), "--runs", str(runs),
         "--passes", str(passes), "--threads", "1", "--cache-dir", str(out / "tflite")],
        ["export", "--db", str(db), "--out", str(dataset)],
    ]


def demo(
    out: Path = typer.Option(Path("demo-out"), help="Working folder of the demo (rerun to resume)."),
    sample: int = typer.Option(20, help="Number of cells."),
    seed: int = typer.Option(0, help="Sampling seed."),
    runs: int = typer.Option(100, help="Timed runs per experiment."),
    passes: int = typer.Option(2, help="Measurement passes."),
) -> None:
    """Run the pipeline on the local CPU with the SQLite store.

    Example: leti demo --out demo-out --sample 20
    """
    from leti.cli import app

    command = typer.main.get_command(app)
    for argv in steps(out, sample, seed, runs, passes):
        typer.secho(f"$ leti {shlex.join(argv)}", bold=True)
        command.main(argv, prog_name="leti", standalone_mode=False)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
