"""``leti evaluate``, ``leti fit`` and ``leti predict``: latency predictors from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from leti.cli.progress import progress
from leti.errors import LetiError


def _parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``NAME.PARAM=VALUE`` items as {NAME: {PARAM: value}}; values are read as JSON, else as text."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        name, dot, param = key.partition(".")
        if not (eq and dot and name and param):
            raise LetiError(f"--set expects NAME.PARAM=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[param] = value
    return out


def _params(items: list[str]) -> dict[str, Any]:
    return {k: v for d in _parse_sets([f"p.{i}" for i in items]).values() for k, v in d.items()}


def evaluate_cmd(
    dataset: Path = typer.Option(..., "--dataset", help="Parquet with matrix+ops or arch, latency_ms[, device]."),
    out: Path = typer.Option(..., "--out", help="Output folder: table.md, results.json, scatter_<device>.png."),
    device: str | None = typer.Option(None, "--device", help="Only this device (default: every device)."),
    train_size: str = typer.Option("1000", "--train-size", help="Training cells per seed; all others are the test set "
                                   "(a comma list with --transfer-from)."),
    predictors: str = typer.Option("all", "--predictors", help="Comma list of predictor names, or 'all' (no LUT)."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Comma list of seeds (one train/test split each)."),
    folds: int = typer.Option(5, "--folds", help="Cross-validation folds for model selection (1 = no selection)."),
    sets: list[str] = typer.Option([], "--set", help="Fix a parameter: NAME.PARAM=VALUE, e.g. gcn.epochs=30."),
    transfer_from: str | None = typer.Option(None, "--transfer-from", help="Source devices' Parquet(s), comma-"
                                             "separated: few-shot transfer to each --dataset device."),
    choose: bool = typer.Option(False, "--choose", help="With --transfer-from: train on chosen cells, not random."),
) -> None:
    """Evaluate predictors with the paper's protocol and print a table like its Table 3.

    Example: leti evaluate --dataset datasets/nb201_latency.parquet --device pixel2 --predictors flops,ransac,xgboost --out runs/pixel2
    """
    from rich.console import Console
    from rich.table import Table

    from leti.predict.data import load_dataset
    from leti.predict.evaluate import (
        evaluate,
        expand,
        markdown_table,
        write_json,
        write_scatter,
    )

    if transfer_from is not None:
        from leti.cli.transfer import evaluate_transfer_cmd

        return evaluate_transfer_cmd(dataset, transfer_from, out, device, train_size, predictors, seeds, folds,
                                     _parse_sets(sets), choose)
    train_size = _one_size(train_size)
    specs = expand(predictors)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise LetiError(f"--seeds must be a comma list of integers, got {seeds!r}") from None
    if any(s < 0 for s in seed_list):
        raise LetiError(f"--seeds must be zero or positive whole numbers, got {seeds!r}")
    if folds < 1:
        raise LetiError(f"--folds must be at least 1 (1 = no model selection), got {folds}")
    overrides = _parse_sets(sets)
    data = load_dataset(dataset, device)
    from leti.cli import output_folder

    output_folder(out)
    per_device = {}
    with progress() as bar:
        for d in data:
            task = bar.add_task(f"{d.device}", total=len(specs) * len(seed_list))
            res = evaluate(d.cells, d.latency_ms, specs, train_size, seed_list, folds, overrides,
                           progress=lambda spec, task=task: bar.advance(task))
            per_device[d.device] = res
            write_scatter(res, out / f"scatter_{d.device}.png", f"{dataset.name} — {d.device}, train {train_size}")
    report = {"dataset": str(dataset), "train_size": train_size, "seeds": seed_list, "folds": folds,
              "overrides": overrides, "devices": {dev: {s: r.to_json() for s, r in res.items()}
                                                  for dev, res in per_device.items()}}
    write_json(report, out / "results.json")
    (out / "table.md").write_text(markdown_table(per_device) + "\n")
    table = Table(title=f"Acc@10% (%) and R², mean ± std over seeds {seed_list}, train {train_size}")
    table.add_column("predictor")
    for dev in per_device:
        table.add_column(f"{dev}\nAcc@10%", justify="right")
        table.add_column(f"{dev}\nR²", justify="right")
    for s in specs:
        row = [s]
        for dev in per_device:
            sm = per_device[dev][s].summary()
            row += [f"{100 * sm['mean']['acc@10%']:.1f}±{100 * sm['std']['acc@10%']:.1f}",
                    f"{sm['mean']['r2']:.3f}±{sm['std']['r2']:.3f}"]
        table.add_row(*row)
    Console(width=200).print(table)
    typer.echo(f"wrote {out / 'table.md'}, {out / 'results.json'} and {len(per_device)} scatter plots")


def fit_cmd(
    dataset: Path | None = typer.Option(None, "--dataset",
                                        help="Parquet with matrix+ops or arch, latency_ms[, device]."),
    predictor: str | None = typer.Option(None, "--predictor", help="Predictor name, e.g. catboost-rich, "
                                         "ransac_cluster, gcn (required; with --transfer-from default transfer-ridge)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the predictor to."),
    device: str | None = typer.Option(None, "--device", help="Device rows to fit on (needed when there are several)."),
    train_size: int | None = typer.Option(None, "--train-size", help="Fit on this many random rows (default all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of --train-size."),
    param: list[str] = typer.Option([], "--param", help="Predictor parameter PARAM=VALUE (repeatable)."),
    transfer_from: str | None = typer.Option(None, "--transfer-from", help="Source devices' Parquet(s), comma-"
                                             "separated: fit a transfer predictor on --train-size target cells."),
    choose: bool = typer.Option(False, "--choose", help="With --transfer-from: fit on the cells `leti choose` picks."),
    kernels: Path | None = typer.Option(None, "--kernels", help="Per-kernel table (LETI's kernel schema or QED's "
                                        "per-op one): fit a kernel-level predictor instead of a cell predictor."),
    e2e: Path | None = typer.Option(None, "--e2e", help="With --kernels: end-to-end latencies per model "
                                    "(model, device, latency_ms, or QED's e2e table) to learn the per-model overhead."),
    transfer_from_predictor: Path | None = typer.Option(
        None, "--transfer-from-predictor", help="With --kernels: a kernel-level predictor of another device "
        "(leti fit --kernels) to adapt to the --kernels device from its few models' kernels."),
) -> None:
    """Fit a predictor on a dataset and save it (no pickle: a folder with a JSON manifest).

    Example: leti fit --dataset datasets/nb201_latency.parquet --device raspi4 --predictor catboost-rich --out models/raspi4

    Kernel level: leti fit --kernels datasets/qed_tflite_cnn_ops_gpu.parquet --device pixel4
    --e2e datasets/qed_tflite_cnn_e2e.parquet --out models/pixel4-gpu

    Kernel-level transfer: leti fit --kernels few_models_ops.parquet --device iphonexs
    --transfer-from-predictor models/pixel4-gpu [--e2e e2e.parquet] --out models/iphonexs-gpu
    """
    import numpy as np

    from leti.cli import output_folder

    if transfer_from_predictor is not None:
        if kernels is None:
            raise LetiError("--transfer-from-predictor needs --kernels (the new device's measured kernels)")
        if param:
            raise LetiError("--param does not apply with --transfer-from-predictor: the kernel regressors are the "
                            "source predictor's, only their correction is fitted")
        _adapt_kernels(kernels, out, transfer_from_predictor, device, e2e)
        return
    if kernels is not None:
        _fit_kernels(kernels, out, device, e2e, _params(param))
        return
    if dataset is None:
        raise LetiError("leti fit needs --dataset and --predictor (a cell predictor), --dataset and --transfer-from "
                        "(a transfer predictor) or --kernels (a kernel-level one)")
    from leti.predict.base import make_predictor
    from leti.predict.data import file_spec, load_dataset

    if seed < 0:
        raise LetiError(f"--seed must be zero or a positive whole number, got {seed}")
    if transfer_from is not None:
        from leti.cli.transfer import fit_transfer

        return fit_transfer(dataset, transfer_from, out, device, train_size, seed, choose, predictor, _params(param))
    if predictor is None:
        raise LetiError("--predictor is required (or --transfer-from SOURCES.parquet for a transfer predictor)")
    data = load_dataset(dataset, device)
    output_folder(out)
    if len(data) > 1:
        raise LetiError(f"{dataset} has several devices ({', '.join(d.device for d in data)}); choose one with --device")
    d = data[0]
    cells, y = d.cells, d.latency_ms
    if train_size is not None:
        if not 1 <= train_size <= len(y):
            raise LetiError(f"--train-size must be in 1..{len(y)}")
        idx = np.random.default_rng(seed).permutation(len(y))[:train_size]
        cells, y = cells.take(idx), y[idx]
    model = make_predictor(predictor, **_params(param))
    model.model_spec_ = file_spec(dataset)
    with progress() as bar:
        task = bar.add_task(f"fit {predictor} on {len(y)} cells ({d.device})", total=1)
        model.fit(cells, y)
        bar.advance(task)
    model.save(out)
    typer.echo(f"wrote {predictor} predictor to {out}")


def predict_cmd(
    predictor: Path = typer.Option(..., "--predictor", help="Folder of a saved predictor (leti fit --out)."),
    cells: Path | None = typer.Option(None, "--cells",
                                      help="Parquet/CSV with matrix+ops (NB101) or arch (NB201) columns."),
    out: Path | None = typer.Option(None, "--out", help="Write the table with a predicted_ms column (Parquet/CSV); "
                                                           "default: print CSV to stdout."),
    kernels: Path | None = typer.Option(None, "--kernels", help="Per-kernel table to predict with a kernel-level "
                                        "predictor (leti fit --kernels)."),
    allow_unknown: bool = typer.Option(False, "--allow-unknown", help="With --kernels/--model: predict kernel types "
                                       "the predictor lacks with the nearest type it has (stated)."),
    model_file: Path | None = typer.Option(None, "--model", help="A model file (.tflite, .onnx, .keras, .leti) to "
                                           "predict with a kernel-level predictor: prints its latency in ms."),
    as_json: bool = typer.Option(False, "--json", help="With --model: one JSON line with the latency, its 90% "
                                 "interval and the per-kernel breakdown."),
    device: str | None = typer.Option(None, "--device", help="With --model: the device the predictor must describe "
                                      "(refused when it describes another)."),
) -> None:
    """Predict the latency (ms) of every cell of a table, of a kernel table, or of one model file.

    Example: leti predict --predictor models/raspi4 --cells datasets/nb201_latency.parquet --out predicted.parquet

    Kernel level: leti predict --kernels ops.parquet --predictor models/pixel4-gpu --out predicted.parquet

    Any model: leti predict --model mobilenet.tflite --predictor kp/ [--json]
    """
    if model_file is not None:
        _predict_model(model_file, predictor, allow_unknown, as_json, device)
        return
    if kernels is not None:
        _predict_kernels(kernels, predictor, out, allow_unknown)
        return
    if cells is None:
        raise LetiError("leti predict needs --cells (a cell table) or --kernels (a kernel table)")
    from leti.predict.base import load_predictor
    from leti.predict.data import check_model, read_frame

    model = load_predictor(predictor)
    frame = read_frame(cells)
    warning = check_model(model, predictor, cells)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    if out is not None:
        from leti.cli import output_folder

        output_folder(out.parent, shown=out)
    if out is None:  # the CSV goes to stdout: no progress bar in it
        frame = frame.assign(predicted_ms=model.predict(frame))
    else:
        with progress() as bar:
            task = bar.add_task(f"predict {len(frame)} cells", total=1)
            frame = frame.assign(predicted_ms=model.predict(frame))
            bar.advance(task)
    if out is None:
        keep = [c for c in ("arch", "hash", "unique_cell_hash", "device", "latency_ms", "predicted_ms") if c in frame]
        typer.echo(frame[keep].to_csv(index=False), nl=False)
    elif out.suffix.lower() == ".csv":
        frame.to_csv(out, index=False)
    else:
        frame.to_parquet(out, index=False)
    if out is not None:
        typer.echo(f"wrote {len(frame)} predictions to {out}")


def _fit_kernels(kernels: Path, out: Path, device: str | None, e2e: Path | None, params: dict[str, Any]) -> None:
    from leti.predict.kernels.files import fit_kernels_file

    with progress() as bar:
        task = bar.add_task(f"fit kernel regressors on {kernels.name}", total=1)
        pred = fit_kernels_file(kernels, out, device, e2e, params)
        bar.advance(task)
    o = pred.overhead
    overhead = (f"overhead from {o.n_models} models (log-space spread {o.resid_std:.3f})" if o.coef
                else "no end-to-end latencies: model latency = sum of kernels (give --e2e to learn the overhead)")
    types = pred.regressors.kernel_types
    typer.echo(f"wrote kernel-level predictor for {pred.describes} to {out}: "
               f"{len(types)} kernel types ({', '.join(types)}); {overhead}")
    if getattr(pred, "left_out_rows", 0):
        typer.echo(f"left out {pred.left_out_rows} rows of {kernels.name} marked usable = false (op rows without "
                   "shapes or below the profiler's resolution)")


def _adapt_kernels(kernels: Path, out: Path, source: Path, device: str | None, e2e: Path | None) -> None:
    from leti.predict.kernels.files import adapt_kernels_file

    with progress() as bar:
        task = bar.add_task(f"adapt {source} to the kernels of {kernels.name}", total=1)
        pred = adapt_kernels_file(kernels, out, source, device, e2e)
        bar.advance(task)
    src_device, models, rows = pred.adapted_from
    typer.echo(f"wrote kernel-level predictor for {pred.describes} to {out}: the regressors of {src_device!r} adapted "
               f"with {rows} kernels of {models} models; {pred.overhead_note}")


def _predict_kernels(kernels: Path, predictor: Path, out: Path | None, allow_unknown: bool) -> None:
    from leti.predict.kernels.files import predict_kernels_file

    frame, stood_in = predict_kernels_file(kernels, predictor, allow_unknown)
    for unknown, used in sorted(stood_in.items()):
        typer.echo(f"note: kernel type {unknown!r} is unknown to the predictor; predicted as {used!r}", err=True)
    if out is None:
        keep = [c for c in ("model", "op_index", "kernel_index", "operation", "kernel_type", "device", "latency_ms",
                            "predicted_ms") if c in frame]
        typer.echo(frame[keep].to_csv(index=False), nl=False)
        return
    if out.suffix.lower() == ".csv":
        frame.to_csv(out, index=False)
    else:
        frame.to_parquet(out, index=False)
    typer.echo(f"wrote {len(frame)} kernel predictions to {out}")


def _predict_model(model_file: Path, predictor: Path, allow_unknown: bool, as_json: bool,
                   device: str | None) -> None:
    from leti.predict.kernels.model import load_kernel_predictor, predict_model_latency

    if not model_file.exists():
        raise LetiError(f"{model_file}: no such model file")
    pred = load_kernel_predictor(predictor)
    result = predict_model_latency(model_file, pred, allow_unknown, device=device)
    stood_in = {(r.kernel_type, r.predicted_as) for r in result.kernels.itertuples() if r.kernel_type != r.predicted_as}
    for unknown, used in sorted(stood_in):
        typer.echo(f"note: kernel type {unknown!r} is unknown to the predictor; predicted as {used!r}", err=True)
    if result.host == "other":
        where = ", ".join(sorted({h.get("cpu", "?") for h in pred.hosts}))
        typer.echo(f"note: {predictor}'s kernels were timed on another machine ({where}); the prediction is for that "
                   "machine, and its interval is widened for the spread between machines (VMs of one CPU type ran "
                   "1.17x apart); a build here (leti kernels build) predicts this one", err=True)
    if result.outside_delegate:
        typer.echo(_outside_warning(result.outside_delegate, model_file, pred), err=True)
    if as_json:
        line = {"model": str(model_file), "predictor": str(predictor), "device": pred.device,
                "runtime": pred.runtime, "precision": pred.precision, **result.to_dict()}
        line["model"] = str(model_file)
        typer.echo(json.dumps(line))
        return
    typer.echo(f"{result.latency_ms:.5g} ms (90% interval {result.low_ms:.4g}-{result.high_ms:.4g} ms; "
               f"{len(result.kernels)} kernels; {pred.describes})")


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_cmd)
    app.command("fit")(fit_cmd)
    app.command("predict")(predict_cmd)
    app.command("choose")(choose_cmd)


def _one_size(text: str) -> int:
    """``--train-size`` without ``--transfer-from``: one integer."""
    try:
        return int(text)
    except ValueError:
        raise LetiError(f"--train-size must be one integer (a comma list needs --transfer-from), "
                        f"got {text!r}") from None


def choose_cmd(
    dataset: Path = typer.Option(..., "--dataset", help="Source devices' dataset (Parquet with a device column)."),
    cells: Path = typer.Option(..., "--cells", help="Candidate cells (Parquet/CSV with matrix+ops or arch)."),
    budget: int = typer.Option(..., "--budget", help="How many cells to measure on the new device."),
    out: Path = typer.Option(..., "--out", help="Parquet (or CSV) of the chosen rows of --cells, with choice_rank."),
    seed: int = typer.Option(0, "--seed", help="Seed of the choice."),
    method: str = typer.Option("design", "--method", help="design (default), stratified, kmeans, kcenter or random."),
) -> None:
    """The cells to measure first on a new device: spread over the source devices' latency space.

    Example: leti choose --dataset sources.parquet --cells cells.parquet --budget 10 --out chosen.parquet
    """
    from leti.cli.transfer import choose_cells

    choose_cells(dataset, cells, budget, out, seed, method)


def _outside_warning(outside: dict, model_file, pred) -> str:
    """The warning for a model XNNPACK runs in parts: what it leaves out, and whether the predictor prices that."""
    from leti.predict.kernels.overhead import OUTSIDE

    ops = ", ".join(f"{op} x{n}" for op, n in sorted(outside.items()))
    head = f"warning: XNNPACK leaves {sum(outside.values())} nodes of {model_file} to TFLite's own kernels ({ops}); "
    coef = dict(zip(pred.overhead.terms, pred.overhead.coef)).get(OUTSIDE)
    if coef is None:
        return head + ("this predictor prices them as delegated kernels and not the switches between the delegate's "
                       "partitions (its build's networks held none), so it is likely low (such zoo models: 4-6 % low "
                       "on average, up to 13 %)")
    return head + (f"the overhead adds {coef * 1e3:.1f} µs for each kernel they run (the price its build timed or "
                   "fitted), but such models may still come out low (the local CPU's zoo: 1-3 % low on average)")
