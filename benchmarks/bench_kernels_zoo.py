"""Any-model prediction on unseen real models (issue 16): a kernel predictor of the local CPU (``leti kernels
build``) against the measured zoo (``benchmarks/build_zoo.py`` + ``leti measure --models``), per family.

    python benchmarks/bench_kernels_zoo.py --predictor kp/ --zoo zoo/ --dataset datasets/zoo_local_cpu.parquet

Every zoo model file is predicted with :func:`leti.predict_model_latency` (split into the kernels XNNPACK runs,
each kernel predicted, plus the learned per-model overhead) and compared with its measured latency
(``corrected_ms`` of a paired campaign, else ``mean_ms``). No zoo model was a source of a kernel: the sampler
draws from keras.applications at their default sizes and widths; the zoo holds other resolutions and widths,
re-sampled variants and NB101 networks. Prints Acc@5/Acc@10 (share of models within 5/10 % of the measured
latency) per family and overall, the median and worst errors, a FLOPs baseline (latency proportional to FLOPs
with the single best scale, fitted on the zoo itself: an *oracle* scale, so an upper bound for that baseline)
and the minutes the kernel build spent measuring. ``--json`` writes the per-model rows. The ``dev``/``test``
lines split the zoo by a hash of the file name (:func:`zoo_split`, 30 % dev): a choice made by looking at zoo
errors may look at ``dev`` only; ``test`` is then the unseen figure. Where the campaign records that XNNPACK left
some models' nodes to TFLite's own kernels, two more lines score the fully and the partly delegated models apart
(:func:`delegation`).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def reference_cpu_ms(path: Path, runs: int = 300) -> float:
    """The reference model's latency in the calling thread's CPU time (1 thread, XNNPACK): what it takes
    when no other process preempts it — the scale the kernel build's CPU-clock measurements have."""
    from ai_edge_litert.interpreter import Interpreter

    from leti.predict.lut import median_invoke_ms

    return median_invoke_ms(Interpreter(model_path=str(path), num_threads=1), runs, 20, clock=time.thread_time)


def read_campaign(path: Path, columns: list[str] | None = None) -> tuple[pd.DataFrame, dict]:
    """A campaign export's rows (``columns`` only, when given) and its ``.device.json`` (``{}`` when absent)."""
    if not path.is_file():
        sys.exit(f"{Path(sys.argv[0]).name}: {path}: no such campaign export")
    side = path.with_suffix(".device.json")
    return pd.read_parquet(path, columns=columns), json.loads(side.read_text()) if side.is_file() else {}


def measured_latency(dataset: Path, zoo: Path, scale: str, reference_ms: float | None = None) -> tuple[pd.Series, str]:
    """Each model's latency: with ``--reference-ms`` its paired ratio to the campaign's reference model times that
    time (the reference's latency in another campaign, e.g. the one timed right after the predictor's store: the
    zoo then is on that campaign's scale, whatever the host's speed did since); ``--scale cpu-reference`` takes its
    paired ratio to the campaign's reference model
    times the reference's CPU-clock latency measured now; ``--scale corrected`` the export's ``corrected_ms``
    (ratio × the reference's median latency over the campaign, in the campaign's clock: on a wall-clock campaign
    a loaded host inflates it). ``auto`` (the default): ``corrected`` when the campaign timed by the CPU clock
    (``leti measure --clock cpu``: its ``corrected_ms`` is already on the kernels' scale, and taken over the
    whole campaign beside the ratios), else ``cpu-reference``."""
    df, side = read_campaign(dataset)
    ref_model = side.get("reference_model")
    if reference_ms is not None:
        return (df.groupby("model")["ratio"].median() * reference_ms,
                f"paired ratio x reference {ref_model} at {reference_ms:.4f} ms (given; its median in this campaign: "
                f"{df.ref_ms.median():.4f} ms)")
    if scale == "auto":
        scale = "corrected" if (side.get("protocol") or {}).get("clock") == "cpu" else "cpu-reference"
    if scale == "cpu-reference" and "ratio" in df and ref_model and (zoo / ref_model).is_file():
        ref = reference_cpu_ms(zoo / ref_model)
        how = (f"paired ratio x reference {ref_model} at {ref:.3f} ms CPU clock "
               f"(its median wall time in the campaign: {df.ref_ms.median():.3f} ms)")
        return df.groupby("model")["ratio"].median() * ref, how
    col = "corrected_ms" if "corrected_ms" in df and df["corrected_ms"].notna().any() else "mean_ms"
    clock = (side.get("protocol") or {}).get("clock", "wall")
    return df.groupby("model")[col].median(), f"the export's {col} ({clock} clock campaign)"


def delegation(datasets: list[Path]) -> pd.Series:
    """Per model, whether XNNPACK ran all of it (``fully_delegated`` of every row of the campaigns; models of a
    campaign without the column are left out). Why a line of its own: a node XNNPACK leaves to TFLite's built-in
    kernels splits the graph into partitions, and neither its built-in kernel nor the switch between partitions is
    what the kernels timed alone show (session 57: NB101's uneven channel splits, ``SPLIT_V``; NASNet's average
    pools and concatenations)."""
    parts = [p[["model", "fully_delegated"]] for p in (read_campaign(d, None)[0] for d in datasets)
             if "fully_delegated" in p]
    if not parts:
        return pd.Series(dtype=bool)
    return pd.concat(parts, ignore_index=True).groupby("model")["fully_delegated"].min().astype(bool)


def combined_latency(datasets: list[Path], reference_ms: float) -> tuple[pd.Series, str]:
    """Each model's median paired ratio over every pass of several campaigns of the same zoo (the models all of them
    kept), times ``reference_ms``: a truth with less of one campaign's noise (``zoo_repeatability.py``: two campaigns
    agree at 97-100 % Acc@10, so one campaign alone caps what a predictor can be shown to reach)."""
    frames, refs = [], set()
    for path in datasets:
        rows, side = read_campaign(path, ["model", "ratio"])
        refs.add(side.get("reference_model"))
        frames.append(rows)
    if len(refs) != 1 or None in refs:
        sys.exit(f"bench_kernels_zoo: the campaigns were paired against different (or unrecorded) reference models: "
                 f"{sorted(map(str, refs))}")
    kept = set.intersection(*(set(f.model) for f in frames))
    rows = pd.concat(frames)
    rows = rows[rows.model.isin(kept)]
    return (rows.groupby("model")["ratio"].median() * reference_ms,
            f"median paired ratio over {len(datasets)} campaigns ({len(kept)} models all of them kept) x reference "
            f"{refs.pop()} at {reference_ms:.4f} ms (given)")


def build_minutes(predictor: Path) -> float | None:
    db = predictor / "kernels.sqlite"
    if not db.is_file():
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        row = c.execute("select value from meta where key = 'spent_s'").fetchone()
    return float(json.loads(row[0])) / 60.0 if row else None


def zoo_split(model: str, dev_share: float = 0.3) -> str:
    """``dev`` for a fixed ~30 % of the zoo (by a hash of the file name), else ``test``. Choices made while
    looking at zoo errors are made on ``dev`` only; the ``test`` line is the figure that stays unseen."""
    import hashlib

    return "dev" if int(hashlib.sha256(model.encode()).hexdigest()[:8], 16) / 16 ** 8 < dev_share else "test"


def summary_line(name: str, g: pd.DataFrame) -> str:
    return (f"{name:<24}{len(g):>5}{acc(g.err, .05):>8.1f}{acc(g.err, .10):>8.1f}"
            f"{np.median(np.abs(g.err)) * 100:>9.1f}%{np.abs(g.err).max() * 100:>7.0f}%"
            f"{np.median(g.err) * 100:>7.1f}%{g.inside90.mean() * 100:>7.0f}%{acc(g.flops_err, .10):>10.1f}")


def acc(err: np.ndarray, within: float) -> float:
    return float(np.mean(np.abs(err) <= within) * 100.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", type=Path, required=True)
    ap.add_argument("--zoo", type=Path, required=True, help="folder of the zoo's model files and zoo.parquet")
    ap.add_argument("--dataset", type=Path, nargs="+", required=True,
                    help="the zoo's measured latencies (leti export); several campaigns of the same zoo (with "
                         "--reference-ms) score against each model's median paired ratio over all their passes")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--allow-unknown", action="store_true")
    ap.add_argument("--scale", choices=("auto", "cpu-reference", "corrected"), default="auto",
                    help="how the measured ratios become ms (see measured_latency); auto: corrected for a CPU-clock "
                         "campaign, else cpu-reference")
    ap.add_argument("--reference-ms", type=float, default=None,
                    help="take each model's paired ratio times this reference latency (overrides --scale)")
    args = ap.parse_args(argv)
    if args.reference_ms is not None and not args.reference_ms > 0:
        ap.error(f"--reference-ms must be a positive number of milliseconds, not {args.reference_ms}")
    if len(args.dataset) > 1 and args.reference_ms is None:
        ap.error("several --dataset campaigns are put on one scale by --reference-ms (their hosts' speeds differ)")

    import leti
    from leti.errors import LetiError
    from leti.predict.kernels.model import load_kernel_predictor

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    kp = load_kernel_predictor(args.predictor)
    if len(args.dataset) > 1:
        truth, how = combined_latency(args.dataset, args.reference_ms)
    else:
        truth, how = measured_latency(args.dataset[0], args.zoo, args.scale, args.reference_ms)
    manifest = pd.read_parquet(args.zoo / "zoo.parquet").set_index("model")
    rows, refused = [], []
    for model, ms in truth.items():
        path = args.zoo / model
        if not path.is_file() or model not in manifest.index:
            continue
        try:
            r = leti.predict_model_latency(path, kp, allow_unknown=args.allow_unknown)
        except LetiError as exc:
            refused.append(f"{model}: {exc}")
            continue
        m = manifest.loc[model]
        rows.append({"model": model, "family": m.family, "measured_ms": float(ms), "predicted_ms": r.latency_ms,
                     "low_ms": r.low_ms, "high_ms": r.high_ms, "kernel_sum_ms": r.kernel_sum_ms,
                     "kernels": len(r.kernels), "flops": float(m.flops)})
    df = pd.DataFrame(rows)
    df["err"] = df.predicted_ms / df.measured_ms - 1
    scale = float(np.exp(np.median(np.log(df.measured_ms / df.flops))))
    df["flops_err"] = df.flops * scale / df.measured_ms - 1
    df["inside90"] = (df.low_ms <= df.measured_ms) & (df.measured_ms <= df.high_ms)
    df["split"] = [zoo_split(m) for m in df.model]
    delegated = delegation(args.dataset)
    df["fully_delegated"] = df.model.map(delegated)

    print(f"predictor {args.predictor} ({kp.describes}); fusion rules: {kp.rules.to_dict()}")
    print(f"measured latency: {how}")
    minutes = build_minutes(args.predictor)
    print(f"kernel measurement: {minutes:.1f} minutes (leti kernels build, wall time incl. conversion)"
          if minutes is not None else "kernel measurement: minutes not recorded")
    print(f"{'family':<24}{'n':>5}{'Acc@5':>8}{'Acc@10':>8}{'med|err|':>10}{'worst':>8}{'bias':>8}"
          f"{'in 90%':>8}{'FLOPs@10':>10}")
    for fam, g in sorted(df.groupby("family"), key=lambda kv: kv[0]):
        print(summary_line(fam, g))
    print(summary_line("ALL", df))
    for part in ("dev", "test"):
        print(summary_line(f"ALL, {part} split", df[df.split == part]))
    partly = df.fully_delegated.eq(False)  # NaN (not recorded) is neither
    if partly.any():
        print(summary_line("ALL, fully delegated", df[df.fully_delegated.eq(True)]))
        print(summary_line("ALL, partly delegated", df[partly]))
    for line in refused[:5]:
        print(f"refused: {line[:200]}")
    print(f"zoo models predicted: {len(df)} of {len(truth)} measured ({len(refused)} refused); {time.perf_counter() - t0:.0f} s; "
          f"load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(df.to_json(orient="records", indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
