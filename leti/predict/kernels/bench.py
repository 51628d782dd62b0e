"""Timing kernel models on one device: build, convert, split, check, measure (paired), as one step.

Why one place: the kernel sampler, fusion detection and the calibration models all time small Keras
models the same way, and a kernel's measured latency is only worth something when it is attached to the
kernel the runtime really ran. :class:`KernelBench` converts a model to what the device consumes (TFLite
for the local CPU, ``.leti`` for LETI's engine), splits the very same graph with the runtime's fusion rules
(:func:`~leti.predict.kernels.split.split_graph`), checks a single-kernel model split into exactly the kernel
meant (:func:`~leti.models.kernel_models.check_split`), and measures it with LETI's paired protocol against
one fixed reference kernel (:data:`REFERENCE`): a ratio, robust to the host's drift, that the build turns
into milliseconds with one campaign-wide reference latency.

TensorFlow's many live objects make every full garbage collection (which the paired protocol runs before
its timed blocks) cost ~0.3 s; the bench collects once and freezes what survives (``gc.freeze``), which
brings a small kernel's measurement from ~1 s to a few tens of ms.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from leti.device.base import Device, Measurement
from leti.device.protocol import Protocol, measure
from leti.errors import DeviceError
from leti.models.kernel_models import KernelConfig, chain_model, check_split, kernel_model
from leti.predict.kernels.split import FusionRules, rules_for, split_graph

#: device id -> the runtime its kernels describe
RUNTIMES = {"local": "tflite-xnnpack", "engine": "leti-engine-cpu", "cuda-engine": "leti-engine-cuda"}
#: short paired experiments (a kernel is measured by many configurations, not by many runs of one), timed
#: with the thread's CPU time: on a shared host a kernel longer than a time slice is otherwise charged for
#: the other processes' turns (measured: 4.8 ms of CPU, 17 ms of wall time at a load of 8 on 2 cores)
KERNEL_PROTOCOL = Protocol(runs=100, warmup=3, adaptive=True, min_runs=10, ci_rel=0.03, max_attempts=1,
                           max_rel_std=0.2, clock="cpu")
#: the fixed reference every kernel is timed against (about 0.2 ms on one core of a desktop CPU)
REFERENCE = KernelConfig("conv2d", 28, 28, 32, 32, kernel=3)


def runtime_of(device: Device) -> str:
    """The runtime name kernel tables and predictors use for ``device`` (its fusion rules key)."""
    try:
        return RUNTIMES[device.id]
    except KeyError:
        raise DeviceError(f"kernel builds run on a device that runs models in this process "
                          f"({', '.join(RUNTIMES)}), not on {device.id!r}") from None


@dataclass
class Timed:
    """One timed model: its kernel rows (the split) and the paired measurement."""

    kernels: pd.DataFrame
    measurement: Measurement
    seconds: float

    @property
    def ratio(self) -> float:
        return float(self.measurement.ratio)


class KernelBench:
    """Times kernel models on ``device`` against :data:`REFERENCE`; model files live in ``workdir``."""

    def __init__(self, device: Device, workdir: str | Path, protocol: Protocol = KERNEL_PROTOCOL,
                 rules: FusionRules | None = None) -> None:
        if not device.pairable:
            raise DeviceError(f"{device.id}: kernel measurement is paired against a reference kernel; the device "
                              "must run models in this process (local, engine)")
        self.device = device
        self.use(protocol)
        self.runtime = runtime_of(device)
        self.rules = rules if rules is not None else rules_for(self.runtime)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._built = 0
        self.reference, _ = self.write(kernel_model(REFERENCE, seed=0), "reference")
        self._settle()

    def use(self, protocol: Protocol) -> None:
        """Measure with ``protocol`` from now on (its CPU clock only where one thread runs the model)."""
        if protocol.clock not in self.device.clocks():
            protocol = replace(protocol, clock="wall")  # other threads' work is not in the calling thread's time
        self.protocol = protocol

    @staticmethod
    def _settle() -> None:
        """Free TensorFlow's garbage now, then freeze the survivors out of every later collection."""
        from leti.models.tflite import release

        release(collect=True)
        gc.freeze()

    def write(self, model, stem: str):
        """``model`` (Keras) as the device's model file in the workdir, and the engine graph of the very
        bytes the device runs (what the split works on)."""
        from leti.engine.convert.from_tflite import from_tflite
        from leti.models.keras_import import keras_to_tflite
        from leti.models.tflite import release

        data = keras_to_tflite(model)
        release()
        self._built += 1
        if self._built % 50 == 0:
            self._settle()
        graph = from_tflite(data)
        if self.device.artifact == "tflite":
            path = self.workdir / f"{stem}.tflite"
            path.write_bytes(data)
        elif self.device.artifact == "leti":
            from leti.engine import format as fmt

            path = fmt.save(graph, self.workdir / f"{stem}.leti")
        else:
            raise DeviceError(f"{self.device.id}: kernel models are made as .tflite or .leti, not "
                              f"{self.device.artifact}")
        return Path(path), graph

    def time_file(self, path: Path) -> Measurement:
        try:
            return measure(self.device, path, self.protocol, reference=self.reference)
        finally:
            self.device.release(path)

    def _timed(self, build, stem: str, check: KernelConfig | None = None) -> Timed:
        start = time.perf_counter()
        with warnings.catch_warnings():  # Keras' advice on odd but deliberate shapes is not the user's business
            warnings.simplefilter("ignore")
            path, graph = self.write(build(), stem)
        try:
            outside = None
            if check is None and self.runtime == "tflite-xnnpack":  # a network: which kernels XNNPACK leaves out
                from leti.device.coverage import xnnpack_fallback_nodes

                outside = xnnpack_fallback_nodes(path)
            rows = split_graph(graph, self.rules, model=stem, device=self.device.id, outside=outside)
            if check is not None:
                check_split(check, rows)
            m = self.time_file(path)
        finally:
            path.unlink(missing_ok=True)
        return Timed(rows, m, time.perf_counter() - start)

    def kernel(self, config: KernelConfig, seed: int = 0, stem: str | None = None) -> Timed:
        """Time the single-kernel model of ``config`` (checked to split into that one kernel)."""
        return self._timed(lambda: kernel_model(config, seed), stem or config.name, check=config)

    def chain(self, configs: list[KernelConfig], seed: int = 0, stem: str = "chain") -> Timed:
        """Time a multi-kernel model running ``configs`` in sequence (no single-kernel check)."""
        return self.model(lambda: chain_model(configs, seed, name=stem.replace("-", "_")), stem)

    def model(self, build, stem: str) -> Timed:
        """Time the multi-kernel Keras model ``build()`` returns (no single-kernel check)."""
        return self._timed(build, stem)

    def network(self, params: dict, stem: str = "network") -> Timed:
        """Time a whole random network (:mod:`leti.models.random_networks`) described by ``params``."""
        from leti.models.random_networks import keras_network

        return self.model(lambda: keras_network(params, name=stem.replace("-", "_")), stem)

    def empty(self) -> Timed:
        """A near-empty model (one ReLU on four numbers): the per-invoke cost of the runtime."""
        return self.kernel(KernelConfig("relu", 1, 1, 4), stem="empty")

    def close(self) -> None:
        self.device.release(self.reference)
