"""The typed, versioned compression report: a real report round-trips through its JSON, a report written before the
version key loads, a newer version is refused in one line, unknown keys are kept (predicted/measured) or refused
(top level), and every key a writer in the code sets is a typed field."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch

from minreal.compress import compress
from minreal.compress.core.data import Dataset
from minreal.compress.core.evaluate import compare_outputs
from minreal.compress.core.options import BUDGET_FIELDS
from minreal.compress.core.report import (
    REPORT_SCHEMA_VERSION,
    UNSET,
    CompressionReport,
    Measured,
    Predicted,
    ReportVersionError,
)
from minreal.compress.methods.ssm import SSMClassifier, SSMConfig
from minreal.compress.methods.svd import SVDConfig
from minreal.export.json_safe import to_jsonable

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("compress", "export", "minreal", "runtime_bench", "benchmarks", "examples")


def _through_json(report: CompressionReport) -> dict:
    return json.loads(json.dumps(to_jsonable(report)))


def test_a_real_report_round_trips(tiny_mlp: torch.nn.Module, mlp_data: Dataset) -> None:
    _, report = compress(tiny_mlp, mlp_data, "svd", SVDConfig(mac_ratio=0.5))
    data = _through_json(report)
    assert data["schema_version"] == REPORT_SCHEMA_VERSION == 2 and data["macs_at"] == {"input": [12]}
    loaded = CompressionReport.from_json(data)
    assert _through_json(loaded) == data
    version_1 = {k: v for k, v in data.items() if k != "macs_at"} | {"schema_version": 1}  # written before macs_at
    assert CompressionReport.from_json(version_1).macs_at == {} and CompressionReport.from_json(version_1).macs_after
    assert loaded.predicted.budget == {"kind": "mac_ratio", "requested": 0.5, "achieved": report.mac_ratio}
    assert loaded.predicted.whole_model_mac_ratio == report.mac_ratio
    assert loaded.measured.relative_output_error == report.measured.relative_output_error
    assert loaded.predicted == report.predicted and loaded.measured == report.measured
    assert [dataclasses.asdict(layer) for layer in loaded.layers] == [dataclasses.asdict(la) for la in report.layers]
    assert loaded.predicted.cache_hits is UNSET and "cache_hits" not in data["predicted"]


def test_per_layer_keys_of_ssm_round_trip_as_flat_keys() -> None:
    torch.manual_seed(0)
    model = SSMClassifier(1, 8, 16, 2, 4).eval()
    data = Dataset(torch.randn(32, 40, 1), torch.randint(0, 4, (32,)))
    _, report = compress(model, data, "ssm", SSMConfig(trunc=0.75))
    layers = sorted(report.bounds)
    assert layers and sorted(report.predicted.state_bounds) == layers == sorted(report.measured.gain_errors)
    as_json = _through_json(report)
    assert {f"{n}.bound" for n in layers} <= set(as_json["predicted"])
    assert {f"{n}.gain_error" for n in layers} <= set(as_json["measured"])
    loaded = CompressionReport.from_json(as_json)
    assert loaded.predicted.state_bounds == report.predicted.state_bounds == {n: report.bounds[n] for n in layers}
    assert loaded.predicted[f"{layers[0]}.bound"] == report.bounds[layers[0]]
    assert _through_json(loaded) == as_json


def test_a_report_without_a_version_loads_as_version_1(tmp_path: Path) -> None:
    old = {"method": "svd", "config": {"rank_fraction": 0.5}, "params_before": 100, "params_after": 60,
           "macs_before": 100, "macs_after": 50,
           "layers": [{"name": "0", "kind": "Linear", "action": "factorized", "reason": "", "params_before": 100,
                       "params_after": 60, "macs_before": 100, "macs_after": 50, "rank": 3, "full_rank": 8,
                       "details": {}}],
           "predicted": {"whole_model_mac_ratio": 0.5, "budget": {"kind": "mac_ratio", "requested": 0.5,
                                                                  "achieved": 0.5}},
           "measured": {"relative_output_error": 0.01, "held_out": None}, "timings_s": {}, "notes": [],
           "spectra": {}, "bounds": {}, "recovery": None}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    report = CompressionReport.load(path)
    assert report.mac_ratio == 0.5 and report.layers[0].rank == 3
    assert report.predicted.budget["requested"] == 0.5 and report.measured.relative_output_error == 0.01
    assert report.measured.held_out is None and "held_out" in report.measured  # None is a value, not UNSET
    assert report.rule_macs_before == 0 and report.not_counted == []  # fields the old report predates: defaults
    assert report.to_json()["measured"] == old["measured"]


def test_a_newer_version_is_refused_in_one_line_naming_file_and_version(tmp_path: Path) -> None:
    path = tmp_path / "future.json"
    path.write_text(json.dumps({"schema_version": REPORT_SCHEMA_VERSION + 1, "method": "svd", "config": {}}))
    with pytest.raises(ReportVersionError) as err:
        CompressionReport.load(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and f"schema_version {REPORT_SCHEMA_VERSION + 1}" in message


def test_a_run_report_of_a_newer_version_is_refused_in_one_line(tmp_path: Path) -> None:
    from minreal.app.run_report import RUN_SCHEMA_VERSION, RunReport

    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema_version": RUN_SCHEMA_VERSION + 1, "cases": []}))
    with pytest.raises(ReportVersionError) as err:
        RunReport.load(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    path.write_text(json.dumps({"created_utc": "then", "config": {}, "cases": [{"name": "c", "variants": []}]}))
    old = RunReport.load(path)
    assert old.schema_version == 1 and old.cases[0].name == "c"


def test_unknown_keys_are_kept_in_predicted_and_measured_and_refused_at_the_top() -> None:
    data = {"method": "mine", "config": {}, "predicted": {"my_own_ratio": 0.3, "whole_model_mac_ratio": 0.4},
            "measured": {"my_metric": [1, 2]}}
    report = CompressionReport.from_json(data)
    assert report.predicted.extra == {"my_own_ratio": 0.3} and report.predicted.whole_model_mac_ratio == 0.4
    assert report.predicted["my_own_ratio"] == 0.3 and report.measured["my_metric"] == [1, 2]
    assert report.to_json()["predicted"] == data["predicted"] and report.to_json()["measured"] == data["measured"]
    with pytest.raises(ValueError, match="r.json: unknown compression report key.*surprise"):
        CompressionReport.from_json({**data, "surprise": 1}, "r.json")


def test_predicted_and_measured_are_read_only_mappings_of_their_set_fields() -> None:
    predicted = Predicted(whole_model_mac_ratio=0.5, output_deviation_bound=None)
    assert dict(predicted) == {"whole_model_mac_ratio": 0.5, "output_deviation_bound": None}
    assert predicted.get("budget") is None and "budget" not in predicted and len(predicted) == 2
    with pytest.raises(KeyError):
        predicted["budget"]
    with pytest.raises(TypeError):
        predicted["budget"] = {}  # type: ignore[index]
    with pytest.raises(AttributeError, match="no field 'budgett'"):
        predicted.budgett = {}  # type: ignore[attr-defined]
    assert predicted == {"whole_model_mac_ratio": 0.5, "output_deviation_bound": None}
    # copies and pickles keep UNSET (a cached prepared report is deep-copied, a tune worker's is pickled)
    for again in (copy.deepcopy(predicted), pickle.loads(pickle.dumps(predicted))):
        assert again.budget is UNSET and again == predicted


def _typed_fields() -> tuple[set[str], set[str]]:
    names = [{f.name for f in dataclasses.fields(cls)} - {"extra"} for cls in (Predicted, Measured)]
    return names[0], names[1]


def _writes(tree: ast.AST) -> list[tuple[str, str, str]]:
    """(record, key, how) of every write into a ``.predicted``/``.measured`` in a module: attribute assignments,
    ``replace(x.predicted, key=...)``, ``setattr(x.predicted, ...)`` and subscript assignments."""
    found = []

    def record(node: ast.AST) -> str | None:
        return node.attr if isinstance(node, ast.Attribute) and node.attr in ("predicted", "measured") else None

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and (r := record(el.value)):
                    found.append((r, el.attr, "attribute"))
                if isinstance(el, ast.Subscript) and (r := record(el.value)):
                    found.append((r, ast.unparse(el.slice), "subscript"))
        if isinstance(node, ast.Call) and node.args and (r := record(node.args[0])):
            name = ast.unparse(node.func)
            if name.endswith("replace"):
                found += [(r, k.arg, "replace") for k in node.keywords if k.arg]
            elif name == "setattr":
                found.append((r, ast.unparse(node.args[1]), "setattr"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (r := record(node.func.value)):
            if node.func.attr in ("update", "setdefault", "__setitem__", "pop"):
                found.append((r, node.func.attr, "mutation"))
    return found


def test_every_key_a_writer_sets_is_a_typed_field() -> None:
    predicted, measured = _typed_fields()
    fields = {"predicted": predicted, "measured": measured}
    writes = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            writes += [(str(path.relative_to(ROOT)), *w) for w in _writes(ast.parse(path.read_text()))]
    assert writes, "the scan found no writer"
    untyped = [w for w in writes if w[3] == "attribute" and w[2] not in fields[w[1]] | {"extra"}
               or w[3] == "replace" and w[2] not in fields[w[1]]]
    assert untyped == []
    assert [w for w in writes if w[3] in ("subscript", "mutation")] == []  # the mappings are read-only
    # the keys written through setattr are spelled at run time (those of ``**compare_outputs(...)``: the next test)
    setattrs = {w[2] for w in writes if w[3] == "setattr"}
    assert setattrs == {"key", "f'allocator_{budget}'"}
    assert {f"allocator_{b}" for b in BUDGET_FIELDS} <= predicted
    assert {"max_output_deviation_data", "max_output_deviation_data_float64"} <= measured


def test_every_key_of_the_output_comparison_is_a_typed_field(tiny_mlp: torch.nn.Module, mlp_data: Dataset) -> None:
    _, measured = _typed_fields()
    regression = Dataset(mlp_data.x, torch.randn(len(mlp_data), 5))
    keys = set(compare_outputs(tiny_mlp, tiny_mlp, mlp_data)) | set(compare_outputs(tiny_mlp, tiny_mlp, regression))
    assert keys == {"relative_output_error", "max_abs_diff", "top1_agreement", "accuracy_original",
                    "accuracy_compressed", "mse_original", "mse_compressed"}
    assert keys <= measured


@pytest.mark.parametrize(("layer", "says"), [
    ({"name": "fc", "kind": "Linear", "action": "kept", "colour": "red"}, "unknown layer key(s) colour (layer 'fc')"),
    ({"kind": "Linear", "action": "kept"}, "a layer without a name (layer '?')"),
    ("fc", "a layer of the compression report is str, not an object"),
])
def test_a_bad_layer_is_refused_as_a_value_error_naming_the_source(layer: object, says: str) -> None:
    with pytest.raises(ValueError) as err:
        CompressionReport.from_json({"method": "svd", "config": {}, "layers": [layer]}, "mine.json")
    assert err.type is ValueError and str(err.value).startswith(f"mine.json: {says}")
