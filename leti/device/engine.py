"""EngineDevice: LETI's own inference engine as a measured device, on the host CPU or on a CUDA GPU.

The device consumes ``.leti`` files (written from the cell by the ``"leti"`` export format, no
TensorFlow involved). Loading a model is the engine's pre-inference: ``Session(model).resize()``
(graph passes, schemes, memory plan; on CUDA the whole run is captured as a CUDA graph). A timed
run is one ``Session.run(io=False)``: the input was set once at load time (random data, as
``benchmark_model`` does) and is not copied again, the outputs stay where they are — the latency of
the model alone, which is what the TFLite devices report too. On CUDA ``run`` ends with a stream
synchronisation, so the clock stops when the GPU is done, not when the launch returns. Python's
garbage collector is paused during the timed runs.

Only one backend is put in the session (``cpu`` or ``cuda``), never a fallback: a model with an op
the backend declines fails to load (recorded by the campaign as ``convert_failed``) instead of
being measured partly somewhere else — the engine's counterpart of "GPU not fully delegated".

Memory figures: on the CPU, resident-set growth after loading (init) and after the runs (overall)
in MB, as the local TFLite device reports them; on CUDA, the device memory the session holds
(weights and its activation arena) as ``mem_peak_mb``.
"""

from __future__ import annotations

import platform
from collections import OrderedDict
from importlib import metadata
from pathlib import Path

import numpy as np

from leti.device.base import Device
from leti.device.stats import Batch, timed_ms
from leti.errors import ConversionError, CorruptModelError, DeviceError

#: device kind -> (engine backend name, device id, delegation recorded on every row)
TARGETS = {"cpu": ("cpu", "engine", "cpu"), "gpu": ("cuda", "cuda-engine", "cuda")}
RUNTIME = "leti-engine"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


class EngineDevice(Device):
    """LETI's engine. ``target="cpu"`` (``threads`` numba/BLAS threads) or ``target="gpu"`` (CUDA
    backend on GPU ``gpu_index``, CUDA graphs on; ``graphs=False`` launches kernel by kernel)."""

    artifact = "leti"
    shares_host_cpu = True  # CPU: the cores are the device; GPU: the host launches every graph

    def __init__(self, target: str = "cpu", threads: int = 1, gpu_index: int = 0, graphs: bool = True,
                 seed: int = 0) -> None:
        if target not in TARGETS:
            raise DeviceError(f"the engine runs on {' or '.join(TARGETS)}, not {target!r}")
        if threads < 1:
            raise DeviceError(f"threads must be >= 1, got {threads}")
        self.target = target
        self.engine_backend, self.id, self.delegation = TARGETS[target]
        self.backend = target
        self.threads = threads
        self.gpu_index = gpu_index
        self.graphs = graphs
        self.seed = seed
        #: loaded sessions by model path: the model being measured and, in paired measurement, the
        #: reference (two at most; the least recently used is dropped and its backends closed)
        self._loaded: OrderedDict[Path, tuple[object, float]] = OrderedDict()
        self._gpu_name = ""
        self._gpu_mb = float("nan")
        if target == "gpu":
            from leti.engine.backends.cuda import available

            if not available():
                raise DeviceError("cuda-engine: the engine's CUDA backend needs CuPy and an NVIDIA GPU; none was found")
            import cupy as cp

            props = cp.cuda.runtime.getDeviceProperties(gpu_index)
            name = props["name"]
            self._gpu_name = name.decode() if isinstance(name, bytes) else str(name)
            self._gpu_props = {"memory_bytes": int(props["totalGlobalMem"]),
                               "capability": f"{props['major']}.{props['minor']}",
                               "multiprocessors": int(props["multiProcessorCount"])}

    # ---- loading ---------------------------------------------------------------------------
    def _backend_spec(self):
        if self.target == "cpu":
            return [f"cpu:{self.threads}"]
        from leti.engine.backends.cuda import CudaBackend

        return [CudaBackend(device=self.gpu_index)]

    def _load(self, model: Path):
        if model in self._loaded:
            self._loaded.move_to_end(model)
            return self._loaded[model]
        while len(self._loaded) >= 2:
            self._close(self._loaded.popitem(last=False)[1][0])
        if not model.is_file():
            raise CorruptModelError(f"model file not found: {model}")
        from leti.device.local import _rss_mb
        from leti.engine.session import Session

        before = _rss_mb()
        gpu_before = self._gpu_used()
        try:
            s = Session(model, backends=self._backend_spec(), graphs=self.graphs).resize()
        except (CorruptModelError, ConversionError):
            raise
        except Exception as exc:  # noqa: BLE001 - a file the format reader accepted, the engine cannot prepare
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CorruptModelError(f"cannot load {model.name} on the engine: {msg}") from None
        rng = np.random.default_rng(self.seed)
        feeds = {t: rng.uniform(-0.5, 0.5, s.shapes[t]).astype(s.graph.tensors[t].dtype) for t in s.graph.inputs}
        s.run(feeds)  # sets the inputs (copied onto the GPU once) and checks that the model runs
        self._gpu_mb = (self._gpu_used() - gpu_before) / 2**20
        self._loaded[model] = (s, before)
        return s, before

    def runner(self, model: Path):
        s, _ = self._load(Path(model))
        go = s.run

        def run_once() -> None:
            try:
                go(io=False)
            except Exception as exc:  # noqa: BLE001 - a kernel failing mid-run: one line, the model named
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise DeviceError(f"{self.id}: running {Path(model).name} failed: {msg}") from None

        return run_once

    def clocks(self) -> tuple[str, ...]:
        # one CPU thread: numba's loops and the BLAS calls run on the calling thread (thread time = wall
        # time within 0.1 % on a quiet host); a GPU run's time is mostly the wait for the device
        return ("wall", "cpu") if self.target == "cpu" and self.threads == 1 else ("wall",)

    # ---- running -----------------------------------------------------------------------------
    def run(self, model: Path, runs: int, warmup: int) -> Batch:
        from leti.device.local import _rss_mb

        model = Path(model)
        _, before = self._load(model)
        init_mb = _rss_mb() - before
        times = timed_ms(self.runner(model), runs, warmup, clock=self.clock_ns)  # a CUDA run ends with a stream synchronisation
        if self.target == "gpu":
            return Batch.from_samples(times, delegation=self.delegation, mem_peak_mb=self._gpu_mb)
        return Batch.from_samples(times, delegation=self.delegation, mem_init_mb=init_mb,
                                  mem_overall_mb=_rss_mb() - before)

    def _gpu_used(self) -> int:
        """Bytes CuPy's memory pool has handed out (0 on the CPU)."""
        if self.target != "gpu":
            return 0
        import cupy as cp

        return int(cp.get_default_memory_pool().used_bytes())

    @staticmethod
    def _close(session) -> None:
        for b in getattr(session, "backends", []):
            close = getattr(b, "close", None)
            if close is not None:
                close()

    def release(self, model: Path | None) -> None:
        """Drop the session of ``model`` (every session with ``None``) and free its backends."""
        for m in list(self._loaded) if model is None else [Path(model)]:
            entry = self._loaded.pop(m, None)
            if entry is not None:
                self._close(entry[0])

    def close(self) -> None:
        self.release(None)

    # ---- facts -------------------------------------------------------------------------------
    def info(self) -> dict:
        from leti.device.host import cpu_name

        out = {"id": self.id, "backend": self.backend, "kind": "engine", "runtime": RUNTIME,
               "engine_backend": self.engine_backend, "machine": platform.machine(),
               "system": f"{platform.system()} {platform.release()}", "host_cpu": cpu_name()}
        if self.target == "cpu":
            import os

            out.update(model=cpu_name(), cores=os.cpu_count(), threads=self.threads)
        else:
            out.update(model=self._gpu_name, gpu_index=self.gpu_index, cuda_graphs=self.graphs, **self._gpu_props)
        return out

    def tool_versions(self) -> dict:
        out = {"python": platform.python_version(), "numpy": _version("numpy"), "numba": _version("numba")}
        if self.target == "gpu":
            import cupy as cp

            out.update(cupy=cp.__version__, cuda_runtime=str(cp.cuda.runtime.runtimeGetVersion()),
                       cuda_driver=str(cp.cuda.runtime.driverGetVersion()))
        return out
