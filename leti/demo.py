"""``leti demo``: the main job on the embedded default, end to end on this machine.

It grows with the pipeline: generate a sample of NB101 cells (table + TFLite models), then, as the
packages land, measure them on the local CPU into a SQLite campaign, export a dataset and fit a
predictor on it.
"""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    out: Path = typer.Option(Path("demo-out"), help="Working folder of the demo."),
    sample: int = typer.Option(20, help="Number of cells."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Run the pipeline on the local CPU with the SQLite store.

    Example: leti demo --out demo-out --sample 20
    """
    from leti.generate.cli import generate

    generate(out=out, space="nasbench101", all_cells=False, sample=sample, seed=seed, network=False,
             input_size=32, channels=64, stacks=3, modules=3, classes=10, vertices=None, edges=None,
             require_op=[], exclude_op=[], formats="", jobs=1)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
