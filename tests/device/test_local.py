"""LocalDevice on real .tflite models through ai-edge-litert."""

import pytest

from leti.device.protocol import Protocol, measure
from leti.device.local import LocalDevice
from leti.errors import CorruptModelError


def test_runs_and_warmup_are_honoured(tiny_models):
    dev = LocalDevice(threads=1)
    b = dev.run(tiny_models[1], runs=25, warmup=3)
    assert b.n == 25 and len(b.samples) == 25
    assert 0 < b.min_ms <= b.median_ms <= b.max_ms and b.delegation == "xnnpack"
    assert b.mem_overall_mb == b.mem_overall_mb  # a number, not NaN, on Linux


def test_bigger_model_is_slower(tiny_models):
    dev = LocalDevice(threads=1)
    small = measure(dev, tiny_models[0], Protocol(runs=40, warmup=5, max_rel_std=10))
    big = measure(dev, tiny_models[-1], Protocol(runs=40, warmup=5, max_rel_std=10))
    assert big.median_ms > 3 * small.median_ms


def test_xnnpack_off_uses_builtin_kernels(tiny_models):
    on = LocalDevice(xnnpack=True).run(tiny_models[-1], 20, 3)
    off = LocalDevice(xnnpack=False).run(tiny_models[-1], 20, 3)
    assert on.delegation == "xnnpack" and off.delegation == "cpu"
    assert off.median_ms != on.median_ms


def test_info_and_versions():
    dev = LocalDevice(threads=2)
    assert dev.info()["threads"] == 2 and dev.info()["cores"] >= 1
    assert dev.tool_versions()["ai-edge-litert"] != "absent"


def test_broken_and_missing_models_raise_one_line(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"this is not a flatbuffer" * 10)
    with pytest.raises(CorruptModelError, match="bad.tflite") as e:
        LocalDevice().run(bad, 5, 0)
    assert "\n" not in str(e.value)
    with pytest.raises(CorruptModelError, match="not found"):
        LocalDevice().run(tmp_path / "missing.tflite", 5, 0)


def test_cpu_clock_leaves_out_the_time_a_run_waits():
    """The CPU clock counts what the measuring thread runs, not the time it waits (a preempted run)."""
    import time

    from leti.device.stats import CLOCKS, timed_ms

    def nap():
        time.sleep(0.02)

    assert timed_ms(nap, 3, 0).min() >= 19.0
    assert timed_ms(nap, 3, 0, clock=CLOCKS["cpu"]).max() < 5.0


def test_local_device_times_by_the_protocols_clock_and_restores_it(tiny_models):
    import time

    from leti.errors import DeviceError

    dev = LocalDevice(threads=1)
    cpu = measure(dev, tiny_models[-1], Protocol(runs=30, warmup=3, max_rel_std=10, clock="cpu"),
                  reference=tiny_models[0])
    assert dev.clock_ns is time.perf_counter_ns  # back on the wall clock after the measurement
    wall = measure(dev, tiny_models[-1], Protocol(runs=30, warmup=3, max_rel_std=10), reference=tiny_models[0])
    assert cpu.ratio > 1.5 and wall.ratio > 1.5 and 0 < cpu.min_ms <= cpu.median_ms
    with dev.timing("cpu"):
        assert dev.clock_ns is time.thread_time_ns
    with pytest.raises(DeviceError, match="cannot time runs by the 'cpu' clock"):
        measure(LocalDevice(threads=2), tiny_models[0], Protocol(runs=5, warmup=1, clock="cpu"))
