"""Plan files for ``minreal run --plan plan.toml``: variants with their own options, and chains of methods.

A plan is a TOML list of variants, each a single method (options beside ``method``) or a chain run in
sequence (options of each step in a table named after the method)::

    [[variant]]
    method = "svd"
    layer_mac_ratio = 0.5

    [[variant]]
    method = ["fde", "factorize"]      # a chain: fde first, then factorize; label "fde+factorize"
    fde = { merge_eps = 0.01 }
    factorize = { mac_ratio = 0.5 }

``label`` (optional) names a variant; it defaults to the method names joined by ``+``. In a chain each step's budget
applies to the model that step receives (the previous step's result), not to the original: above, factorize
halves the MACs of fde's output. Values must have the option's type (``0.5`` for a ratio, ``["fc"]`` or ``"fc"``
for a repeated option, ``true``/``false`` for a switch). Every error is one line naming the file and the variant
(and key) at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
from torch import nn

from minreal.app.method_options import MethodOptionError, build_config
from minreal.compress import compress, method_names
from minreal.compress.core.data import Dataset
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.report import CompressionReport
from minreal.compress.core.run_case import VariantSpec
from minreal.compress.registry import chain_label, compress_chain

__all__ = ["PlanError", "load_plan", "run_variant"]

_RESERVED = ("method", "label")


class PlanError(MethodOptionError):
    """A plan file that cannot be read or has a variant that does not validate."""


def _methods(entry: dict[str, Any], where: str) -> list[str]:
    method = entry.get("method")
    methods = [method] if isinstance(method, str) else method
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        raise PlanError(f"{where}: 'method' must be a method name or a non-empty list of names (a chain)")
    unknown = [m for m in methods if m not in method_names()]
    if unknown:
        raise PlanError(f"{where}: unknown method {unknown[0]!r}; choose from {', '.join(method_names())}")
    if len(set(methods)) != len(methods):
        raise PlanError(f"{where}: a chain names each method once (got {chain_label(methods)})")
    return methods


def _step_options(entry: dict[str, Any], methods: list[str], where: str) -> dict[str, dict[str, Any]]:
    """Options per step: the keys beside ``method`` for a single method, one table per method for a chain."""
    rest = {k: v for k, v in entry.items() if k not in _RESERVED}
    if len(methods) == 1 and not isinstance(rest.get(methods[0]), dict):
        return {methods[0]: rest}
    stray = sorted(k for k in rest if k not in methods)
    if stray:
        raise PlanError(f"{where}: key {stray[0]!r}: options of a chain go in a table per method, "
                        f"e.g. {methods[0]} = {{ {stray[0]} = ... }}")
    for m in methods:
        if not isinstance(rest.get(m, {}), dict):
            raise PlanError(f"{where}: key {m!r} must be a table of {m}'s options")
    return {m: dict(rest.get(m, {})) for m in methods}


def _variant(entry: Any, index: int, path: Path, defaults: dict[str, Any]) -> VariantSpec:
    where = f"{path}: variant {index}"
    if not isinstance(entry, dict):
        raise PlanError(f"{where}: expected a table ([[variant]]), got {type(entry).__name__}")
    methods = _methods(entry, where)
    label = entry.get("label", chain_label(methods))
    if not isinstance(label, str) or not label.strip():
        raise PlanError(f"{where}: 'label' must be a non-empty string")
    where = f"{path}: variant {index} ({label})"
    steps = []
    for m, opts in _step_options(entry, methods, where).items():
        try:
            steps.append((m, build_config(m, opts, defaults)))
        except MethodOptionError as exc:
            raise PlanError(f"{where}: {exc}") from None
    if len(steps) == 1:
        return VariantSpec(label, steps[0][0], steps[0][1])
    return VariantSpec(label, chain_label(methods), None, tuple(steps))


def load_plan(path: str | Path, defaults: dict[str, Any] | None = None) -> list[VariantSpec]:
    """The variants of a plan file, each validated (``defaults``: provider-dependent option defaults)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"cannot read plan file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: not UTF-8 text (byte {exc.start}), so not a TOML plan") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"variant"})
    if unknown:
        raise PlanError(f"{path}: unknown key {unknown[0]!r}; a plan is a list of [[variant]] tables")
    variants = doc.get("variant")
    if not isinstance(variants, list) or not variants:
        raise PlanError(f"{path}: no variants; add at least one [[variant]] table with a 'method'")
    runs = [_variant(v, i, path, defaults or {}) for i, v in enumerate(variants, 1)]
    labels = [r.label for r in runs]
    dup = next((lb for lb in labels if labels.count(lb) > 1), None)
    if dup is not None:
        raise PlanError(f"{path}: two variants are labelled {dup!r}; give one a 'label'")
    return runs


def run_variant(model: nn.Module, data: Dataset, run: VariantSpec, recovery: RecoveryConfig | None = None,
                held_out: Dataset | None = None, dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
                recover_after: bool = True) -> tuple[nn.Module, CompressionReport]:
    """Compress ``model`` as one variant: a single method, or its chain of steps; then ``recovery``, or else the
    variant's own, if enabled (zero-shot and recovered models measured on ``held_out`` when given).
    ``dynamic_axes``: the axes besides the batch the result is to keep (checked where a trace decided on sizes).
    ``recover_after=False`` stops before the recovery (a method that trains with it, cbalanced, still gets it): the
    caller recovers with :func:`~minreal.compress.registry.apply_recovery`."""
    recovery = recovery or run.recovery
    if run.steps:
        return compress_chain(model, data, run.steps, recovery, held_out, dynamic_axes, recover_after)
    return compress(model, data, run.method, run.config, recovery, held_out, dynamic_axes=dynamic_axes,
                    recover_after=recover_after)
