"""The parser against benchmark_model output in the stock line formats (fixtures: data/benchmark_logs)."""

import math
from pathlib import Path

import pytest

from leti.device import benchmark_log as bl
from leti.errors import CorruptModelError, DeviceError

LOGS = Path(__file__).parent / "data" / "benchmark_logs"


def log(name: str) -> bl.BenchmarkLog:
    return bl.parse((LOGS / name).read_text())


def test_current_format_with_percentiles_memory_and_xnnpack():
    lg = log("current_cpu.txt")
    assert lg.timing_format == "current"
    assert lg.warmup.count == 10 and lg.warmup.avg == 2915.6
    s = lg.inference
    assert (s.count, s.first, s.curr, s.min, s.max, s.avg, s.std) == (300, 2905, 2880, 2788, 3542, 2893.42, 61)
    assert (s.p5, s.median, s.p95) == (2823, 2884, 2991)
    assert lg.timings_us == {"init": 9412, "first": 3120, "warmup": 2915.6, "inference": 2893.42}
    assert (lg.mem_init_mb, lg.mem_overall_mb, lg.mem_peak_mb) == (3.14062, 4.01953, 12.9922)
    assert lg.num_threads == 4 and lg.model_size_mb == 0.151944
    assert lg.delegation("cpu") == "xnnpack"
    b = lg.to_batch("cpu")
    assert b.n == 300 and b.mean_ms == pytest.approx(2.89342) and b.median_ms == pytest.approx(2.884)
    # population std 61 us printed; LETI stores the sample std
    assert b.std_ms == pytest.approx(0.061 * math.sqrt(300 / 299))
    assert b.min_ms == pytest.approx(2.788) and b.max_ms == pytest.approx(3.542)
    assert b.raw_log.startswith("INFO: STARTING!")


def test_gpu_full_partial_none_and_rejected():
    assert log("current_gpu_full.txt").delegation("gpu") == "full"
    part = log("gpu_partial.txt")
    assert part.delegation("gpu") == "partial"
    assert part.delegates[-1] == bl.DelegateReport("GPU", "partial", 3)
    assert log("gpu_not_executed.txt").delegation("gpu") == "none"
    rej = log("gpu_rejected.txt")
    assert rej.delegation("gpu") == "rejected" and rej.inference is None
    with pytest.raises(bl.NotDelegatedError, match="Disallowed CPU fallback"):
        rej.to_batch("gpu", "pixel")
    # a GPU measurement never silently becomes a CPU one: the record says how much ran on the GPU
    assert log("gpu_partial.txt").to_batch("gpu").delegation == "partial"
    full = log("current_gpu_full.txt").to_batch("gpu")
    assert full.delegation == "full" and full.n == 50 and math.isnan(full.median_ms)  # no median printed


def test_older_formats():
    lg = log("legacy_peak_memory.txt")
    assert lg.timing_format == "current"
    assert lg.warmup == bl.Stat(1, first=3512391, curr=3512391, min=3512391, max=3512391, avg=3512391, std=0.0,
                                median=3512391, all_same=True)
    assert lg.inference.avg == 2.95034e06 and lg.inference.std == 109798
    assert (lg.mem_init_mb, lg.mem_overall_mb) == (4.21094, 46.0859) and math.isnan(lg.mem_peak_mb)
    assert lg.num_threads == 1 and lg.delegation("cpu") == "cpu"
    b = lg.to_batch("cpu")
    assert b.mean_ms == pytest.approx(2950.34) and math.isnan(b.median_ms)

    old = log("legacy_average.txt")
    assert old.timing_format == "legacy"
    assert old.timings_us == {"warmup": 146161, "init": 4452, "inference": 137722}
    assert old.warmup.count == 1 and old.inference.count == 50 and old.inference.avg == 137722


def test_all_same_variant_has_no_space_and_no_spread():
    lg = log("all_same.txt")
    assert lg.warmup.all_same and lg.warmup.count == 3 and lg.warmup.curr == 1
    b = lg.to_batch("cpu")
    assert (b.n, b.mean_ms, b.std_ms, b.min_ms, b.max_ms) == (20, 0.001, 0.0, 0.001, 0.001)


def test_count_zero_is_not_a_measurement():
    lg = log("dry_run_count0.txt")
    assert lg.inference == bl.Stat(0) and math.isnan(lg.timings_us["inference"])
    with pytest.raises(bl.MalformedLogError, match="count=0"):
        lg.to_batch("cpu")


def test_model_load_failure_is_a_corrupt_model():
    lg = log("model_load_failure.txt")
    assert lg.model_load_failed
    with pytest.raises(CorruptModelError, match="could not load the model"):
        lg.to_batch("cpu", "dev")


def test_crash_after_warmup_is_not_read_as_timing():
    lg = log("crash_after_warmup.txt")
    assert lg.warmup.count == 10 and lg.inference is None
    with pytest.raises(bl.MalformedLogError):
        lg.to_batch("cpu")


def test_logcat_prefix():
    lg = log("logcat_android_app.txt")
    assert lg.inference.count == 10 and lg.inference.median == 2709263
    assert lg.mem_overall_mb == 337


@pytest.mark.parametrize("text", ["", "Segmentation fault\n", "\x00\xffgarbage count=abc\n", "count=5 first=x\n"])
def test_garbage_is_malformed(text):
    with pytest.raises(DeviceError):
        bl.parse(text).to_batch("cpu")
