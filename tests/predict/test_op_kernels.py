"""Op profiles lined up with LETI's kernel split (leti.predict.kernels.profiled): a real model's op table, as
the loopback runner prints it with --enable_op_profiling=true, gets the split's shapes where it lines up,
and keeps only its types, with the reason, where it does not."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.predict.test_kernel_split import se_block_net

from leti.device import op_profile
from leti.predict.kernels.profiled import mismatch, op_kernel_table
from leti.predict.kernels.schema import normalize
from leti.predict.kernels.split import split_model

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("op-kernels-profile")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def se_profile(tmp_path_factory):
    """An SE-block network as .tflite, and the op rows of one profiled run of it on the runner stand-in."""
    from leti.models.tflite import convert_keras

    path = tmp_path_factory.mktemp("se") / "se.tflite"
    path.write_bytes(convert_keras(se_block_net()))
    run = subprocess.run([sys.executable, "-m", "leti.device.loopback.runner", f"--graph={path}", "--num_runs=5",
                          "--warmup_runs=1", "--min_secs=0", "--warmup_min_secs=0", "--enable_op_profiling=true"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stdout + run.stderr
    return path, op_profile.parse(run.stdout)


def frame(ops, path, runtime="tflite-xnnpack", model="se.tflite"):
    """Op rows as `leti export` hands them over (one model, medians over passes)."""
    return pd.DataFrame([{"model": model, "hash": "h" + model, "op_index": o.op_index, "node_type": o.node_type,
                          "op_kernel_type": o.kernel_type, "op_name": o.name, "latency_ms": o.avg_ms,
                          "first_ms": o.first_ms, "times_called": o.times_called, "passes": 1, "device": "phone",
                          "runtime": runtime, "precision": "float", "model_path": path} for o in ops])


def test_a_real_profile_lines_up_and_takes_the_splits_shapes(se_profile):
    path, ops = se_profile
    assert [o.node_type for o in ops][:3] == ["CONV_2D", "DEPTHWISE_CONV_2D", "HARD_SWISH"]
    table, notes = op_kernel_table(frame(ops, str(path)))
    split = split_model(path)
    assert notes == {"not_aligned": {}, "view_rows": 0} and table["aligned"].all()
    for c in ("kernel_type", "input_h", "input_c", "output_c", "kernel_h", "stride", "groups", "flops", "fused"):
        assert table[c].tolist() == split[c].tolist(), c
    assert (table["usable"] == (table["latency_ms"] > 0)).all()
    # the usable rows are a LETI kernel table as they are
    kt = normalize(table[table["usable"]], "ops")
    assert len(kt) == int(table["usable"].sum()) and kt["latency_ms"].gt(0).all()


def test_another_runtimes_fusion_does_not_line_up_and_says_where(se_profile):
    path, ops = se_profile
    table, notes = op_kernel_table(frame(ops, str(path), runtime="tflite-gpu"))  # the GPU links followers in
    why = notes["not_aligned"]["se.tflite"]
    assert why.startswith(f"{len(ops)} op rows but ") and "first difference at kernel" in why
    assert not table["aligned"].any() and not table["usable"].any() and table["input_h"].isna().all()
    assert table["kernel_type"].tolist() == [o.kernel_type for o in ops]  # the types are kept


def test_missing_and_unreadable_model_files_are_reasons_not_errors(se_profile, tmp_path):
    _, ops = se_profile
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a flatbuffer")
    both = pd.concat([frame(ops, None, model="gone"), frame(ops, str(junk), model="junk")], ignore_index=True)
    table, notes = op_kernel_table(both)
    assert "model file was not found" in notes["not_aligned"]["gone"]
    assert notes["not_aligned"]["junk"].startswith("LETI cannot split it into kernels (")
    assert len(table) == 2 * len(ops) and not table["aligned"].any()


def test_xnnpack_rows_with_the_partition_row_and_copies_line_up_on_their_kernels(se_profile):
    path, ops = se_profile
    xnn = {"conv2d": "Convolution (NHWC, F32) IGEMM", "depthwise_conv2d": "Convolution (NHWC, F32) DWConv",
           "hard_swish": "HardSwish (NC, F32)", "mean": "Global Average Pooling (NWC, F32)", "mul": "Multiply (ND, F32)",
           "add": "Add (ND, F32)", "max_pool": "Max Pooling (NHWC, F32)", "dense": "Fully Connected (NC, F32) GEMM"}
    rows = [op_profile.OpTime(0, "TfLiteXNNPackDelegate", "delegate", "[out]:12", 1.0, 1.0)]
    for o in ops:
        rows.append(op_profile.OpTime(len(rows), xnn[o.kernel_type], o.kernel_type, f"Delegate/{xnn[o.kernel_type]}:"
                                      f"{o.op_index}", o.first_ms, o.avg_ms))
        if o.kernel_type == "mean":  # XNNPACK copies a tensor here: no kernel of the split
            rows.append(op_profile.OpTime(len(rows), "Copy (NC, X32)", "copy", "Delegate/Copy (NC, X32):99", 0, 0))
    table, notes = op_kernel_table(frame(rows, str(path)))
    assert notes["not_aligned"] == {} and notes["view_rows"] == 3
    assert table["aligned"].sum() == len(ops)
    assert set(table.loc[~table["aligned"], "kernel_type"]) == {"delegate", "copy"}


def test_mismatch_wording_and_grouped_convolutions():
    assert mismatch(["conv2d", "add"], ["grouped_conv2d", "add"]) is None
    assert mismatch(["conv2d"], ["conv2d", "add"]) == "1 op rows but 2 kernels in LETI's split"
    assert mismatch(["conv2d", "mul"], ["conv2d", "add"]) == "kernel 1 of 2 differs: the profile's mul, the split's add"
    assert mismatch(["mul", "add"], ["add"]) == ("2 op rows but 1 kernels in LETI's split; first difference at "
                                                 "kernel 0: the profile's mul, the split's add")
