"""One call from a cell table to a campaign database: :func:`measure_table` (what ``leti measure`` runs).

It reads the table and its model spec, opens the device, binds the campaign identity (so a resumed
campaign has the same settings), records the device facts and tool versions, picks the reference
cell of a paired campaign, and runs the campaign with models built from the table's spec (or taken
from the ones ``leti generate --format`` wrote beside it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from leti.campaign.export import summarize
from leti.campaign.models import model_factory
from leti.campaign.run import Progress, run_campaign
from leti.campaign.store import CampaignStore, path_error
from leti.device.protocol import Protocol
from leti.errors import DatasetError, LetiError
from leti.spaces.spec import ModelSpec

#: The model spec of a table that names none, by model kind.
DEFAULT_SPECS = {"cell": ModelSpec("cell", (32, 32, 64), 64), "network": ModelSpec("network")}

#: ``track(description)``: a context that yields the progress callback of a campaign (a progress bar).
Track = Callable[[str], AbstractContextManager[Callable[[Progress], None]]]


def table_spec(spec: ModelSpec | None, network: bool | None, where) -> ModelSpec:
    """The table's model spec, checked against an explicit model kind (``network``; None: the table's)."""
    if network is None:
        return spec if spec is not None else DEFAULT_SPECS["cell"]
    want = "network" if network else "cell"
    if spec is not None and spec.kind != want:
        raise DatasetError(f"{where} describes {spec.kind} models, not --{want}; "
                           "regenerate the table or drop the flag")
    return spec if spec is not None else DEFAULT_SPECS[want]


def pick_reference(choice: str, cells: list, costs: list | None, where) -> object | None:
    """The reference cell of ``--reference``: none, auto (median FLOPs, ties by hash) or a hash in the table."""
    if choice == "none":
        return None
    if choice == "auto":
        if costs is None:
            raise DatasetError(f"{where}: --reference auto needs a 'flops' column; name a cell hash instead")
        order = sorted(range(len(cells)), key=lambda i: (costs[i][0], cells[i].hash))
        return cells[order[len(order) // 2]]
    found = [c for c in cells if c.hash == choice]
    if not found:
        raise DatasetError(f"{where}: --reference {choice!r} is neither 'auto', 'none' nor a cell hash of the table")
    return found[0]


def tool_versions(dev) -> dict:
    """The device's own tool versions and the host's TensorFlow, Keras and LETI versions."""
    from importlib import metadata

    out = dict(dev.tool_versions())
    for dist in ("tensorflow-cpu", "tensorflow", "keras", "leti"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return json.loads(json.dumps(out))


def spec_cache_dir(cache_dir: str | Path | None, spec: ModelSpec) -> Path | None:
    """One sub-folder of a shared model cache per model spec, so tables never mix models."""
    if cache_dir is None:
        return None
    digest = hashlib.sha1(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{spec.kind}-{digest}"


def _protocol(protocol: Protocol | Mapping | None) -> Protocol:
    if isinstance(protocol, Protocol):
        return protocol
    try:
        return Protocol(**(protocol or {}))
    except ValueError as exc:
        raise LetiError(str(exc)) from None


#: Options that count something, with the least value each accepts (``leti measure``'s option names).
COUNTS = {"passes": 1, "runs": 1, "warmup": 0, "max_attempts": 1, "threads": 1}


def check_counts(**values) -> None:
    """Refuse a count below its least value (``--passes 0``), naming the option."""
    for name, value in values.items():
        least = COUNTS[name]
        if value is None or value < least:
            raise LetiError(f"--{name.replace('_', '-')} must be at least {least}, not {value}")


def checked_cells(df, where) -> list:
    """The table's cells; an empty table, or a row without a matrix or ops, is refused naming the row."""
    from leti.spaces.table_file import table_cells

    if len(df) == 0:
        raise DatasetError(f"{where} has no cells; nothing to measure")
    for col in ("matrix", "ops"):
        for i, v in enumerate(df[col]):
            if v is None or (isinstance(v, float) and v != v):
                h = f" (hash {df['hash'].iloc[i]})" if "hash" in df else ""
                raise DatasetError(f"{where} row {i}{h}: '{col}' is empty")
    try:
        return table_cells(df, str(where))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, LetiError):
            raise
        raise DatasetError(f"{where}: a row's matrix or ops is malformed ({exc})") from None


def check_same_cells(store: CampaignStore, cells: list, where, extend: bool) -> list:
    """The table's cells that a campaign holding cells does not hold yet: refused unless ``extend``.

    A table whose cells the campaign already holds (the original table, or part of it) resumes the
    campaign, which measures all of its cells."""
    stored = store.cells()
    if not stored:
        return []
    new = [c for c in cells if c.hash not in stored]
    if new and not extend:
        raise LetiError(f"{store.path} holds a campaign of {len(stored)} cells, but {where} has {len(cells)}, "
                        f"{len(new)} of them not in the campaign; pass --extend to add them to this campaign, or "
                        "use another --db")
    return new


def bind_device(store: CampaignStore, dev, echo: Callable[[str], None]) -> str:
    """The device's identity for the campaign; an older campaign bound to the same device's transport
    (``127.0.0.1:PORT``, before phones were identified by their own serial) is moved to the new identity."""
    ident = dev.identity()
    old = store.meta().get("device_id")
    if old is not None and old != ident and old == dev.id:
        store.set_meta(device_id=ident)
        echo(f"{store.path}: the campaign's device {old} is now identified as {ident} (read from the device), "
             "so it resumes on any adb transport")
    return ident


def all_failed_error(store: CampaignStore) -> LetiError | None:
    """The error of a campaign none of whose measurements succeeded (None when one did, or none ran)."""
    failures = store.failures()
    if not failures or len(failures) < len(store.done()):
        return None
    kinds = {}
    for _, _, status, _ in failures:
        kinds[status] = kinds.get(status, 0) + 1
    h, p, status, error = failures[0]
    first = (error.strip().splitlines() or [""])[0][:200]
    what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return LetiError(f"every measurement failed ({len(failures)} of {len(failures)}: {what}); first, cell "
                     f"{h[:12]} pass {p}: {first}. The rows are kept in {store.path}; fix the cause and rerun "
                     "with --retry-failed")


def load_table(cells_path: Path, network: bool | None) -> tuple[list, list | None, ModelSpec]:
    """The cells of a table, their (flops, params, peak memory) when the table has them, and its model spec."""
    from leti.spaces.table_file import read_cell_table

    df, spec = read_cell_table(cells_path)
    spec = table_spec(spec, network, cells_path)
    cost_cols = ("flops", "params", "peak_memory_bytes")
    costs = list(zip(*(df[c] for c in cost_cols))) if all(c in df for c in cost_cols) else None
    return checked_cells(df, cells_path), costs, spec


def measure_table(cells_path: str | Path, device: str, db: str | Path, *, backend: str | None = None,
                  network: bool | None = None, protocol: Protocol | Mapping | None = None, passes: int = 3,
                  seed: int = 0, threads: int = 1, xnnpack: bool = True,
                  benchmark_binary: str | Path | None = None, max_secs: float = 150.0,
                  command_timeout: float | None = None, cache_dir: str | Path | None = None,
                  cache_bytes: int = 2 * 2**30, offline_wait_s: float = 300.0, retry_failed: bool = False,
                  reference: str = "none", extend: bool = False, precision: str | None = None,
                  delegate_path: str | None = None, require_full_delegation: bool = True,
                  op_profiling: bool = False, echo: Callable[[str], None] = lambda _msg: None,
                  track: Track | None = None) -> dict:
    """Measure every cell of the table at ``cells_path`` on ``device`` (a kind or an adb serial) into ``db``.

    ``protocol``: a :class:`Protocol` or its options (invalid ones raise :class:`LetiError`).
    ``reference``: ``"none"``, ``"auto"`` (the cell of median FLOPs) or a cell hash for paired measurement.
    ``extend``: add the table's cells to a campaign that holds other cells (refused without it).
    ``delegate_path``: an external delegate library on the phone (backend ``external``), checked before
    anything is stored; ``require_full_delegation=False`` times partly delegated models (their rows say
    how many nodes ran on the CPU) instead of refusing them. ``op_profiling`` (adb phones): one more run per
    measurement under benchmark_model's op profiler, its per-op times stored beside the measurement.
    ``precision``: the models' precision (fp32, int8, fp16, dynamic; None: the table's). It is part of
    the campaign's model spec, so an fp32 and an int8 campaign of the same cells never mix.
    A larger ``passes`` than the campaign's adds passes. ``echo`` receives one-line notes (failures
    forgotten by ``retry_failed``, models regenerated); ``track`` opens the progress display of the run
    (default: none). Returns ``{"stats": run_campaign's counts, "summary": summarize(store)}``; a
    campaign none of whose measurements succeeded raises :class:`LetiError` (its rows are kept).
    Working files live in ``<db>.work/``, emptied at the start and removed at the end.
    """
    from leti.device.registry import KINDS, open_device

    check_counts(passes=passes, threads=threads)
    for name, value, least in (("cache-mb", cache_bytes / 2**20, 1), ("offline-wait", offline_wait_s, 0)):
        if value < least:
            raise LetiError(f"--{name} must be at least {least}, not {value:g}")
    if max_secs <= 0 or (command_timeout is not None and command_timeout <= 0):
        raise LetiError("--max-secs and --command-timeout must be above 0")
    cells_path = Path(cells_path)
    cells, costs, spec = load_table(cells_path, network)
    if precision is not None:
        from dataclasses import replace

        spec = replace(spec, precision=precision)
    if isinstance(protocol, Mapping):  # name the option before Protocol's own, more general, complaint
        check_counts(**{k: protocol[k] for k in ("runs", "warmup", "max_attempts") if k in protocol})
    protocol = _protocol(protocol)
    ref_cell = pick_reference(reference, cells, costs, cells_path)
    adb_kw = {"max_secs": max_secs, "command_timeout": command_timeout} if device not in KINDS else {}
    if delegate_path is not None:
        adb_kw["delegate_path"] = delegate_path
    if device not in KINDS:
        adb_kw["require_full_delegation"] = require_full_delegation
    if op_profiling:
        adb_kw["op_profiling"] = True
    dev = open_device(device, backend=backend, threads=threads, benchmark_binary=benchmark_binary, xnnpack=xnnpack,
                      **adb_kw)
    if spec.precision != "fp32":
        from leti.models.quantize import format_name

        try:
            format_name(dev.artifact, spec.precision)
        except LetiError as exc:
            dev.close()
            raise LetiError(f"--device {device}: {exc}") from None
    with dev, CampaignStore(db) as store:
        return _run(store, dev, cells, costs, spec, protocol, passes, seed, cells_path, ref_cell, extend,
                        retry_failed, cache_dir, cache_bytes, offline_wait_s, echo, track)


def _run(store, dev, cells, costs, spec, protocol, passes, seed, cells_path, ref_cell, extend, retry_failed,
         cache_dir, cache_bytes, offline_wait_s, echo, track) -> dict:
    check_device(dev, protocol, ref_cell)
    new = check_same_cells(store, cells, cells_path, extend)
    old_passes = store.meta().get("passes")
    store.bind(device_id=bind_device(store, dev, echo), backend=dev.backend, protocol=protocol.to_dict(),
               passes=passes, seed=seed, model_spec=spec.to_dict(),
               reference=ref_cell.hash if ref_cell is not None else None)
    if old_passes is not None and passes > old_passes:
        added = f"pass {passes}" if passes == old_passes + 1 else f"passes {old_passes + 1}-{passes}"
        echo(f"adding {added} to the campaign's {old_passes}")
    # where the models are kept: `leti export` lines op profiles up with the models' kernels
    cache = spec_cache_dir(cache_dir, spec) or Path(f"{store.path}.models")
    store.set_meta(device_info=dev.info(), tool_versions=tool_versions(dev), cells_table=str(cells_path),
                   model_cache=str(Path(cache).resolve()))
    if new:
        echo(f"adding {len(new)} cells of {cells_path} to the campaign")
    store.add_cells(cells, costs)
    rebuild: set[str] = set()
    if retry_failed:
        rebuild = {h for h, _, status, _ in store.failures() if status == "load_failed"}
        echo(f"retrying {store.forget_failures()} failed measurements")
    from leti.models.quantize import format_name

    prebuilt = cells_path.parent / format_name(dev.artifact, spec.precision)
    if rebuild and prebuilt.is_dir():
        echo(f"regenerating {len(rebuild)} models that failed to load instead of reusing their files in {prebuilt}")
    track = track or (lambda _description: nullcontext(None))
    with work_folder(store) as work, track(f"measure on {dev.id}") as on_progress:
        # models that `leti generate --format` already wrote beside the table are used as they are
        make = model_factory(spec, dev.artifact, work, prebuilt=prebuilt, rebuild=rebuild)
        stats = run_campaign(store, dev, make, protocol, passes=passes, seed=seed,
                             cache_dir=spec_cache_dir(cache_dir, spec), cache_bytes=cache_bytes,
                             offline_wait_s=offline_wait_s, on_progress=on_progress, reference=ref_cell)
    return finished(store, stats)


def check_device(dev, protocol: Protocol, reference) -> None:
    """Refuse, before anything is stored, a ``--reference`` or a ``--clock`` the device cannot honour."""
    if reference is not None and not dev.pairable:
        raise LetiError(f"--reference: {dev.id} cannot alternate two models in one run; pairing needs a device "
                        "that runs models in this process (local, engine)")
    if protocol.clock not in dev.clocks():
        raise LetiError(f"--clock {protocol.clock}: {dev.id} times runs by {' or '.join(dev.clocks())} only; the "
                        "CPU clock needs a device that runs the model on the measuring thread (local or engine CPU, --threads 1)")


@contextmanager
def work_folder(store: CampaignStore):
    """``<db>.work/``, emptied, as the converters' temporary folder while the campaign runs; removed after."""
    work = Path(f"{store.path}.work")
    shutil.rmtree(work, ignore_errors=True)  # a killed run's leftovers; the store's lock says none is running
    try:
        work.mkdir(parents=True)
    except OSError as exc:
        raise path_error(work, exc, "the campaign's work folder") from None
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(work)  # the converters' scratch files too
    try:
        yield work
    finally:
        tempfile.tempdir = saved_tempdir
        shutil.rmtree(work, ignore_errors=True)


def finished(store: CampaignStore, stats: dict) -> dict:
    """What a measure call returns; a campaign none of whose measurements succeeded raises instead."""
    failed = all_failed_error(store)
    if failed is not None:
        raise failed
    return {"stats": stats, "summary": summarize(store)}
