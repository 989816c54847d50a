"""Import layering of the three packages, and facts written once, checked on the source with ``ast``.

compress is pure PyTorch, runtime_bench is ONNX Runtime only, export is where both meet; export's torch→ONNX
stages never import its application (``export.app``). Shared literals (provider names, integer op sets) are
defined in :mod:`runtime_bench.facts` only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compress", "export", "runtime_bench")
FORBIDDEN = {
    "compress": {"onnx", "onnxruntime", "onnxsim", "onnxscript", "export", "runtime_bench"},  # but see ALLOWED
    "runtime_bench": {"torch", "torchvision", "compress", "export"},
}
FACTS = "runtime_bench/facts.py"
#: The one exception to FORBIDDEN: the stdlib-only module of shared facts, which every package may import.
ALLOWED = {"runtime_bench.facts"}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    """Absolute names of every module ``path`` imports, anywhere in the file (function-level imports too)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            yield ".".join([*base, node.module] if node.module else base)


def _top_level_edges() -> set[tuple[str, str]]:
    return {(package, name.split(".")[0]) for package in PACKAGES for path in _modules(package)
            for name in _imports(path) if name.split(".")[0] in PACKAGES and name.split(".")[0] != package}


def test_every_package_has_modules() -> None:
    assert all(len(_modules(p)) > 3 for p in PACKAGES)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_forbidden_imports(package: str) -> None:
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in _modules(package) for name in _imports(path)
           if name.split(".")[0] in FORBIDDEN[package] and name not in ALLOWED]
    assert not bad, bad


def test_importing_compress_loads_no_onnx_and_runtime_bench_no_torch() -> None:
    """What the AST check cannot see: the facts module's package (runtime_bench/__init__) loads lazily."""
    import subprocess
    import sys

    code = ("import sys, compress, compress.registry; compress.method_names(); "
            "assert not {'onnx', 'onnxruntime'} & set(sys.modules), 'compress imported onnx'; "
            "import runtime_bench, runtime_bench.bench, runtime_bench.check; "
            "assert 'onnxruntime' not in sys.modules, 'onnxruntime is imported on first use only'; "
            "runtime_bench.available_providers(); assert 'onnxruntime' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    code = ("import sys, runtime_bench, runtime_bench.bench, runtime_bench.check, runtime_bench.report; "
            "assert not {'torch', 'compress'} & set(sys.modules), 'runtime_bench imported torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_no_cycles_between_top_level_packages() -> None:
    edges = _top_level_edges()
    assert ("export", "compress") in edges and ("export", "runtime_bench") in edges  # the checker sees imports
    reach = {p: {b for a, b in edges if a == p} for p in PACKAGES}
    for _ in PACKAGES:
        reach = {p: targets | {t for m in targets for t in reach[m]} for p, targets in reach.items()}
    assert not [p for p in PACKAGES if p in reach[p]], edges


def test_export_stages_never_import_the_application() -> None:
    stages = [path for path in _modules("export") if "app" not in path.relative_to(ROOT / "export").parts
              and path.name not in ("cli.py", "specs.py", "pipeline.py")]  # the last three are re-export shims
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in stages for name in _imports(path)
           if name.startswith("export.app")]
    assert not bad, bad


def _string_constants(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _collections(tree: ast.AST) -> Iterator[set[str]]:
    """The string elements of every set, tuple and list literal, and the string keys of every dict literal."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            yield {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        elif isinstance(node, ast.Dict):
            yield {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _defining_modules(predicate, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for package in packages for path in _modules(package)
                  if predicate(ast.parse(path.read_text(), str(path))))


@pytest.mark.parametrize("literal", ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
                                     "QLinearConv", "MatMulInteger", "QGemm", "DynamicQuantizeLinear"])
def test_shared_literal_is_written_in_one_module(literal: str) -> None:
    assert _defining_modules(lambda tree: literal in _string_constants(tree)) == [FACTS]


def test_provider_short_names_are_listed_in_one_module() -> None:
    from runtime_bench.facts import PROVIDERS

    shorts = set(PROVIDERS)
    listed = _defining_modules(lambda tree: any(shorts <= found for found in _collections(tree)), PACKAGES)
    assert listed == [FACTS]


def test_progress_key_is_written_in_one_module() -> None:
    assert _defining_modules(lambda tree: "minreal_progress" in _string_constants(tree)) == [FACTS]


def test_old_import_paths_still_work() -> None:
    import export.app.cli
    import export.app.pipeline
    from export.cli import main
    from export.pipeline import FAULT_ENV, PipelineConfig
    from export.specs import SpecError, check_input_shape, load_data, load_dataset, load_model

    assert main is export.app.cli.main and PipelineConfig is export.app.pipeline.PipelineConfig
    assert FAULT_ENV and issubclass(SpecError, ValueError)
    assert all(callable(f) for f in (check_input_shape, load_data, load_dataset, load_model))
