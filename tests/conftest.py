import json
import os
import shutil
from pathlib import Path

import pytest

from leti.spaces.enumeration import enumerate_space

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def golden() -> dict:
    """NAS-Bench-101 facts (copied from shared/golden/nb101.json with its README)."""
    return json.loads((DATA / "nb101_golden.json").read_text())


@pytest.fixture(scope="session")
def naslib():
    """The 500 public NB101 cells of NASLib with their published costs (datasets/nb101_naslib500.parquet)."""
    import pandas as pd

    return pd.read_parquet(ROOT / "datasets" / "nb101_naslib500.parquet")


@pytest.fixture(scope="session")
def nb201_frame():
    """The public NB201 latency data of five devices (datasets/nb201_latency.parquet)."""
    import pandas as pd

    return pd.read_parquet(ROOT / "datasets" / "nb201_latency.parquet")
# ---- tiny real .tflite models (converted once with TensorFlow, then cached under pytest's cache folder),
# a few real cells, and a ``make_model`` that hands the models out per cell (device and campaign tests)
#: (channels, conv layers, input size) of the tiny models; latencies from ~0.02 ms to ~0.5 ms.
TINY = [(4, 1, 8), (8, 2, 16), (16, 2, 16), (16, 3, 24), (24, 3, 24), (32, 3, 24)]


def _convert(path: Path, channels: int, layers: int, size: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    x = inp = keras.Input((size, size, 3), batch_size=1)
    for _ in range(layers):
        x = keras.layers.Conv2D(channels, 3, padding="same", activation="relu")(x)
    model = keras.Model(inp, keras.layers.GlobalAveragePooling2D()(x))
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    keras.backend.clear_session()


@pytest.fixture(scope="session")
def tiny_models(request) -> list[Path]:
    """Real .tflite files (Keras Conv2D stacks converted by TFLiteConverter), smallest first."""
    root = Path(request.config.cache.mkdir("leti-device-tiny-models-v1"))
    paths = []
    for c, n, s in TINY:
        p = root / f"conv_c{c}_n{n}_s{s}.tflite"
        if not p.is_file() or p.stat().st_size == 0:
            tmp = p.with_suffix(f".part-{os.getpid()}")  # xdist workers may convert the same model at once
            _convert(tmp, c, n, s)
            tmp.replace(p)
        paths.append(p)
    return paths


@pytest.fixture(scope="session")
def nb101_space():
    """The whole NB101 space (423,624 cells), enumerated once per test process (1-2 s each time) for the tests that
    draw cells from it (a frozen Space: sample and take return new ones)."""
    return enumerate_space()


@pytest.fixture(scope="session")
def cells(nb101_space):
    """A few real NB101 cells (the campaign only needs their hashes and specs)."""
    return list(nb101_space.sample(12, seed=3))


@pytest.fixture
def make_model(tiny_models, tmp_path):
    """``make_model(cell) -> Path``: a fresh copy of one tiny model per cell (chosen by hash)."""
    calls = []

    def make(cell):
        calls.append(cell.hash)
        src = tiny_models[int(cell.hash[:8], 16) % len(tiny_models)]
        dst = tmp_path / "made" / f"{cell.hash}-{len(calls)}.tflite"
        dst.parent.mkdir(exist_ok=True)
        shutil.copy(src, dst)
        return dst

    make.calls = calls
    return make
