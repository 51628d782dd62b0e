"""The unseen-model zoo: real CNN families LETI never generated, the held-out test set of any-model
(kernel-level) latency prediction (issue 16).

Why it looks like this: a kernel predictor is fitted on single-kernel models sampled from the layer
configurations of ``keras.applications`` at their *default* sizes, so the zoo holds what it must
generalise to and was never sampled from:

* ``keras.applications`` families at **non-default** resolutions and width multipliers (MobileNet V1/V2/V3,
  EfficientNet B0/B1/V2-B0, ResNet50, DenseNet121, NASNetMobile), plus RegNetX/Y (grouped convolutions;
  Keras 3 dropped them from ``keras.applications``, so LETI builds the published 200/400/600MF designs);
* **nn-Meter-style variants** (:mod:`leti.models.zoo_blocks`): MobileNetV1/V2-, ResNet- (basic and
  bottleneck), ShuffleNetV2- and GhostNet-like networks whose per-stage channels are re-sampled uniformly
  in [0.2, 1.8]× the base and whose kernel sizes are drawn from {3, 5, 7}, some with squeeze-excite;
* **NAS-Bench-101 networks** at 32×32, built by LETI's own layer graph and Keras builder.

:func:`zoo_entries` is deterministic (a seed; Python's string-seeded ``random``, no NumPy draws), and
every model is kept under a latency budget on a desktop core by choosing its resolution from an
estimate made without building it (multiply-accumulates over a per-family throughput). :func:`write_zoo`
writes ``<name>.tflite`` files and the manifest (``zoo.csv``, ``zoo.parquet``), dropping — and listing —
models that do not convert or do not import into the engine IR. Weights are random: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from leti.errors import ConversionError
from leti.models import zoo_blocks as zb
from leti.models import zoo_variants as zv

CLASSES = 1000  # keras.applications' and the variants' heads; NB101 networks keep their 10
BATCH = 1  # every zoo model has a static batch of one


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: ``name`` (its file stem), ``family``, ``variant`` (what tells it from its family's
    other members), ``input_res``, ``width`` (alpha for keras.applications, the geometric mean of the
    per-stage channel multipliers for variants, stem/128 for NB101), ``source`` (``keras.applications``,
    ``leti``: :mod:`zoo_blocks`, or ``nb101``), ``builder`` and its JSON-able ``params``."""

    name: str
    family: str
    variant: str
    input_res: int
    width: float
    source: str
    builder: str
    params: Mapping = field(default_factory=dict, compare=True)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- keras.applications at non-default sizes -----------------------------------------------------
def _apps() -> list[ZooEntry]:
    out = []

    def add(family, cls, res_list, **grid):
        keys = list(grid)
        combos = [{}]
        for k in keys:
            combos = [{**c, k: v} for c in combos for v in grid[k]]
        for combo in combos:
            for res in res_list:
                tag = "_".join(_tag(k, v) for k, v in combo.items())
                variant = tag or "base"
                out.append(ZooEntry(f"{family}_{variant}_r{res}" if tag else f"{family}_r{res}", family, variant, res,
                                    float(combo.get("alpha", 1.0)), "keras.applications", cls, combo))

    add("mobilenet", "MobileNet", (128, 160, 192), alpha=(0.25, 0.5, 0.75, 1.0))
    add("mobilenetv2", "MobileNetV2", (96, 128, 160, 192), alpha=(0.35, 0.5, 0.75, 1.0, 1.3))
    for fam, cls in (("mobilenetv3small", "MobileNetV3Small"), ("mobilenetv3large", "MobileNetV3Large")):
        add(fam, cls, (128, 192), alpha=(0.5, 0.75, 1.0, 1.25), minimalistic=(False, True))
    add("efficientnetb0", "EfficientNetB0", (96, 128, 160, 192))
    add("efficientnetb1", "EfficientNetB1", (96, 128, 160))
    add("efficientnetv2b0", "EfficientNetV2B0", (96, 128, 160, 192))
    add("resnet50", "ResNet50", (64, 96, 112, 128))
    add("densenet121", "DenseNet121", (64, 96, 112, 128))
    add("nasnetmobile", "NASNetMobile", (96, 128, 160))
    return out


def _tag(key: str, value) -> str:
    if key == "alpha":
        return f"a{value:g}"
    if key == "minimalistic":
        return "min" if value else "full"
    return f"{key}{value}"


#: RegNet designs (Radosavovic et al. 2020): depths, widths, group width, squeeze-excite.
REGNETS = {
    "x002": ([1, 1, 4, 7], [24, 56, 152, 368], 8, False), "x004": ([1, 2, 7, 12], [32, 64, 160, 384], 16, False),
    "x006": ([1, 3, 5, 7], [48, 96, 240, 528], 24, False), "y002": ([1, 1, 4, 7], [24, 56, 152, 368], 8, True),
    "y004": ([1, 3, 6, 6], [48, 104, 208, 440], 8, True), "y006": ([1, 3, 7, 4], [48, 112, 256, 608], 16, True),
}


def regnet_entry(key: str, res: int) -> ZooEntry:
    """The zoo entry of the RegNet design ``key`` (of :data:`REGNETS`) at ``res`` px."""
    depths, widths, gw, se = REGNETS[key]
    params = {"depths": depths, "widths": widths, "group_width": gw, "se": se, "classes": CLASSES}
    fam = f"regnet{key[0]}"
    return ZooEntry(f"{fam}_{key}_r{res}", fam, key, res, 1.0, "leti", "regnet", params)


def _regnets() -> list[ZooEntry]:
    return [regnet_entry(key, res) for key in REGNETS for res in (96, 128, 160, 192)]


def _variants(seed: int) -> list[ZooEntry]:
    out = []
    for family, (_, n, _, _) in zv.VARIANTS.items():
        for i in range(n):
            builder, res, width, params = zv.draw(family, seed, i, CLASSES)
            out.append(ZooEntry(f"{family}_{i:03d}_r{res}", family, f"{i:03d}", res, width, "leti", builder, params))
    return out


# ---- NAS-Bench-101 networks ----------------------------------------------------------------------
NB101_COUNT = 36
NB101_STEMS = (16, 32, 64)


def _nb101(seed: int) -> list[ZooEntry]:
    from leti.spaces.enumeration import enumerate_space

    cells = list(enumerate_space().sample(NB101_COUNT, seed=16_000 + seed))
    out = []
    for i, cell in enumerate(cells):
        stem = NB101_STEMS[i % len(NB101_STEMS)]
        params = {"matrix": [list(map(int, row)) for row in cell.matrix], "ops": list(cell.ops), "stem": stem,
                  "stacks": 3, "modules": 3, "classes": 10}
        out.append(ZooEntry(f"nb101_{cell.hash[:12]}_c{stem}", "nb101", cell.hash, 32, stem / 128, "nb101",
                            "network", params))
    return out


@lru_cache(maxsize=4)
def _entries(seed: int) -> tuple[ZooEntry, ...]:
    entries = _apps() + _regnets() + _variants(seed) + _nb101(seed)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConversionError("zoo names collide: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    return tuple(entries)


def zoo_entries(seed: int = 0) -> list[ZooEntry]:
    """The zoo's models, in a fixed order; the same ``seed`` always gives the same list."""
    return list(_entries(seed))


def families(entries) -> dict[str, int]:
    """Family -> number of entries, in first-seen order."""
    out: dict[str, int] = {}
    for e in entries:
        out[e.family] = out.get(e.family, 0) + 1
    return out


# ---- building ------------------------------------------------------------------------------------
def build_zoo_model(entry: ZooEntry):
    """The Keras model of ``entry`` (random weights, nothing downloaded)."""
    import inspect

    import keras

    if entry.source == "keras.applications":
        cls = getattr(keras.applications, entry.builder)
        kwargs = dict(entry.params)
        if "include_preprocessing" in inspect.signature(cls).parameters:
            kwargs["include_preprocessing"] = False  # no Rescaling/Normalization in front of the network
        shape = (entry.input_res, entry.input_res, 3)
        # batch 1, as deployed: with an unknown batch, every Reshape becomes a SHAPE/STRIDED_SLICE/PACK chain
        # that XNNPACK leaves to TFLite's own kernels (an artifact of the export, not of the architecture)
        return cls(input_shape=shape, input_tensor=keras.Input(shape, batch_size=BATCH), weights=None,
                   classes=CLASSES, **kwargs)
    if entry.source == "leti":
        return zb.build_keras_net(entry.builder, entry.params, entry.input_res, entry.name)
    if entry.source == "nb101":
        from leti.models.keras_builder import network_model, randomize_weights
        from leti.spaces.cell import Cell
        from leti.spaces.nb101_network import NetworkConfig

        p = entry.params
        cell = Cell(p["matrix"], p["ops"])
        config = NetworkConfig(input_size=entry.input_res, stem_channels=p["stem"], num_stacks=p["stacks"],
                               modules_per_stack=p["modules"], num_classes=p["classes"])
        model = network_model(cell, config, name=entry.name, gpu_compatible=True)
        return randomize_weights(model, seed=int(cell.hash[:8], 16))
    raise ConversionError(f"zoo entry {entry.name}: unknown source {entry.source!r}")


def entry_config(entry: ZooEntry) -> str:
    """The entry's builder and parameters as one JSON string (the manifest's ``config``)."""
    return json.dumps({"source": entry.source, "builder": entry.builder, "params": entry.params, "batch": BATCH},
                      sort_keys=True)


# ---- writing -------------------------------------------------------------------------------------
#: The manifest's columns (``zoo.csv``, ``zoo.parquet``); ``model`` is the file name, the key that joins
#: a ``leti measure --models`` dataset's ``model`` column.
MANIFEST_COLUMNS = ("name", "model", "family", "variant", "source", "input_res", "width", "params", "macs", "flops",
                    "tflite_bytes", "tflite_ops", "status", "stage", "error", "build_s", "config")
RECORDS = ".records"  # one JSON record per finished model: what a resumed write_zoo reads instead of rebuilding


@dataclass(frozen=True)
class _ZooJob:
    entry: ZooEntry
    out_dir: str


def _record_path(out: Path, name: str) -> Path:
    return out / RECORDS / f"{name}.json"


def _write_one(job: _ZooJob) -> dict:
    """Build, convert and engine-import one zoo model; the record says ``ok`` or ``dropped`` (and where,
    and why). A dropped model leaves no ``.tflite``. Runs in a worker process or in-process."""
    import time

    from leti.engine.convert import load_model
    from leti.models.tflite import convert_keras, read_ops, release, tflite_macs

    e, out = job.entry, Path(job.out_dir)
    done = _record_path(out, e.name)
    final = out / f"{e.name}.tflite"
    if done.is_file():  # resume: the same entry finished before (a changed entry is built again)
        old = json.loads(done.read_text())
        if old.get("config") == entry_config(e) and (final.is_file() or old["status"] != "ok"):
            return old
    rec = {"name": e.name, "model": final.name, "family": e.family, "variant": e.variant, "source": e.source,
           "input_res": e.input_res, "width": e.width, "params": None, "macs": None, "flops": None,
           "tflite_bytes": None, "tflite_ops": None, "status": "ok", "stage": "", "error": "",
           "config": entry_config(e)}
    start, stage, built = time.perf_counter(), "build", False
    try:
        model = build_zoo_model(e)
        built = True
        rec["params"] = int(model.count_params())
        stage = "convert"
        data = convert_keras(model)
        tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")  # not a .tflite: never measured
        tmp.write_bytes(data)
        os.replace(tmp, final)
        stage = "engine import"
        load_model(final)
        rec.update(macs=tflite_macs(final), tflite_bytes=len(data), tflite_ops=len(read_ops(data)))
        rec["flops"] = 2 * rec["macs"]
    except Exception as exc:  # noqa: BLE001 — any failure drops the model, with its stage and reason
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        rec.update(status="dropped", stage=stage, error=f"{type(exc).__name__}: {text}"[:500])
        final.unlink(missing_ok=True)
    finally:
        if built:
            release(collect=True)
    rec["build_s"] = round(time.perf_counter() - start, 2)
    done.parent.mkdir(parents=True, exist_ok=True)
    tmp_rec = done.with_name(done.name + f".partial-{os.getpid()}")
    tmp_rec.write_text(json.dumps(rec, sort_keys=True))
    os.replace(tmp_rec, done)
    return rec


def write_manifest(out_dir: str | os.PathLike, records):
    """``zoo.csv`` and ``zoo.parquet`` of ``records`` (every entry, dropped ones included) in ``out_dir``."""
    import pandas as pd

    df = pd.DataFrame(list(records), columns=list(MANIFEST_COLUMNS))
    for col in ("params", "macs", "flops", "tflite_bytes", "tflite_ops"):
        df[col] = df[col].astype("Int64")
    out = Path(out_dir)
    df.to_csv(out / "zoo.csv", index=False)
    df.to_parquet(out / "zoo.parquet", index=False)
    return df


def write_zoo(out_dir: str | os.PathLike, entries=None, jobs: int = 1, progress=None, *,
              recycle_every: int = 10) -> list[dict]:
    """Write ``<name>.tflite`` (float32) for every entry (default: :func:`zoo_entries`) and the manifest.

    Resumable: a model with a record under ``<out>/.records/`` is not built again. With ``jobs > 1``, or
    more models than ``recycle_every``, models are built in worker processes replaced after
    ``recycle_every`` models (TensorFlow's memory grows with every conversion). ``progress(done, total)``
    after each model. Returns the records in entry order; models that fail to build, convert or import
    into the engine IR are ``status="dropped"`` with their ``stage`` and ``error``, and leave no file.
    """
    from leti.models.export import run_pool

    entries = zoo_entries() if entries is None else list(entries)
    if jobs < 1 or recycle_every < 1:
        raise ConversionError("jobs and recycle_every must be at least 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.tflite.partial-*"), *out.glob(f"{RECORDS}/*.partial-*")]:
        stale.unlink(missing_ok=True)
    records: dict[str, dict] = {}

    def finished(rec: dict) -> None:
        records[rec["name"]] = rec
        if progress is not None:
            progress(len(records), len(entries))

    jobs_list = [_ZooJob(e, str(out)) for e in entries]
    if jobs == 1 and len(jobs_list) <= recycle_every:
        for job in jobs_list:
            finished(_write_one(job))
    elif jobs_list:
        run_pool(_write_one, jobs_list, jobs, recycle_every, finished,
                 preload=("leti.models.zoo", "leti.models.tflite", "leti.engine.convert.from_tflite"))
    ordered = [records[e.name] for e in entries]
    write_manifest(out, ordered)
    return ordered
