"""An in-run profile of a TFLite model on the local CPU by its prefixes (issue 16): where a model costs more than its kernels.

TFLite's Python interpreter has no per-op profiler (``benchmark_model --enable_op_profiling`` is a phone's tool).
So this script cuts a ``.tflite`` file after its first ``k`` operators (execution order; the cut model's outputs are
every tensor the first ``k`` operators write that a later operator or the model's output reads), times each prefix
with the kernel build's paired protocol against the build's reference kernel, and turns the ratios into ms as the build
does (:func:`~leti.predict.kernels.build_fit.kernel_ms`). The kernel predictor's sum over the prefix's own kernels
(no overhead) stands beside it. A segment between two cuts then has an in-run cost (the difference of two prefixes'
times, every earlier kernel having run before it as in the whole model) and a kernels-alone cost (the difference of
the predicted sums): their ratio says which part of a model pays what the model costs beyond its kernels.

    PYTHONPATH=. python benchmarks/profile_tflite_prefix.py --predictor kp/ --models zoo/a.tflite --cuts 8

Look only at models a predictor's choices may see (the zoo's ``dev`` split).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def prefix_tflite(data: bytes, k: int) -> bytes:
    """The model of ``data`` cut after its first ``k`` operators of subgraph 0 (its outputs: the live frontier)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    model = s.ModelT.InitFromPackedBuf(data, 0)
    sub = model.subgraphs[0]
    ops = sub.operators
    if not 1 <= k <= len(ops):
        raise ValueError(f"a prefix takes 1..{len(ops)} operators, not {k}")
    written = [int(t) for op in ops[:k] for t in op.outputs]
    later = {int(t) for op in ops[k:] for t in op.inputs if t >= 0}
    final = {int(t) for t in sub.outputs}
    outs = [t for t in written if t in later or t in final] or [written[-1]]
    sub.operators = ops[:k]
    sub.outputs = np.array(sorted(set(outs)), dtype=np.int32)
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def operator_count(data: bytes) -> int:
    """Operators of subgraph 0, read without unpacking the model (its weights stay where they are)."""
    from ai_edge_litert import schema_py_generated as s

    return s.Model.GetRootAsModel(data, 0).Subgraphs(0).OperatorsLength()


def cut_points(n_ops: int, cuts: int) -> list[int]:
    return sorted({max(1, round(n_ops * (j + 1) / cuts)) for j in range(cuts)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", type=Path, required=True, help="a kernel build's folder (its kernels.sqlite too)")
    ap.add_argument("--models", type=Path, nargs="+", required=True)
    ap.add_argument("--cuts", type=int, default=8, help="prefixes per model (the last is the whole model)")
    ap.add_argument("--repeats", type=int, default=2, help="times each prefix is measured (the median is kept)")
    ap.add_argument("--out", type=Path, default=None, help="every prefix's row as Parquet")
    args = ap.parse_args(argv)

    import pandas as pd

    from leti.device.registry import open_device
    from leti.predict.kernels.bench import KernelBench
    from leti.predict.kernels.build_fit import invoke_ms, kernel_ms, reference_ms
    from leti.predict.kernels.build_store import BuildStore
    from leti.predict.kernels.model import load_kernel_predictor
    from leti.predict.kernels.split import split_model

    pred = load_kernel_predictor(args.predictor)
    with BuildStore(args.predictor / "kernels.sqlite") as store:
        ref = reference_ms(store)
        empty = invoke_ms(store, ref)
    load0 = os.getloadavg()[0]
    dev = open_device(pred.device, threads=1)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"prefix_{os.getpid()}"
    bench = KernelBench(dev, work)
    rows = []
    print(f"{'model':<40}{'ops':>5}{'kernels':>8}{'in run':>9}{'alone':>9}{'seg run':>9}{'seg alone':>10}"
          f"{'seg x':>7}{'seg MB w':>9}")
    for path in args.models:
        data = path.read_bytes()
        n_ops = operator_count(data)
        prev = (0.0, 0.0, 0.0, 0)
        for k in cut_points(n_ops, args.cuts):
            f = work / f"{path.stem}_p{k}.tflite"
            f.write_bytes(data if k == n_ops else prefix_tflite(data, k))
            table = split_model(f, pred.rules, device=pred.device)
            kern = pred.predict_kernels(table, allow_unknown=True, where=str(f))
            alone = float(kern.predicted_ms.sum())
            wmb = float(kern.bytes_weights.sum()) / 1e6
            ratios = [float(bench.time_file(f).ratio) for _ in range(args.repeats)]
            run = kernel_ms(float(np.median(ratios)), ref, empty)
            seg_run, seg_alone = run - prev[0], alone - prev[1]
            print(f"{path.stem[:39]:<40}{k:>5}{len(kern):>8}{run:>9.3f}{alone:>9.3f}{seg_run:>9.3f}{seg_alone:>10.3f}"
                  f"{seg_run / seg_alone if seg_alone > 0 else np.nan:>7.2f}{wmb - prev[2]:>9.2f}", flush=True)
            seg = kern.iloc[prev[3]:]
            rows.append({"model": path.name, "ops": k, "n_ops": n_ops, "kernels": len(kern), "run_ms": run,
                         "segment": " ".join(f"{t}@{h}x{w}:{b / 1e6:.2f}MB" if b else f"{t}@{h}x{w}" for t, h, w, b in
                                             zip(seg.kernel_type, seg.output_h, seg.output_w, seg.bytes_weights)),
                         "alone_ms": alone, "weights_mb": wmb, "spread": float(np.ptp(ratios) / np.median(ratios))})
            prev = (run, alone, wmb, len(kern))
            f.unlink(missing_ok=True)
    bench.close()
    print(f"reference {ref:.4f} ms, per-invoke {empty * 1e3:.2f} µs; load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; {time.process_time():.0f} s of CPU")
    if args.out is not None:
        pd.DataFrame(rows).to_parquet(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
