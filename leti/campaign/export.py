"""What a campaign's rows say, and the dataset made of them: pass agreement, summary, Parquet export, datasheet.

Cells whose pass values disagree by more than ``max_pass_spread`` (spread = (max − min) / mean of the
pass values: the mean, or the ratio to the reference in a paired campaign) are flagged and left out
of the export; the pass-to-pass correlation is reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from leti.campaign.export_ops import OpKernels, campaign_ops, datasheet_lines, export_ops
from leti.campaign.store import CampaignStore, path_error
from leti.errors import DatasetError


def value_column(df) -> str:
    """What passes are compared on: the ratio to the reference in a paired campaign, else the mean."""
    ok = df[df["status"] == "ok"]
    return "ratio" if "ratio" in ok.columns and len(ok) and ok["ratio"].notna().all() else "mean_ms"


def pass_spread(df):
    """Per hash: (max - min) / mean of the pass values, over its successful passes (NaN with one pass)."""
    ok = df[df["status"] == "ok"]
    if ok["device_id"].nunique() > 1:  # a farm campaign: passes agree per device; a cell's worst device counts
        g = ok.groupby(["hash", "device_id"])[value_column(df)]
        return ((g.max() - g.min()) / g.mean()).where(g.count() >= 2).groupby(level="hash").max()
    g = ok.groupby("hash")[value_column(df)]
    spread = (g.max() - g.min()) / g.mean()
    return spread.where(g.count() >= 2)


def pass_correlation(df) -> dict:
    """Pearson and Spearman correlation of the latency (or the ratio) between every pair of passes."""
    ok = df[df["status"] == "ok"]
    wide = ok.pivot_table(index="hash", columns="pass", values=value_column(df))
    out = {}
    cols = sorted(wide.columns)
    for a_i, a in enumerate(cols):
        for b in cols[a_i + 1:]:
            pair = wide[[a, b]].dropna()
            if len(pair) >= 3:
                out[f"{a}-{b}"] = {"n": int(len(pair)), "pearson": float(pair[a].corr(pair[b])),
                                   "spearman": float(pair[a].corr(pair[b], method="spearman"))}
    return out


def summarize(store: CampaignStore, max_pass_spread: float = 0.10) -> dict:
    df = store.measurements()
    spread = pass_spread(df) if len(df) else None
    flagged = sorted(spread[spread > max_pass_spread].index) if spread is not None else []
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    ok = df[df["status"] == "ok"] if len(df) else df
    paired = len(df) > 0 and value_column(df) == "ratio"
    return {"cells": len(store.cells()) or len(store.models()), "rows": int(len(df)), "status": {k: int(v) for k, v in counts.items()},
            "reference_ms": float(ok["ref_ms"].median()) if paired else None,
            "unstable": int(((df["status"] == "ok") & (df["stable"] == 0)).sum()) if len(df) else 0,
            "flagged": flagged, "max_pass_spread": max_pass_spread,
            "pass_correlation": pass_correlation(df) if len(df) else {}}


EXPORT_COLUMNS = ("hash", "matrix", "ops", "flops", "params", "peak_memory_bytes", "device_id", "backend",
                  "runtime", "mean_ms", "median_ms", "std_ms", "min_ms", "max_ms", "runs", "pass", "stable",
                  "attempts", "delegation", "mem_init_mb", "mem_overall_mb", "mem_peak_mb", "temperature_c",
                  "cooldown_s", "started_at", "finished_at", "tool_versions", "ref_ms", "ratio", "corrected_ms",
                  "model",

                  # added with quantized models: the models' precision and the delegate coverage of every row
                  "precision", "delegate", "delegated_nodes", "total_nodes", "cpu_nodes", "fully_delegated")
#: Rows of one export must be unique on these (several campaigns may be exported into one file).
ROW_KEY = ["hash", "pass", "device_id", "backend", "runtime"]


def _campaign_frame(db: str | os.PathLike, max_pass_spread: float):
    """One campaign's exportable rows, its sidecar (device info, protocol, summary) and its op rows (or None)."""
    import pandas as pd

    with CampaignStore.open_existing(db) as store:
        meta = store.meta()
        summary = summarize(store, max_pass_spread)
        m = store.measurements()
        cells = pd.read_sql_query("SELECT hash, matrix, ops, flops, params, peak_memory_bytes FROM cells", store.db)
        models = store.models()
        ok = m[(m["status"] == "ok") & ~m["hash"].isin(summary["flagged"])]
        ops, op_counts = campaign_ops(store, meta, ok, {h: e.name for h, e in models.items()})
    df = ok.merge(cells, on="hash", how="left")
    df["matrix"] = [None if x is None or x != x else json.loads(x) for x in df["matrix"]]
    df["ops"] = [None if x is None or x != x else json.loads(x) for x in df["ops"]]
    # model-file campaigns (``leti measure --models``): the file name; cell campaigns leave it empty
    df["model"] = [models[h].name if h in models else None for h in df["hash"]]
    df["stable"] = df["stable"].astype(bool)
    # paired campaigns: the ratio back in milliseconds through one campaign-wide reference latency
    df["corrected_ms"] = df["ratio"] * summary["reference_ms"] if summary["reference_ms"] else float("nan")
    # the campaign's device, as it was bound (an adb phone by its own serial, whatever transport each row used)
    df["device_id"] = meta.get("device_id") or df["device_id"]
    # devices that name no runtime (local, adb) run .tflite files through TFLite
    df["runtime"] = meta.get("device_info", {}).get("runtime", "tflite")
    df["tool_versions"] = json.dumps(meta.get("tool_versions", {}), sort_keys=True)
    df["precision"] = (meta.get("model_spec") or {}).get("precision", "fp32")
    df["delegated_nodes"] = df["delegated_nodes"].astype("Int64")
    df["total_nodes"] = df["total_nodes"].astype("Int64")
    df["cpu_nodes"] = df["total_nodes"] - df["delegated_nodes"]
    df["fully_delegated"] = (df["cpu_nodes"] == 0).astype("boolean")  # <NA> where the device did not say
    summary["partly_delegated_rows"] = int((df["fully_delegated"] == False).sum())  # noqa: E712 (NA-aware)
    summary["exported_rows"] = int(len(df))
    if op_counts:
        summary["op_profiles"] = op_counts
    sidecar = {"device": meta.get("device_info", {}), "protocol": meta.get("protocol", {}),
               "reference": meta.get("reference"),
               # a model-file campaign's reference is one of its files: its name says more than its hash
               **({"reference_model": models[meta["reference"]].name} if meta.get("reference") in models else {}),
               "passes": meta.get("passes"), "model_spec": meta.get("model_spec", {}),
               "tool_versions": meta.get("tool_versions", {}), "summary": summary, "source_db": str(db)}
    return df, sidecar, ops


def export_dataset(db: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike,
                   max_pass_spread: float = 0.10, op_kernels: OpKernels | None = None) -> dict:
    """Write the Parquet dataset (successful rows of cells whose passes agree) and its device info.

    ``db`` is one campaign database or several (e.g. one GPU through two runtimes, or a campaign run
    in parts): their rows are concatenated, and must not repeat a (hash, pass, device, backend,
    runtime). Beside ``out``: ``<stem>.device.json`` (device info, protocol, tool versions, summary;
    with several campaigns a ``campaigns`` list of those) and ``<stem>.README.md`` (datasheet).
    Campaigns measured with op profiling also give ``<stem>.ops.parquet`` (:mod:`leti.campaign.export_ops`;
    ``op_kernels`` lines its rows up with the models' kernels, as ``leti export`` does). Returns the summary
    (summed over the campaigns).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    dbs = [db] if isinstance(db, (str, os.PathLike)) else list(db)
    if not dbs:
        raise DatasetError("no campaign database to export")
    parts = [_campaign_frame(d, max_pass_spread) for d in dbs]
    op_frames = [o for _, _, o in parts]
    parts = [(f, s) for f, s, _ in parts]
    df = pd.concat([f for f, _ in parts], ignore_index=True)
    dup = df.duplicated(ROW_KEY)
    if dup.any():
        r = df[dup].iloc[0]
        raise DatasetError(f"the campaigns overlap: cell {r['hash'][:12]} pass {r['pass']} on {r['device_id']} "
                           f"({r['runtime']}) is in more than one of {', '.join(map(str, dbs))}")
    df = df.sort_values(["runtime", "device_id", "hash", "pass"]).reset_index(drop=True)[list(EXPORT_COLUMNS)]
    if len(parts) == 1:
        sidecar = parts[0][1]
        summary = sidecar["summary"]
    else:
        sides = [s for _, s in parts]
        summary = {"campaigns": len(sides), "exported_rows": int(len(df)),
                   "cells": int(df["hash"].nunique()) if len(df) else 0,
                   "flagged": sorted({h for s in sides for h in s["summary"]["flagged"]}),
                   "max_pass_spread": max_pass_spread,
                   "unstable": sum(s["summary"]["unstable"] for s in sides)}
        sidecar = {"campaigns": sides, "summary": summary}
    op_notes = export_ops(op_frames, out, op_kernels)
    if op_notes is not None:
        summary["op_table"] = op_notes
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           b"leti": json.dumps(sidecar, sort_keys=True).encode()})
    if len(parts) == 1:
        sheets = [_datasheet(out.name, parts[0][1], parts[0][0])]
    else:  # one section per campaign
        sheets = [f"# {out.name}: {len(df)} rows from {len(parts)} campaigns\n",
                  *datasheet_lines(op_notes, {k: sum(s["summary"].get("op_profiles", {}).get(k, 0) for _, s in parts)
                                              for k in ("profiled_runs", "runs_without_ops")} if op_notes else {})] + [
            "#" + _datasheet(f"campaign {i} ({s['device'].get('id', '?')}, {s['device'].get('runtime', 'tflite')})",
                             s, f) for i, (f, s) in enumerate(parts, 1)]
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp)
        os.replace(tmp, out)
        out.with_name(out.stem + ".device.json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
        out.with_name(out.stem + ".README.md").write_text("\n".join(sheets))
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise path_error(out, exc, "the dataset") from None
    return summary


def _coverage_lines(side: dict, df, item: str = "cell") -> list[str]:
    """The datasheet's paragraph on precision and delegate coverage (partial delegation explains outliers)."""
    precision = (side.get("model_spec") or {}).get("precision", "fp32")
    known = df["fully_delegated"].notna() if "fully_delegated" in df else None
    if known is None or not known.any():
        cov = "Delegate coverage: not reported by this device."
    else:
        part = df[df["fully_delegated"] == False]  # noqa: E712
        delegates = ", ".join(sorted({str(d) for d in df["delegate"].dropna() if d})) or "none"
        cov = (f"Delegate coverage ({delegates}): {int(known.sum()) - len(part)} rows fully delegated, "
               f"**{len(part)} rows partly delegated** (`fully_delegated = false`; `cpu_nodes` of "
               f"`total_nodes` ran on the CPU's own kernels"
               + (f", {part['hash'].nunique()} {item}s, up to {int(part['cpu_nodes'].max())} nodes" if len(part) else "")
               + "). Partly delegated rows are timed as such, never as fully delegated.")
    return [f"Precision of the models: {precision}" + (" (see `leti generate --format tflite-int8`)."
                                                        if precision != "fp32" else "."), cov, ""]


def _datasheet(name: str, side: dict, df) -> str:
    s = side["summary"]
    dev = side["device"]
    corr = "; ".join(f"passes {k}: Pearson {v['pearson']:.4f}, Spearman {v['spearman']:.4f} (n={v['n']})"
                     for k, v in s["pass_correlation"].items()) or "n/a (fewer than two passes or three cells)"
    item = "model" if (side.get("model_spec") or {}).get("kind") == "model-files" else "cell"
    ref = (f"model {side['reference_model']} ({side.get('reference')})" if side.get("reference_model")
           else f"cell {side.get('reference')}")
    lines = [
        f"# {name}: latency measured by `leti measure`", "",
        f"**Device:** {dev.get('id', '?')} ({dev.get('model', '?')}), backend {dev.get('backend', '?')}, "
        f"runtime {dev.get('runtime', 'tflite')}.  ",
        f"**Protocol:** {json.dumps(side['protocol'], sort_keys=True)}, {side['passes']} passes in shuffled order.  ",
        f"**Model spec:** {json.dumps(side['model_spec'], sort_keys=True)}.  ",
        f"**Tools:** {json.dumps(side['tool_versions'], sort_keys=True)}.  ",
        "**Units:** milliseconds (latency), MB (memory footprint as the runtime reports it), bytes (peak_memory_bytes, analytic).", "",
        f"Rows: {len(df)} (one per {item} and pass). {item.capitalize()}s: {s['cells']}. "
        f"Status of all stored rows: {s['status']}.",
        f"Left out: {len(s['flagged'])} {item}s whose pass means differ by more than {s['max_pass_spread']:.0%} "
        "of their mean, and every row whose measurement failed.",
        f"Unstable rows (std above the protocol limit after the allowed reruns) are kept with `stable = false`: {s['unstable']}.",
        f"Pass-to-pass correlation of the mean: {corr}.", "",
    ] + _coverage_lines(side, df, item) + datasheet_lines(s.get("op_table"), s.get("op_profiles", {})) + ([
        f"Paired measurement: every experiment alternated ~10 ms blocks of the {item} and of the reference "
        f"{ref}; `ratio` is the median of the {item}'s runs, each divided by the reference runs around it, "
        f"`corrected_ms` = ratio × {s['reference_ms']:.4f} ms (the median of the reference's per-experiment "
        f"means, `ref_ms`). Passes are compared on the ratio; `mean_ms` etc. are the {item}'s own raw runs. "
        "Predictors read `corrected_ms`.",
        "",
    ] if s.get("reference_ms") else []) + [
        "Full device information: the `.device.json` file beside this one (also in the Parquet metadata key `leti`).", "",
    ]
    if dev.get("kind") == "farm":  # `leti measure --cluster`: one campaign, several devices on several nodes
        lines[2] = "**Devices (farm):** " + "; ".join(
            f"{k} on node {v.get('node', '?')} ({v.get('model', '?')}, serial {v.get('serialno') or '?'}, backend "
            f"{v.get('backend', '?')})" for k, v in sorted(dev["devices"].items())) + ".  "
    return "\n".join(lines)
