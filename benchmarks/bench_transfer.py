"""Few-shot latency transfer (issue 17): the HELP protocol on the public NB201 data, LETI's own NB101
devices, and chosen-vs-random cells.

* HELP split: each of pixel2, raspi4, titan_rtx_1, gold_6226, eyeriss is the target once, the other
  four are the sources; N = 10, 20 random target cells per seed train, every other target cell tests.
  Transfer predictors (``transfer-ridge``, ``transfer-help``) against from-scratch predictors fitted on
  the same N cells alone (``ransac``, ``catboost-rich``; ``scratch*`` is the better of the two per device,
  picked on the test set, so it flatters the baseline) and the FLOPs predictor. HELP's 10-sample Spearman
  is printed beside.
* NB101, LETI's own devices (``leti export`` datasets sharing cell hashes): engine CPU ← TFLite CPU and
  H200 engine ← both, N = 10, 20, 50.
* Choosing cells (``choose``): ``transfer-ridge`` on the N cells of :func:`leti.predict.transfer.choose.choose`
  (``stratified`` and the default ``design``) vs N random cells; ``chooseloso``: how ``design``'s ridge and
  candidates were chosen without the targets (the ``loso`` tasks below, N = 10 and 20).
* ``int8`` (issue 19): the int8 local-CPU dataset from the fp32 one (same cells, another precision),
  N = 10, 20, 50, against from-scratch predictors on the same int8 cells.
* ``curve``: Spearman and Acc@10 against N = 5 … 100 on every NB201 device (the notebook
  ``notebooks/05_transfer.ipynb`` plots it).
* ``loso``: how ``transfer-ridge``'s evidence temper (and ``additive-each``) were chosen without the targets —
  every source of a target in turn is the target of the other three (``--quick-loso``: T = 2 only).
* ``helpexact``: HELP's own meta-test split (its ``loader.py``): the N cells are drawn from NB201 archs 0-899
  with the 10 % fastest and slowest of them on the target removed, and the query set is archs 900-1899 with the
  same trimming (800 cells) — the test set HELP's published Spearman figures were measured on. Sources keep all
  their cells (``--help-sources pool``: only HELP's trimmed meta-train pool of each source).
* ``blendloso``: how ``transfer-ridge``'s blend temper (its anchors against its mixture) was chosen without the
  targets — the ``loso`` tasks on both splits (all cells and HELP's), N = 10, blend tempers 1, 2, 4, 8 and off.
* ``n1000``: 1,000 target cells — LETI's single-device best per device against ``transfer-boost`` on the same
  family and against the raw source latencies as columns (Spearman, Acc@10, which columns were kept per seed).

Every part run is written (merged with the parts already there) to ``--json``
(``benchmarks/results/transfer.json``): ``{part: {target: {predictor: {N: {mean, std}}}}}`` plus how it
was run (seeds, load averages, seconds).

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_transfer.py [--seeds 0,1,2] [--parts help,nb101,int8,choose]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from leti.predict.data import load_dataset
from leti.predict.evaluate import PredictorResult
from leti.predict.transfer.data import TransferData, cell_keys, load_transfer, sources_from
from leti.predict.transfer.evaluate import evaluate_transfer
from leti.predict.transfer.ridge import BLEND_TEMPER

ROOT = Path(__file__).resolve().parents[1]
DS = ROOT / "datasets"
HELP = {"pixel2": 0.802, "raspi4": 0.890, "gold_6226": 0.989, "eyeriss": 0.940}
TRANSFER = ("transfer-ridge", "transfer-help")
SCRATCH = ("ransac", "catboost-rich")
#: LETI's single-device best on 1,000 NB201 cells per device (README: benchmarks/bench_predict_accuracy.py)
SINGLE_BEST = {"pixel2": "catboost-bag-cal", "raspi4": "xgboost-rich", "titan_rtx_1": "catboost-bag-cal",
               "gold_6226": "catboost-bag-cal", "eyeriss": "catboost-bag-cal"}


def summary(res, sizes, specs) -> dict:
    """``{target: {predictor: {N: {mean: {metric: v}, std: {...}}}}}`` of an ``evaluate_transfer`` result."""
    return {dev: {s: {str(n): {k: per[s][n].summary()[k] for k in ("mean", "std")} for n in sizes} for s in specs}
            for dev, per in res.items()}


def rows(res, sizes, specs, target=None, bar_for=None):
    """One line per device, size and predictor; the bar (HELP's N = 10 Spearman) beside ``bar_for`` (default: the
    first predictor)."""
    for dev, per in res.items():
        for n in sizes:
            best = max(SCRATCH, key=lambda s: per[s][n].summary()["mean"]["spearman"]) if all(s in per for s in SCRATCH) else None
            for s in specs:
                m = per[s][n].summary()
                tag = s + ("*" if s == best else "")
                bar = f"{target[dev]:.3f}" if target and dev in target and n == 10 and s == (bar_for or specs[0]) else ""
                print(f"{dev:16s} {n:4d} {tag:22s} {m['mean']['spearman']:.3f} ± {m['std']['spearman']:.3f}   "
                      f"{100 * m['mean']['acc@10%']:5.1f} ± {100 * m['std']['acc@10%']:4.1f}   {m['mean']['r2']:7.3f} "
                      f"{100 * m['mean']['rmspe']:6.1f}  {bar}", flush=True)


def header(title):
    print(f"\n## {title}\n{'target':16s} {'N':>4s} {'predictor':16s} {'Spearman':>13s}   {'Acc@10%':>11s}   {'R²':>7s} "
          f"{'RMSPE%':>6s}  HELP@10")


def save(path: Path, part: str, data: dict, seeds, t0: float, load0) -> None:
    """Merge one part's figures into the results JSON (the parts not run this time are kept)."""
    out = json.loads(path.read_text()) if path.is_file() else {}
    out[part] = {"results": data, "seeds": list(seeds), "seconds": round(time.perf_counter() - t0, 1),
                 "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
                 "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")


def loo(nb201, dev):
    """The HELP split: ``dev`` the target, the four other NB201 devices the sources."""
    return TransferData([nb201[dev]], sources_from([d for k, d in nb201.items() if k != dev]))


#: ``transfer-ridge`` with its anchors blended in (``blend=BLEND_TEMPER``: 8 since session 25, 4 before), reported beside
#: the default where it is measured
BLENDED = f"transfer-ridge blend={BLEND_TEMPER:g}"


def arch_indices(nb201) -> dict[str, np.ndarray]:
    """Per device: ``pos[i]`` = the row of NB201 arch index ``i`` in its table (-1 where it has none)."""
    import pandas as pd

    frame = pd.read_parquet(DS / "nb201_latency.parquet", columns=["arch", "arch_index"]).drop_duplicates("arch")
    of = dict(zip(frame.arch, frame.arch_index.astype(int)))
    out = {}
    for dev, d in nb201.items():
        ai = np.array([of.get(k, -1) for k in cell_keys(d.cells)])
        pos = np.full(max(int(ai.max()) + 1, 15625), -1)
        pos[ai[ai >= 0]] = np.flatnonzero(ai >= 0)
        out[dev] = pos
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--parts", default="help,nb101,int8,choose", help="help, full, n1000, nb101, int8, choose, chooseloso, curve, loso, helpexact, blendloso")
    ap.add_argument("--devices", default="pixel2,raspi4,titan_rtx_1,gold_6226,eyeriss")
    ap.add_argument("--quick", action="store_true",
                    help="HELP split at N = 10 only, transfer-ridge (and --predictors) only: minutes, to iterate")
    ap.add_argument("--predictors", default="transfer-ridge", help="with --quick: the predictors compared")
    ap.add_argument("--ridge-blend", type=float, default=0.0,
                    help="with --quick: transfer-ridge's blend temper (0: off, the default; 8: the anchors blended in)")
    ap.add_argument("--quick-loso", action="store_true",
                    help="with --parts loso: only the default against the previous round's variants (T = 2)")
    ap.add_argument("--sizes", default="5,10,20,50,100", help="with --parts curve: the train sizes")
    ap.add_argument("--help-sources", choices=("all", "pool"), default="all",
                    help="with --parts helpexact: the sources' cells (all, or HELP's trimmed meta-train pool)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "transfer.json")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    parts = args.parts.split(",")
    t0 = time.perf_counter()
    print(f"load average {os.getloadavg()}", flush=True)
    nb201 = {d.device: d for d in load_dataset(DS / "nb201_latency.parquet")}
    devices = args.devices.split(",")
    specs = (*TRANSFER, *SCRATCH, "flops")

    def part(name, fn):
        if name in parts:
            t, load0 = time.perf_counter(), os.getloadavg()
            save(args.json, name, fn(), seeds, t, load0)

    def quick():
        header(f"quick: NB201, leave one device out, N = 10, seeds {seeds}")
        qspecs, out = tuple(args.predictors.split(",")), {}
        for dev in devices:
            res = evaluate_transfer(loo(nb201, dev), qspecs, (10,), seeds,
                                    overrides={"transfer-ridge": {"blend": args.ridge_blend}})
            rows(res, (10,), qspecs, HELP)
            out.update(summary(res, (10,), qspecs))
        return out

    def help_split():
        header(f"NB201, leave one device out (HELP split), seeds {seeds}")
        out = {}
        for dev in devices:
            res = evaluate_transfer(loo(nb201, dev), specs, (10, 20), seeds)
            rows(res, (10, 20), specs, HELP)
            out.update(summary(res, (10, 20), specs))
        return out

    def full():
        # same-space accuracy with sources: 1,000 target cells plus the sources vs LETI's single-device best
        header(f"NB201, 1,000 target cells plus the sources, seeds {seeds} (LETI single-device best Acc@10: "
               f"pixel2 0.505, raspi4 0.652)")
        fspecs, out = tuple(args.predictors.split(",")), {}
        for dev in devices:
            res = evaluate_transfer(loo(nb201, dev), fspecs, (1000,), seeds)
            rows(res, (1000,), fspecs)
            out.update(summary(res, (1000,), fspecs))
        return out

    index = arch_indices(nb201)

    def trimmed(d, lo, hi):
        """HELP's trimming: the rows of archs lo..hi-1 the device measured, its 10 % fastest and slowest removed."""
        ix = index[d.device][lo:hi]
        ix = ix[ix >= 0]
        ix = ix[np.argsort(d.latency_ms[ix], kind="stable")]
        return ix[int(len(ix) * 0.1):int(len(ix) * 0.9)]

    def help_exact():
        # HELP's meta-test split (HayeonLee/HELP loader.py: num_meta_train_sample 900, num_query 1000,
        # remove_outlier): train cells from archs 0-899, query archs 900-1899, each trimmed to its middle 80 %
        from leti.predict.data import DeviceData
        from leti.predict.metrics import score_all
        from leti.predict.transfer.evaluate import fit_one

        print(f"\n## NB201, HELP's own split (train from archs 0-899, query archs 900-1899, both trimmed to the middle "
              f"80 %), sources: {args.help_sources} cells, seeds {seeds}")
        header("HELP's split")
        out = {}
        for dev in devices:
            d = nb201[dev]
            srcs = [s for k, s in nb201.items() if k != dev]
            if args.help_sources == "pool":
                srcs = [DeviceData(s.device, s.cells.take(ix), s.latency_ms[ix]) for s in srcs
                        for ix in [trimmed(s, 0, 900)]]
            sources = sources_from(srcs)
            pool, query = trimmed(d, 0, 900), trimmed(d, 900, 1900)
            hspecs = (specs[0], BLENDED, *specs[1:])
            res = {s: {n: PredictorResult(s) for n in (10, 20)} for s in hspecs}
            for n in (10, 20):
                for seed in seeds:
                    tr = np.random.default_rng(seed).permutation(pool)[:n]
                    for spec in hspecs:
                        model = (fit_one("transfer-ridge", d, sources, tr, seed, overrides={"blend": BLEND_TEMPER})[0]
                                 if spec == BLENDED else fit_one(spec, d, sources, tr, seed)[0])
                        res[spec][n].seeds.append({"seed": seed, "metrics": score_all(d.latency_ms[query],
                                                                                      model.predict(d.cells.take(query)))})
            rows({dev: res}, (10, 20), hspecs, HELP, bar_for=BLENDED)
            out.update(summary({dev: res}, (10, 20), hspecs))
        # the bar: LETI's figure on HELP's protocol (transfer-ridge with the blend, the option for HELP-style
        # samples) against HELP's published N = 10 Spearman, on the four devices HELP reports, all at once
        got = {dev: out[dev][BLENDED]["10"]["mean"]["spearman"] for dev in HELP if dev in out}
        print(f"\nheadline, HELP's protocol, N = 10 ({BLENDED} vs HELP): " + ", ".join(
            f"{dev} {v:.3f} vs {HELP[dev]:.3f} ({'pass' if v >= HELP[dev] else 'MISS'})" for dev, v in got.items())
            + f"; all four: {'yes' if len(got) == len(HELP) and all(v >= HELP[k] for k, v in got.items()) else 'no'}")
        return {"sources": args.help_sources, "query_cells": 800, **out}

    def n1000():
        # same-space accuracy with sources (issue 17): LETI's single-device best on 1,000 target cells against
        # transfer-boost on the same family (the sources' op-cost predictions as extra columns, kept or not by
        # out-of-sample error on the training cells) and against the raw source latencies as extra columns
        from leti.predict.base import make_predictor
        from leti.predict.evaluate import family_of
        from leti.predict.features import features
        from leti.predict.metrics import acc_at, spearman
        from leti.predict.transfer import make_transfer

        print(f"\n## NB201, 1,000 target cells: LETI's single-device best vs with the sources, seeds {seeds} (the issue's "
              f"bar: the README's single-device Acc@10, pixel2 50.5 %, raspi4 65.2 %, and the re-run below on the same "
              f"seeds)\n"
              f"{'target':12s} {'predictor':30s} {'Spearman':>17s}   {'Acc@10%':>11s}  kept by transfer-boost")
        out = {}
        for dev in devices:
            d, src = nb201[dev], loo(nb201, dev).sources
            spec = SINGLE_BEST[dev]
            family, params = family_of(spec)
            params = {"features": "rich", **params}
            rich = features(d.cells, "rich")
            raw = np.concatenate([rich, src.lookup(cell_keys(d.cells))], 1)
            y = d.latency_ms
            res = {f"{spec} (single device)": [], f"transfer-boost ({spec})": [], "raw source latencies as columns": []}
            kept = []
            for seed in seeds:
                order = np.random.default_rng(seed).permutation(len(y))
                tr, te = order[:1000], order[1000:]
                preds = {}
                for what, x in ((f"{spec} (single device)", rich), ("raw source latencies as columns", raw)):
                    m = make_predictor(family, **{**params, "random_state": seed}).fit_features(x[tr], y[tr])
                    preds[what] = m.predict_features(x[te])
                tb = make_transfer("transfer-boost", base=spec, random_state=seed).fit(d.cells.take(tr), y[tr], src)
                preds[f"transfer-boost ({spec})"] = tb.predict(d.cells.take(te))
                kept.append(tb.chosen_)
                for what, p in preds.items():
                    res[what].append({"acc@10%": acc_at(y[te], p), "spearman": spearman(y[te], p)})
            out[dev] = {"kept": kept}
            for what, r in res.items():
                mean = {k: float(np.mean([v[k] for v in r])) for k in r[0]}
                std = {k: float(np.std([v[k] for v in r])) for k in r[0]}
                out[dev][what] = {"mean": mean, "std": std, "seeds": r}
                print(f"{dev:12s} {what:30s} {mean['spearman']:.4f} ± {std['spearman']:.4f}   "
                      f"{100 * mean['acc@10%']:5.1f} ± {100 * std['acc@10%']:4.1f}  "
                      f"{', '.join(kept) if what.startswith('transfer') else ''}", flush=True)
        return out

    def nb101():
        header(f"NB101, LETI's own devices, seeds {seeds}")
        out = {}
        for target, srcs in (("nb101_engine_cpu", "nb101_local_cpu"),
                             ("cuda_h200_engine_nb101", "nb101_local_cpu,nb101_engine_cpu")):
            data = load_transfer(DS / f"{target}.parquet", ",".join(str(DS / f"{s}.parquet") for s in srcs.split(",")))
            print(f"# {data.targets[0].device} ({len(data.targets[0].latency_ms)} cells) <- {', '.join(data.sources.devices)}")
            res = evaluate_transfer(data, specs, (10, 20, 50), seeds)
            rows(res, (10, 20, 50), specs)
            out[target] = summary(res, (10, 20, 50), specs)
        return out

    def int8():
        data = load_transfer(DS / "nb101_local_cpu_int8.parquet", DS / "nb101_local_cpu.parquet")
        t = data.targets[0]
        header(f"NB101 int8 on the local CPU ({len(t.latency_ms)} cells) <- {', '.join(data.sources.devices)} "
               f"({data.sources.shared(cell_keys(t.cells))} shared cells), seeds {seeds}")
        res = evaluate_transfer(data, specs, (10, 20, 50), seeds)
        rows(res, (10, 20, 50), specs)
        return summary(res, (10, 20, 50), specs)

    def chosen():
        methods = ("stratified", "design")
        print(f"\n## transfer-ridge on chosen vs random cells, seeds {seeds} (Spearman, Acc@10 %)")
        print(f"{'target':16s} {'N':>4s} {'random':>14s} " + " ".join(f"{m:>14s}" for m in methods))
        out = {}
        for dev in devices:
            data = loo(nb201, dev)
            res = {"random": evaluate_transfer(data, ("transfer-ridge",), (10, 20), seeds)[dev]["transfer-ridge"]}
            for m in methods:
                res[m] = evaluate_transfer(data, ("transfer-ridge",), (10, 20), seeds, chosen=m)[dev]["transfer-ridge"]
            out[dev] = {k: {} for k in res}
            for n in (10, 20):
                cells = []
                for k, r in res.items():
                    a = r[n].summary()["mean"]
                    out[dev][k][str(n)] = a
                    cells.append(f"{a['spearman']:.3f}, {100 * a['acc@10%']:5.1f}")
                print(f"{dev:16s} {n:4d} " + " ".join(f"{c:>14s}" for c in cells), flush=True)
        return out

    def curve():
        sizes = tuple(int(n) for n in args.sizes.split(","))
        header(f"NB201, leave one device out, N = {sizes}, seeds {seeds}")
        out = {}
        for dev in devices:
            res = evaluate_transfer(loo(nb201, dev), specs, sizes, seeds)
            rows(res, sizes, specs, HELP)
            out.update(summary(res, sizes, specs))
        return out

    def loso_tasks():
        """(pseudo-target, held-out target, data) for every source of every target: the target never seen."""
        for pseudo in devices:
            for out in devices:
                if out != pseudo:
                    yield pseudo, out, TransferData([nb201[pseudo]], sources_from(
                        [d for k, d in nb201.items() if k not in (pseudo, out)]))

    def loso():
        # the choice of transfer-ridge's temper, made on sources only: each source of a target in turn is the
        # pseudo-target of the other three; a target's row averages the tasks that leave it out entirely
        from leti.predict.transfer.ridge import PREVIOUS

        configs = {"additive only": {"variants": "additive"},
                   **{f"prev, T = {t:g}": {"variants": PREVIOUS, "temper": t} for t in (1, 2, 4)},
                   **{f"all, T = {t:g}": {"temper": t} for t in (1, 2, 4)}}
        if args.quick_loso:
            configs = {k: v for k, v in configs.items() if k in ("prev, T = 2", "all, T = 2")}
        score = {}
        for pseudo, out, data in loso_tasks():
            for name, params in configs.items():
                r = evaluate_transfer(data, ("transfer-ridge",), (10,), seeds, overrides={"transfer-ridge": params})
                score[(pseudo, out, name)] = r[pseudo]["transfer-ridge"][10].summary()["mean"]["spearman"]
        print(f"\n## leave-one-source-out choice of the evidence temper, N = 10, seeds {seeds}")
        print(f"{'held-out target':16s} " + " ".join(f"{c:>14s}" for c in configs))
        out_rows = {}
        for t in devices:
            out_rows[t] = {c: float(np.mean([score[(p, t, c)] for p in devices if p != t])) for c in configs}
            print(f"{t:16s} " + " ".join(f"{out_rows[t][c]:14.4f}" for c in configs), flush=True)
        out_rows["all tasks"] = {c: float(np.mean([v for k, v in score.items() if k[2] == c])) for c in configs}
        print(f"{'all tasks':16s} " + " ".join(f"{out_rows['all tasks'][c]:14.4f}" for c in configs))
        return out_rows

    def blend_loso():
        # the choice of transfer-ridge's blend temper, made on sources only: the loso tasks on both splits; the
        # cross-validated errors do not depend on the temper, so each fit is scored under every temper ("off" is
        # the blend's mixture: refitted without the samples it left out, so not the default's when it left some)
        from leti.predict.metrics import score_all
        from leti.predict.transfer import make_transfer

        from leti.predict.transfer.ridge import blend_weights

        tempers = ((0.0, 0.5), (1.0, 1 / 7), (2.0, 1 / 7), (2.0, 0.5), (2.0, 0.8), (4.0, 0.5), (4.0, 0.7), (4.0, 0.8),
                   (8.0, 0.5), (8.0, 0.7), (8.0, 0.8), (16.0, 0.7), (16.0, 0.8))  # session 25 added T = 8, 16 and p = 0.7
        score = {}
        for pseudo, out, data in loso_tasks():
            d = data.targets[0]
            pool, query = trimmed(d, 0, 900), trimmed(d, 900, 1900)
            for split in ("all", "help"):
                for seed in seeds:
                    if split == "help":
                        tr, te = np.random.default_rng(seed).permutation(pool)[:10], query
                    else:
                        order = np.random.default_rng(seed).permutation(len(d.latency_ms))
                        tr, te = order[:10], order[10:]
                    m = make_transfer("transfer-ridge", blend=BLEND_TEMPER).fit(d.cells.take(tr), d.latency_ms[tr],
                                                                       data.sources)
                    mse, n = m.blend_var_, int((~m.dropped_).sum())  # the samples the blend kept
                    for t in tempers:
                        m.blend_weights_ = np.eye(len(mse))[0] if t[0] == 0 else blend_weights(mse, n, *t)
                        sp = score_all(d.latency_ms[te], m.predict(d.cells.take(te)))["spearman"]
                        score.setdefault((pseudo, out, split, t), []).append(sp)
        name = lambda t: "off" if t[0] == 0 else f"T{t[0]:g} p{t[1]:.2f}"  # noqa: E731
        print(f"\n## leave-one-source-out choice of the blend temper T and the mixture's prior share p, N = 10, "
              f"seeds {seeds}")
        out_rows = {}
        for split in ("all", "help"):
            print(f"{split + ' split':16s} " + " ".join(f"{name(t):>11s}" for t in tempers))
            for t in devices:
                row = {f"{split}, {name(x)}": float(np.mean([np.mean(score[(p, t, split, x)]) for p in devices if p != t]))
                       for x in tempers}
                out_rows.setdefault(t, {}).update(row)
                print(f"{t:16s} " + " ".join(f"{row[f'{split}, {name(x)}']:11.4f}" for x in tempers), flush=True)
            row = {f"{split}, {name(x)}": float(np.mean([np.mean(v) for k, v in score.items() if k[2] == split and k[3] == x]))
                   for x in tempers}
            out_rows.setdefault("all tasks", {}).update(row)
            print(f"{'all tasks':16s} " + " ".join(f"{row[f'{split}, {name(x)}']:11.4f}" for x in tempers))
        return out_rows

    def choose_loso():
        # the choice among cell-choice variants, made on sources only (as loso does for the temper): each source
        # of a target in turn is the pseudo-target of the other three
        from leti.predict.transfer import choose as ch

        variants = {"random": None, "stratified": ("stratified", None, None),
                    **{f"design {r:g}/{c}": ("design", r, c) for r in (0.01, 1.0, 10.0) for c in (8, 24)}}
        score, saved = {}, (ch.DESIGN_RIDGE, ch.DESIGN_CANDIDATES)
        try:
            for pseudo, out, data in loso_tasks():
                for name, v in variants.items():
                    if v is not None and v[0] == "design":
                        ch.DESIGN_RIDGE, ch.DESIGN_CANDIDATES = v[1], v[2]
                    r = evaluate_transfer(data, ("transfer-ridge",), (10, 20), seeds,
                                          chosen=False if v is None else v[0])[pseudo]["transfer-ridge"]
                    for n in (10, 20):
                        score[(pseudo, out, name, n)] = r[n].summary()["mean"]
        finally:  # the module's settings as they were, whatever happened
            ch.DESIGN_RIDGE, ch.DESIGN_CANDIDATES = saved
        print(f"\n## leave-one-source-out choice of the cell choice, seeds {seeds} (mean over the 20 tasks: Spearman, Acc@10 %)")
        out_rows = {}
        for n in (10, 20):
            for name in variants:
                vals = [v for k, v in score.items() if k[2] == name and k[3] == n]
                rho, acc = float(np.mean([v["spearman"] for v in vals])), float(np.mean([v["acc@10%"] for v in vals]))
                wins = sum(score[k]["spearman"] > score[(k[0], k[1], "random", n)]["spearman"] for k in score
                           if k[2] == name and k[3] == n)
                out_rows[f"{name}, N = {n}"] = {"spearman": rho, "acc@10%": acc, "spearman_wins_over_random": wins}
                print(f"N = {n:3d} {name:16s} {rho:.4f} {100 * acc:5.1f}  ahead of random on {wins} of 20 tasks", flush=True)
        return out_rows

    if args.quick:
        parts = ["quick"]
    for name, fn in (("quick", quick), ("help", help_split), ("full", full), ("n1000", n1000), ("nb101", nb101), ("int8", int8),
                     ("choose", chosen), ("chooseloso", choose_loso), ("curve", curve), ("loso", loso), ("helpexact", help_exact),
                     ("blendloso", blend_loso)):
        part(name, fn)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
