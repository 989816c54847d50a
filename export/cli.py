"""The ``minreal`` command: a thin click shell over the Python API (compress, export, runtime_bench)."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Callable

import click

__all__ = ["cli", "main"]

USAGE_EXIT, FAIL_EXIT = 2, 1


from compress.progress import PROGRESS_KEY  # noqa: E402  (runtime_bench logs with the same key)
LIBRARY_LOGGERS = ("compress", "runtime_bench", "export")


class ProgressBars(logging.Handler):
    """Draws the library's progress log records as tqdm bars on stderr (one bar per task)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.bars: dict[str, Any] = {}

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, PROGRESS_KEY, None)
        if info is None:
            return
        from tqdm import tqdm

        task, done, total = info
        bar = self.bars.get(task)
        if bar is None or done <= bar.n:
            if bar is not None:
                bar.close()
            bar = self.bars[task] = tqdm(total=total, desc=task, leave=False, file=sys.stderr, disable=None)
        bar.update(done - bar.n)
        if done >= total:
            self.bars.pop(task).close()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        super().close()


class Console:
    """Where the CLI talks: progress and tables on stderr/stdout, or one JSON document with ``--json``."""

    def __init__(self, quiet: bool, as_json: bool) -> None:
        self.quiet, self.as_json = quiet, as_json
        root = logging.getLogger()
        for old in [h for h in root.handlers if isinstance(h, ProgressBars)]:
            root.removeHandler(old)
            old.close()
        if not quiet:
            root.addHandler(ProgressBars())
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).setLevel(logging.INFO)

    def progress(self, msg: str) -> None:
        if not self.quiet:
            click.echo(f"· {msg}", err=True)

    def table(self, text: str) -> None:
        if not self.as_json:  # --quiet silences progress only; results are still shown
            click.echo(text)

    def result(self, obj: Any) -> None:
        if self.as_json:
            click.echo(json.dumps(_plain(obj), indent=2))


def _plain(obj: Any) -> Any:
    from export.pipeline import to_jsonable  # one JSON conversion for the whole tool

    return to_jsonable(asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else obj)


def common(fn: Callable) -> Callable:
    """``--quiet`` and ``--json`` on every subcommand."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")(fn)
    return click.option("--quiet", "-q", is_flag=True, help="No progress messages.")(fn)


def method_options(fn: Callable) -> Callable:
    """One option per config field of the registered methods (see export.method_options)."""
    from export.method_options import method_option_specs

    for spec in reversed(method_option_specs()):
        helptext = f"{spec.help} [method(s): {', '.join(spec.methods)}]"
        if spec.kind is bool:
            opt = click.option(f"{spec.flag}/--no-{spec.flag[2:]}", spec.field, default=None, help=helptext)
        else:
            kind = click.Choice(spec.choices) if spec.choices else spec.kind
            opt = click.option(spec.flag, spec.field, type=kind, default=None, multiple=spec.multiple,
                               help=helptext + (" Repeat for several values." if spec.multiple else ""))
        fn = opt(fn)
    return fn


def _method_choice() -> click.Choice:
    from compress import method_names

    return click.Choice(method_names())


def _split_ints(value: str, name: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=name) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}", param_hint=name)
    return out


def _split_names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="minreal")
def cli() -> None:
    """minreal: compress PyTorch models by structure, export to ONNX, benchmark with ONNX Runtime.

    Models: a torchvision name (with --weights), path/file.py:factory, package.module:factory, a .pt2
    torch.export program. Data: digits, digits-flat, digits-seq, file.npz/.npy, an image folder, or
    module:callable.
    """


@cli.command("methods")
@common
def methods_cmd(quiet: bool, as_json: bool) -> None:
    """List the registered compression methods and their options."""
    from compress import get_method, method_names
    from export.method_options import method_option_specs

    con = Console(quiet, as_json)
    specs = method_option_specs()
    rows = {n: {"summary": get_method(n).summary,
                "options": [s.flag for s in specs if n in s.methods]} for n in method_names()}
    con.table("\n".join(f"{n:<12} {r['summary']}\n{'':<12} {' '.join(r['options'])}" for n, r in rows.items()))
    con.result(rows)


def _input_files(*specs: str | None) -> list[Path]:
    """Files named by input specs (a path, or the file of a ``file.py:factory`` spec)."""
    return [Path(p) for spec in filter(None, specs) for p in {spec, spec.rsplit(":", 1)[0]}]


def _prepare_outputs(outputs: list[str | Path | None], *inputs: str | None) -> None:
    """Refuse an output that is one of the inputs; create each output's folder or say why it cannot be."""
    from export.atomic import ensure_distinct
    from export.specs import SpecError

    for out in filter(None, outputs):
        for path in _input_files(*inputs):
            ensure_distinct(path, out)
        parent = Path(out).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"cannot create the folder of output {out}: {exc.strerror or exc}") from None
        if not os.access(parent, os.W_OK):
            raise SpecError(f"output {out}: folder {parent} is not writable")


def _load_inputs(model: str, weights: str | None, trust_pickle: bool, data: str, eval_data: str | None):
    from export import specs

    net = specs.load_model(model, weights=weights, trust_pickle=trust_pickle)
    loaded = specs.load_data(data, eval_spec=eval_data)
    specs.check_input_shape(net, loaded.calib.x, model)
    return net, loaded.calib, loaded.evaluation


@cli.command("compress")
@click.argument("model")
@click.option("--method", "-m", type=_method_choice(), required=True, help="Registered compression method.")
@click.option("--calib", "data", required=True, help="Calibration (and, for methods that train, training) data.")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default="compressed.pt2", show_default=True,
              help="Compressed model as a torch.export program (.pt2).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option("--target-provider", type=click.Choice(["cpu", "cuda", "tensorrt"]), default="cpu",
              show_default=True, help="Provider the model is for; sets --rank-multiple's default (cpu 16, GPU 8).")
@method_options
@common
def compress_cmd(model: str, method: str, data: str, weights: str | None, trust_pickle: bool, out: str,
                 report_path: str | None, target_provider: str, quiet: bool, as_json: bool, **opts: Any) -> None:
    """Compress MODEL with one method and save it as a torch.export program."""
    from compress import compress
    from export.method_options import build_config, provider_defaults
    from export.pipeline import write_json
    from export.serialize import save_program

    con = Console(quiet, as_json)
    _prepare_outputs([out, report_path], model, weights, data)
    config = build_config(method, opts, provider_defaults((target_provider,)))
    net, calib, _ = _load_inputs(model, weights, trust_pickle, data, None)
    con.progress(f"compressing {model} with {method}")
    small, report = compress(net, calib, method, config)
    save_program(small, calib.x[:2], Path(out))
    if report_path:
        write_json(report, Path(report_path))
    con.table(f"params {report.params_before} -> {report.params_after} ({report.param_ratio:.3f}), "
              f"MACs {report.macs_before} -> {report.macs_after} ({report.mac_ratio:.3f}); saved {out}")
    con.result(report)


@cli.command("export")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Destination .onnx file.")
@click.option("--data", help="Data for the example input, parity check and INT8 calibration.")
@click.option("--input-shape", help="Per-sample input shape, e.g. 3,224,224 (random example; no --data).")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset (>= 17).")
@click.option("--rtol", type=float, default=1e-3, show_default=True, help="Parity relative tolerance.")
@click.option("--atol", type=float, default=1e-4, show_default=True, help="Parity absolute tolerance.")
@click.option("--int8", is_flag=True, help="Also write OUT with suffix .int8.onnx (static QDQ by default).")
@click.option("--quant-target", type=click.Choice(["cpu", "tensorrt"]), default="cpu", show_default=True,
              help="cpu: uint8 activations (fused integer kernels); tensorrt: symmetric int8.")
@click.option("--quant-mode", type=click.Choice(["static", "dynamic"]), default="static", show_default=True)
@click.option("--allow-random-calibration", is_flag=True, help="Calibrate INT8 on random data (not advised).")
@common
def export_cmd(model: str, out: str, data: str | None, input_shape: str | None, weights: str | None, trust_pickle: bool, opset: int,
               rtol: float, atol: float, int8: bool, quant_target: str, quant_mode: str,
               allow_random_calibration: bool, quiet: bool, as_json: bool) -> None:
    """Export MODEL to ONNX (dynamic batch), simplify, verify parity, optionally quantise to INT8."""
    from export.single import ExportOptions, export_single

    con = Console(quiet, as_json)
    opts = ExportOptions(opset, rtol, atol, int8, quant_target, quant_mode, allow_random_calibration)
    shape = _split_ints(input_shape, "--input-shape") if input_shape else None
    _prepare_outputs([out, Path(out).with_name(Path(out).stem + ".int8.onnx") if int8 else None],
                     model, weights, data)
    result = export_single(model, Path(out), data, weights, trust_pickle, opts, con.progress, shape)
    con.table(f"wrote {out} ({result.onnx_bytes} bytes, exporter {result.export['exporter']}); parity ok")
    con.result(result)


@cli.command("bench")
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--providers", default="cpu", show_default=True, help="Comma-separated: cpu, cuda, tensorrt.")
@click.option("--batch", "batch", default="1,32", show_default=True, help="Comma-separated batch sizes.")
@click.option("--data", help="Evaluation data (labels give accuracy); random inputs without it.")
@click.option("--warmup", type=int, default=10, show_default=True, help="Discarded warm-up runs per model.")
@click.option("--min-runs", type=int, default=50, show_default=True, help="Minimum measured runs.")
@click.option("--min-seconds", type=float, default=2.0, show_default=True, help="Minimum measuring time.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Fresh processes per provider/batch.")
@click.option("--threads", type=int, help="Intra-op threads (default: physical cores).")
@click.option("--out", type=click.Path(dir_okay=False), default="bench.json", show_default=True,
              help="Report JSON; a Markdown copy is written next to it.")
@common
def bench_cmd(models: tuple[str, ...], providers: str, batch: str, data: str | None, warmup: int,
              min_runs: int, min_seconds: float, repeats: int, threads: int | None, out: str, quiet: bool,
              as_json: bool) -> None:
    """Benchmark ONNX MODELS side by side (ratios vs the first) with ONNX Runtime."""
    import runtime_bench as rb

    con = Console(quiet, as_json)
    _prepare_outputs([out, Path(out).with_suffix(".md")], *models, data)
    x = y = None
    if data:
        from export import specs

        held = specs.load_dataset(data)  # the user's evaluation data, all of it
        x = held.x.numpy()
        y = None if held.y is None else held.y.numpy()
    cfg = rb.BenchConfig(providers=_split_names(providers), batch_sizes=_split_ints(batch, "--batch"),
                         warmup=warmup, min_runs=min_runs, min_seconds=min_seconds, repeats=repeats,
                         intra_op_threads=threads)
    entries = [rb.ModelEntry(Path(m).stem, Path(m)) for m in models]
    report = rb.run_benchmark(entries, cfg, x, y, progress=con.progress)
    rb.write_json(report, Path(out))
    rb.write_markdown(report, Path(out).with_suffix(".md"))
    con.table(rb.format_table(report))
    con.result(report)


@cli.command("check")
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--max-latency-ratio", type=float, help="Highest allowed latency ratio vs the first model.")
@click.option("--max-accuracy-drop", type=float, help="Highest allowed accuracy drop, percentage points.")
@click.option("--min-agreement", type=float, help="Lowest allowed top-1 agreement with the first model (0-1).")
@click.option("--baseline", type=click.Path(dir_okay=False), help="Earlier report to compare latencies with.")
@click.option("--max-regression", type=float, help="Highest allowed latency regression vs --baseline, percent.")
@common
def check_cmd(report: str, max_latency_ratio: float | None, max_accuracy_drop: float | None,
              min_agreement: float | None, baseline: str | None, max_regression: float | None, quiet: bool,
              as_json: bool) -> None:
    """Release gate: exit 0 when every criterion holds for REPORT, 1 otherwise.

    REPORT is a `minreal bench` JSON or a run directory's report.json (every case is checked).
    """
    from export.gate import check_reports

    con = Console(quiet, as_json)
    if all(v is None for v in (max_latency_ratio, max_accuracy_drop, min_agreement, max_regression)):
        raise click.UsageError("give at least one criterion (--max-latency-ratio, --max-accuracy-drop, "
                               "--min-agreement, --max-regression); a gate with none would always pass")
    results = check_reports(Path(report), Path(baseline) if baseline else None, max_latency_ratio,
                            max_accuracy_drop, min_agreement, max_regression)
    passed = all(r.passed for _, r in results)
    import runtime_bench as rb

    for name, res in results:
        con.table(f"[{name}]\n{rb.format_check(res)}")
    con.result({"passed": passed, "reports": {n: r for n, r in results}})
    if not passed:
        failed = [f"{n}: {c.name} {c.model} measured {c.measured:.4g} allowed {c.allowed:.4g}"
                  for n, r in results for c in r.criteria if not c.passed]
        click.echo("FAILED " + "; ".join(failed), err=True)
        sys.exit(FAIL_EXIT)


def _pipeline_options(fn: Callable) -> Callable:
    for opt in reversed([
        click.option("--out", default="runs/latest", show_default=True, type=click.Path(file_okay=False),
                     help="Run directory (must not exist unless --overwrite)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing run directory."),
        click.option("--batch", default="1,32", show_default=True, help="Comma-separated batch sizes."),
        click.option("--providers", default="cpu", show_default=True, help="Comma-separated providers."),
        click.option("--no-int8", is_flag=True, help="Skip INT8 quantisation."),
        click.option("--quant-target", type=click.Choice(["cpu", "tensorrt"]), default="cpu", show_default=True,
                     help="cpu: uint8 activations (fused integer kernels); tensorrt: symmetric int8."),
        click.option("--quant-mode", type=click.Choice(["static", "dynamic"]), default="static", show_default=True,
                     help="static: calibrated QDQ; dynamic: weights only, activations quantised at run time."),
        click.option("--min-seconds", type=float, help="Minimum measuring time per model (default 2 s)."),
        click.option("--repeats", type=int, help="Fresh processes per provider/batch (default 3)."),
    ]):
        fn = opt(fn)
    return fn


def _pipeline_config(base: Any, batch: str, providers: str, no_int8: bool, quant_target: str, quant_mode: str,
                     min_seconds: float | None, repeats: int | None) -> Any:
    from dataclasses import replace

    cfg = replace(base, batch_sizes=_split_ints(batch, "--batch"), providers=_split_names(providers),
                  int8=not no_int8, quant_target=quant_target, quant_mode=quant_mode)
    if min_seconds is not None:
        cfg = replace(cfg, min_seconds=min_seconds)
    return replace(cfg, repeats=repeats) if repeats is not None else cfg


def _finish_run(con: Console, report: Any, out: str) -> None:
    from export.report import format_compact

    con.table(format_compact(report))
    for case in report.cases:
        for w in case.warnings:
            click.echo(f"WARNING [{case.name}] {w}", err=True)
    con.table(f"\nrun directory: {out} (full table in report.md; report.json, plot.png, ONNX files per case)")
    con.result(report)


@cli.command("run")
@click.argument("model")
@click.option("--method", "-m", "method", type=_method_choice(), multiple=True, required=True,
              help="Method(s) to compare; repeat for several.")
@click.option("--data", required=True, help="Calibration/training data.")
@click.option("--eval-data", help="Held-out evaluation data (default: a split of --data).")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@click.option("--trust-pickle", is_flag=True, help="Allow loading a pickled full nn.Module (unsafe).")
@_pipeline_options
@method_options
@common
def run_cmd(model: str, method: tuple[str, ...], data: str, eval_data: str | None, weights: str | None,
            trust_pickle: bool, out: str, overwrite: bool, batch: str, providers: str, no_int8: bool,
            quant_target: str, quant_mode: str, min_seconds: float | None, repeats: int | None, quiet: bool,
            as_json: bool,
            **opts: Any) -> None:
    """One-shot pipeline: compress MODEL → export → simplify → verify → INT8 → benchmark."""
    from compress.demo_case import DemoCase, DemoRun
    from export.method_options import build_config, provider_defaults
    from export.pipeline import PipelineConfig, run_pipeline, prepare_run_dir

    con = Console(quiet, as_json)
    cfg = _pipeline_config(PipelineConfig(), batch, providers, no_int8, quant_target, quant_mode, min_seconds,
                           repeats)
    runs = [DemoRun(m, m, build_config(m, opts, provider_defaults(cfg.providers))) for m in method]
    prepare_run_dir(Path(out), overwrite, _input_files(model, weights, data, eval_data)).rmdir()  # fail fast
    net, calib, held = _load_inputs(model, weights, trust_pickle, data, eval_data)
    case = DemoCase(Path(model.split(":")[-1]).stem or "model", net, calib, held, runs)
    report = run_pipeline([case], Path(out), cfg, overwrite, con.progress,
                          inputs=_input_files(model, weights, data, eval_data))
    _finish_run(con, report, out)


@cli.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--overwrite", is_flag=True, help="Replace an existing run directory.")
@click.option("--only", help="Comma-separated demo cases: digits-mlp, digits-cnn, or a method name "
              "(cbalanced, fde, ssm) for that method's own case.")
@click.option("--full", is_flag=True, help="Longer training and the full 2 s timing protocol.")
@common
def demo_cmd(out: str, overwrite: bool, only: str | None, full: bool, quiet: bool, as_json: bool) -> None:
    """Embedded demo on scikit-learn's digits: train, compress, export, quantise, benchmark."""
    from dataclasses import replace

    from export.demo import DEMO_PIPELINE, demo_cases
    from export.pipeline import PipelineConfig, prepare_run_dir, run_pipeline

    con = Console(quiet, as_json)
    prepare_run_dir(Path(out), overwrite).rmdir()
    con.progress("training demo models (seeded)")
    try:
        cases = demo_cases(quick=not full, only=_split_names(only or ""))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    cfg = PipelineConfig() if full else DEMO_PIPELINE
    report = run_pipeline(cases, Path(out), replace(cfg), overwrite, con.progress)
    _finish_run(con, report, out)


@cli.command("latency-table")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Destination JSON table.")
@click.option("--data", help="Data for the example input.")
@click.option("--input-shape", help="Per-sample input shape, e.g. 3,224,224 (random example; no --data).")
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size the latencies are measured at.")
@click.option("--provider", default="cpu", show_default=True, help="Provider to measure on: cpu, cuda, tensorrt.")
@click.option("--ranks-per-layer", type=int, default=6, show_default=True, help="Ranks measured per layer.")
@click.option("--weights", help="Local weights file (state dict) for a torchvision name or factory.")
@common
def latency_table_cmd(model: str, out: str, data: str | None, input_shape: str | None, batch: int, provider: str,
                      ranks_per_layer: int, weights: str | None, quiet: bool, as_json: bool) -> None:
    """Measure per-layer latencies of MODEL's factorisable layers for `compress -m factorize --latency`."""
    import torch

    from export import specs
    from export.latency_table import build_latency_table

    con = Console(quiet, as_json)
    _prepare_outputs([out], model, weights, data)
    net = specs.load_model(model, weights=weights)
    if data:
        x = specs.load_data(data).calib.x[:batch]
    elif input_shape:
        x = torch.randn(batch, *_split_ints(input_shape, "--input-shape"))
    else:
        raise specs.SpecError("latency-table needs an example input: pass --data SPEC or --input-shape C,H,W")
    specs.check_input_shape(net, x, model)
    con.progress(f"timing the factorisable layers of {model} on {provider}")
    table = build_latency_table(net, x, provider, ranks_per_layer, out_path=Path(out))
    con.table(f"wrote {out} ({len(table['layers'])} layers on {provider})")
    con.result(table)


def _usage_errors() -> tuple[type[BaseException], ...]:
    from compress import CompressionError, UnknownMethodError
    from export.method_options import MethodOptionError
    from export.errors import SameFileError
    from export.pipeline import RunDirError
    from export.specs import SpecError
    from runtime_bench import (BenchInputError, CheckError, ModelFileError, ReportSchemaError,
                               UnknownProviderError)

    return (MethodOptionError, RunDirError, SpecError, UnknownMethodError, CompressionError, SameFileError,
            BenchInputError, CheckError, ModelFileError, ReportSchemaError, UnknownProviderError)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit 2 for usage errors and 1 for failures, no tracebacks.

    Set ``MINREAL_DEBUG=1`` to see the traceback of an unexpected error.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, ProgressBars):
            handler.setLevel(logging.WARNING)  # library INFO records reach only the progress bars
    try:
        cli.main(args=argv, prog_name="minreal", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("minreal: aborted", err=True)
        sys.exit(FAIL_EXIT)
    except click.ClickException as exc:
        exc.show()
        sys.exit(USAGE_EXIT if isinstance(exc, click.UsageError) else exc.exit_code)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the CLI's single place that turns errors into one line
        if os.environ.get("MINREAL_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        click.echo(f"minreal: error: {first}", err=True)
        sys.exit(USAGE_EXIT if isinstance(exc, _usage_errors()) else FAIL_EXIT)
