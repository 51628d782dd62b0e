"""LocalDevice: the host CPU through ai-edge-litert's TFLite interpreter.

Same knobs as ``benchmark_model`` on a phone: threads, warm-up runs, timed runs, and XNNPACK on or off
(off = the interpreter's built-in kernels only, ``BUILTIN_WITHOUT_DEFAULT_DELEGATES``). Each run is one
``invoke()`` timed with ``perf_counter_ns``; the input is random data set once, like benchmark_model.
The memory figures follow benchmark_model's meaning: resident-set growth after loading (init) and after
the runs (overall), in MB. Every batch carries the delegate coverage (:mod:`leti.device.coverage`):
how many of the graph's nodes XNNPACK runs, the rest falling back to the built-in kernels (an int8
model with an op XNNPACK lacks is partly delegated, and its rows say so).
"""

from __future__ import annotations

import os
import platform
from collections import OrderedDict
from importlib import metadata
from pathlib import Path

import numpy as np

from leti.device.base import Device
from leti.device.host import cpu_name
from leti.device.stats import Batch, timed_ms
from leti.errors import CorruptModelError, DeviceError


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


class LocalDevice(Device):
    """The host CPU. ``threads`` interpreter threads, XNNPACK on by default."""

    artifact = "tflite"
    shares_host_cpu = True

    def __init__(self, threads: int = 1, xnnpack: bool = True, seed: int = 0) -> None:
        if threads < 1:
            raise DeviceError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.xnnpack = xnnpack
        self.backend = "cpu"
        self.id = "local"
        self._rng = np.random.default_rng(seed)
        #: loaded interpreters by model path: the model being measured and, in paired measurement,
        #: the reference (two at most, least recently used dropped first)
        self._loaded: OrderedDict[Path, tuple[object, float]] = OrderedDict()
        self._coverage: dict[Path, object] = {}

    def _load(self, model: Path):
        if model in self._loaded:
            self._loaded.move_to_end(model)
            return self._loaded[model]
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        if not model.is_file():
            raise CorruptModelError(f"model file not found: {model}")
        before = _rss_mb()
        resolver = OpResolverType.AUTO if self.xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        try:
            interp = Interpreter(model_path=str(model), num_threads=self.threads,
                                 experimental_op_resolver_type=resolver)
            interp.allocate_tensors()
            for d in interp.get_input_details():
                shape, dtype = d["shape"], np.dtype(d["dtype"])
                data = (self._rng.uniform(-0.5, 0.5, shape) if dtype.kind == "f"
                        else self._rng.integers(0, 100, shape))
                interp.set_tensor(d["index"], data.astype(dtype))
        except (ValueError, RuntimeError) as exc:
            raise CorruptModelError(f"cannot load {model.name}: {str(exc).splitlines()[0]}") from None
        from leti.device.coverage import interpreter_coverage

        self._coverage[model] = interpreter_coverage(interp, "XNNPACK")
        self._loaded[model] = (interp, before)
        while len(self._loaded) > 2:
            self._loaded.popitem(last=False)
        return interp, before

    def runner(self, model: Path):
        interp, _ = self._load(Path(model))
        invoke = interp.invoke

        def run_once() -> None:
            try:
                invoke()
            except RuntimeError as exc:
                raise DeviceError(f"local: invoking {Path(model).name} failed: {str(exc).splitlines()[0]}") from None

        return run_once

    def run(self, model: Path, runs: int, warmup: int) -> Batch:
        model = Path(model)
        _, before = self._load(model)
        init_mb = _rss_mb() - before
        times = timed_ms(self.runner(model), runs, warmup, clock=self.clock_ns)
        cov = self._coverage[model]
        return Batch.from_samples(times, delegation="xnnpack" if self.xnnpack else "cpu",
                                  mem_init_mb=init_mb, mem_overall_mb=_rss_mb() - before,
                                  delegate="XNNPACK" if self.xnnpack else "", delegated_nodes=cov.delegated_nodes,
                                  total_nodes=cov.total_nodes)

    def clocks(self) -> tuple[str, ...]:
        # one interpreter thread: XNNPACK and the builtin kernels run every op on the calling thread
        return ("wall", "cpu") if self.threads == 1 else ("wall",)

    def release(self, model: Path) -> None:
        self._loaded.pop(Path(model), None)
        self._coverage.pop(Path(model), None)

    def close(self) -> None:
        self._loaded.clear()

    def info(self) -> dict:
        return {
            "id": self.id, "backend": self.backend, "kind": "local", "model": cpu_name(),
            "machine": platform.machine(), "system": f"{platform.system()} {platform.release()}",
            "cores": os.cpu_count(), "threads": self.threads, "xnnpack": self.xnnpack,
        }

    def tool_versions(self) -> dict:
        return {"ai-edge-litert": _version("ai-edge-litert"), "python": platform.python_version()}
