"""Execute the analysis notebooks top to bottom and save them with their outputs (full mode).

    .venv/bin/python notebooks/execute.py                  # all notebooks, in place
    .venv/bin/python notebooks/execute.py 02_predictors    # one of them

Full mode is what gets committed (``LETI_FAST`` is removed from the environment); the figures for the
README are written to ``notebooks/figures/`` by the notebooks themselves. The NB101 dataset is
``datasets/nb101_local_cpu.parquet`` or, when it is missing, ``$LETI_NB_DATA``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    os.environ.pop("LETI_FAST", None)
    paths = [HERE / f"{n.removesuffix('.ipynb')}.ipynb" for n in names] or sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
