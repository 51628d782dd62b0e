"""Measure arbitrary model files (``leti measure --models``): :func:`measure_models`, the sibling of
:func:`leti.campaign.measure.measure_table` for networks LETI never generated.

Same protocol, store, resume and export as a cell campaign; only the identity of an item differs:
a model file is identified by a content hash of its bytes and its name (:func:`model_hash`), so
rerunning the command on the same files measures nothing new, a file edited in place is a new
model, and the same bytes under two names are two rows. Each model is turned into what the device
consumes (:func:`model_file_factory`): ``.tflite`` files go to TFLite devices as they are (``.keras``
files are converted to TFLite), and any format :func:`leti.engine.convert.load_model` reads
(``.tflite``, ``.keras``, ``.onnx``, ``.leti``) is converted on the fly to ``.leti`` for engine
devices. A file that cannot be converted for the device is stored as a ``convert_failed`` row.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

from leti.campaign.measure import (Track, _protocol, bind_device, check_counts, check_device, finished,
                                   tool_versions, work_folder)
from leti.campaign.store import CampaignStore, ModelEntry, model_hash, path_error
from leti.device.protocol import Protocol
from leti.errors import ConversionError, DatasetError, LetiError

#: The campaign's ``model_spec`` identity for model-file campaigns (a cell campaign's spec differs).
FILES_SPEC = {"kind": "model-files"}
MODEL_SUFFIXES = (".tflite", ".keras", ".h5", ".onnx", ".leti")


def collect_models(paths: Sequence[str | os.PathLike]) -> list[ModelEntry]:
    """The model files named by ``paths`` (files, or folders whose model files are taken, sorted)."""
    if not paths:
        raise DatasetError("--models names no file or folder")
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in MODEL_SUFFIXES)
            if not found:
                raise DatasetError(f"{p}: no model files ({', '.join(MODEL_SUFFIXES)}) in this folder")
            files += found
        elif p.is_file():
            if p.suffix.lower() not in MODEL_SUFFIXES:
                raise DatasetError(f"{p}: not a model file (known: {', '.join(MODEL_SUFFIXES)})")
            files.append(p)
        else:
            raise DatasetError(f"{p}: no such model file or folder")
    entries: dict[str, ModelEntry] = {}
    for f in files:
        try:
            entry = ModelEntry(model_hash(f), f.name, str(f.resolve()), f.stat().st_size)
        except OSError as exc:
            raise path_error(f, exc, "the model file") from None
        entries.setdefault(entry.hash, entry)
    return list(entries.values())


def pick_reference_model(choice: str, entries: Sequence[ModelEntry]) -> ModelEntry | None:
    """The reference model of ``--reference`` for a model-file campaign: ``none``; ``auto``, the model of
    median multiply-accumulates (ties by hash; by file size when some file is not a readable ``.tflite``),
    as ``auto`` picks the cell of median FLOPs in a cell campaign; or one of the files, by name, stem or hash."""
    if choice == "none":
        return None
    if choice == "auto":
        from leti.models.tflite import tflite_macs

        cost: dict[str, int] = {}
        for e in entries:
            if Path(e.path).suffix.lower() != ".tflite":
                break
            try:
                cost[e.hash] = tflite_macs(e.path)
            except LetiError:
                break
        if len(cost) < len(entries):
            cost = {e.hash: e.size_bytes for e in entries}
        order = sorted(entries, key=lambda e: (cost[e.hash], e.hash))
        return order[len(order) // 2]
    found = [e for e in entries if choice in (e.hash, e.name, Path(e.name).stem)]
    if not found:
        raise DatasetError(f"--reference {choice!r} is neither 'auto', 'none' nor one of the --models files "
                           "(give a file name, its stem or its model hash)")
    return found[0]


def model_file_factory(artifact: str, workdir: Path) -> Callable[[ModelEntry], Path]:
    """``make_model(entry) -> Path``: the entry's file in the format the device consumes (a copy the
    campaign's model cache takes over)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def make_model(entry: ModelEntry) -> Path:
        src = Path(entry.path)
        if not src.is_file():
            raise ConversionError(f"{src}: the model file is gone")
        out = Path(workdir) / entry.hash
        out.mkdir(parents=True, exist_ok=True)
        suffix = src.suffix.lower()
        if artifact == "tflite":
            made = out / f"{entry.hash}.tflite"
            if suffix == ".tflite":
                shutil.copyfile(src, made)
            elif suffix in (".keras", ".h5"):
                from leti.models.keras_import import keras_to_tflite, read_keras

                made.write_bytes(keras_to_tflite(read_keras(src)))
            else:
                raise ConversionError(f"{src.name}: a {suffix} model does not run on a TFLite device; "
                                      "give a .tflite or .keras file")
            return made
        if artifact == "leti":
            from leti.engine import format as fmt
            from leti.engine.convert import load_model

            made = out / f"{entry.hash}.leti"
            if suffix == ".leti":
                shutil.copyfile(src, made)
            else:
                fmt.save(load_model(src), made)
            return made
        if artifact == "keras" and suffix in (".keras", ".h5"):
            made = out / f"{entry.hash}{suffix}"
            shutil.copyfile(src, made)
            return made
        raise ConversionError(f"{src.name}: a {suffix} model cannot be made into the device's {artifact} format")

    return make_model


def measure_models(paths: Sequence[str | os.PathLike], device: str, db: str | Path, *, backend: str | None = None,
                   protocol: Protocol | Mapping | None = None, passes: int = 3, seed: int = 0, threads: int = 1,
                   xnnpack: bool = True, benchmark_binary: str | Path | None = None, max_secs: float = 150.0,
                   command_timeout: float | None = None, cache_dir: str | Path | None = None,
                   cache_bytes: int = 2 * 2**30, offline_wait_s: float = 300.0, retry_failed: bool = False,
                   extend: bool = False, op_profiling: bool = False, reference: str = "none",
                   echo: Callable[[str], None] = lambda _msg: None, track: Track | None = None) -> dict:
    """Measure every model file of ``paths`` (files or folders) on ``device`` into ``db``.

    The options mean what they mean for :func:`~leti.campaign.measure.measure_table`; ``reference``
    pairs every experiment with one of the models (:func:`pick_reference_model`). Returns
    ``{"stats": ..., "summary": ...}``; a campaign none of whose measurements succeeded raises
    :class:`LetiError` (its rows are kept).
    """
    from leti.campaign.run import run_campaign
    from leti.device.registry import KINDS, open_device

    check_counts(passes=passes, threads=threads)
    if max_secs <= 0 or (command_timeout is not None and command_timeout <= 0):
        raise LetiError("--max-secs and --command-timeout must be above 0")
    entries = collect_models(paths)
    if isinstance(protocol, Mapping):
        check_counts(**{k: protocol[k] for k in ("runs", "warmup", "max_attempts") if k in protocol})
    protocol = _protocol(protocol)
    ref = pick_reference_model(reference, entries)
    adb_kw = {"max_secs": max_secs, "command_timeout": command_timeout} if device not in KINDS else {}
    if op_profiling:
        adb_kw["op_profiling"] = True
    dev = open_device(device, backend=backend, threads=threads, benchmark_binary=benchmark_binary, xnnpack=xnnpack,
                      **adb_kw)
    with dev, CampaignStore(db) as store:
        check_device(dev, protocol, ref)
        if store.cells():
            raise LetiError(f"{store.path} holds a campaign of NAS cells, not of model files; use another --db")
        stored = store.models()
        new = [e for e in entries if e.hash not in stored]
        if stored and new and not extend:
            raise LetiError(f"{store.path} holds a campaign of {len(stored)} model files; {len(new)} of the "
                            f"{len(entries)} given are not in it (new or changed files); pass --extend to add "
                            "them, or use another --db")
        store.bind(device_id=bind_device(store, dev, echo), backend=dev.backend, protocol=protocol.to_dict(),
                   passes=passes, seed=seed, model_spec=FILES_SPEC, reference=ref.hash if ref is not None else None)
        store.set_meta(device_info=dev.info(), tool_versions=tool_versions(dev), campaign_kind="models")
        if stored and new:
            echo(f"adding {len(new)} model files to the campaign")
        store.add_models(entries)
        if retry_failed:
            echo(f"retrying {store.forget_failures()} failed measurements")
        track = track or (lambda _description: nullcontext(None))
        with work_folder(store) as work, track(f"measure on {dev.id}") as on_progress:
            stats = run_campaign(store, dev, model_file_factory(dev.artifact, work), protocol, passes=passes,
                                 seed=seed, cache_dir=cache_dir, cache_bytes=cache_bytes,
                                 offline_wait_s=offline_wait_s, on_progress=on_progress, items=store.models(),
                                 reference=ref)
        return finished(store, stats)
