"""Static facts about ONNX files: size, node count, and op types of the optimised graph."""

from __future__ import annotations

import functools
import hashlib
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from minreal.facts import INT8_TARGET_KEY, INTEGER_OPS

from .errors import ModelFileError, ProviderUnavailableError
from .inputs import ORT_SUFFIX, external_tensors, load_model_proto
from .providers import provider_mismatch, provider_name
from .sessions import create_session

__all__ = ["ModelInfo", "model_info", "model_files", "files_sha256", "gzip_bytes", "GZIP_LEVEL", "count_nodes",
           "op_counts", "optimized_graph_ops", "optimized_graph", "float_roundtrips", "float_roundtrip_nodes",
           "INTEGER_OP_TYPES"]

GZIP_LEVEL = 6
"""zlib level of :func:`gzip_bytes` (gzip's and zlib's default): the compression an app store or an OTA update
applies is about this, not ``-9``."""

#: Op types that execute integer kernels (ONNX and com.microsoft contrib ops); one set project-wide.
INTEGER_OP_TYPES: frozenset[str] = INTEGER_OPS


@dataclass(frozen=True)
class ModelInfo:
    """Facts about one model file."""

    name: str
    path: str
    file_size_bytes: int
    node_count: int | None
    """Nodes of the ONNX graph; None for an ORT-format file (``.ort``), whose graph the onnx package cannot read."""
    opset: int | None
    gzip_bytes: int = 0
    """The graph and its external data files compressed (:func:`gzip_bytes`): what the model adds to a download."""
    int8_target: str | None = None
    """The INT8 target a minreal INT8 file names in its metadata (:data:`minreal.facts.INT8_TARGET_KEY`); an
    ``arm64`` file runs ONNX Runtime's ARM graph in every session (``sessions.create_session``)."""


def model_info(name: str, path: Path) -> ModelInfo:
    """Read size, node count and default-domain opset of the model at ``path`` (of an ``.ort`` file: its size)."""
    path = Path(path)
    if path.suffix == ORT_SUFFIX:
        if not path.is_file():
            raise ModelFileError(f"model file not found: {path}")
        return ModelInfo(name, str(path), path.stat().st_size, None, None, gzip_bytes([path]))
    model = load_model_proto(path)
    opsets = {o.domain: o.version for o in model.opset_import}
    return ModelInfo(
        name=name,
        path=str(path),
        file_size_bytes=_size_with_data(model, path),
        node_count=sum(op_counts(model.graph).values()),
        opset=opsets.get("", opsets.get("ai.onnx")),
        gzip_bytes=gzip_bytes(model_files(path, model)),
        int8_target=next((p.value for p in model.metadata_props if p.key == INT8_TARGET_KEY), None),
    )


def model_files(path: Path, model: onnx.ModelProto | None = None) -> list[Path]:
    """The graph file at ``path`` and every external data file it names that exists (each once)."""
    path = Path(path)
    if path.suffix == ORT_SUFFIX:  # an .ort file (flatbuffers) has no external data
        return [path]
    model = load_model_proto(path) if model is None else model
    locations = {next((e.value for e in t.external_data if e.key == "location"), "") for t in external_tensors(model)}
    return [path, *sorted(path.parent / loc for loc in locations if loc and (path.parent / loc).is_file())]


def files_sha256(path: Path) -> str:
    """SHA-256 (hex) of a model's bytes: its graph file and every external data file it names (:func:`model_files`),
    read 1 MiB at a time."""
    h = hashlib.sha256()
    for part in model_files(Path(path)):
        with open(part, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def gzip_bytes(paths: Iterable[str | Path], chunk: int = 1 << 20) -> int:
    """Bytes of the deflate stream (gzip's payload, level :data:`GZIP_LEVEL`) of the files' contents one after
    another, streamed in ``chunk``-byte pieces (no file is held in memory whole). gzip's own header and trailer add
    18 bytes more; weights compress little, a graph of repeated small ops much. Remembered per process by each
    file's path, size and modification time (export, bench and tune each ask; deflate runs at about 20 MB/s)."""
    files = tuple((str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in paths)
    return _gzip_bytes(files, chunk)


@functools.lru_cache(maxsize=256)
def _gzip_bytes(files: tuple[tuple[str, int, int], ...], chunk: int) -> int:
    comp, total = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS), 0  # raw deflate, as in gzip
    for path, _, _ in files:
        with open(path, "rb") as fh:
            while block := fh.read(chunk):
                total += len(comp.compress(block))
    return total + len(comp.flush())


def _size_with_data(model: onnx.ModelProto, path: Path) -> int:
    """Bytes of the graph file plus every external data file it names (each counted once)."""
    return sum(f.stat().st_size for f in model_files(path, model))


def count_nodes(path: Path) -> int:
    """Number of nodes in the model at ``path``, including nodes of nested subgraphs."""
    return sum(op_counts(load_model_proto(path).graph).values())


def op_counts(graph: onnx.GraphProto) -> Counter[str]:
    """Count nodes by op type, recursing into subgraphs (If/Loop/Scan bodies)."""
    counts: Counter[str] = Counter()
    for node in graph.node:
        counts[node.op_type] += 1
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                counts.update(op_counts(sub))
    return counts


def float_roundtrip_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes that run in float between a DequantizeLinear and a QuantizeLinear of an (optimised) QDQ graph, in graph
    order: each takes a quantised tensor back to float and re-quantises after, pure overhead where the op has no
    integer kernel (e.g. Pad, ConvTranspose, a Conv whose weights the graph computes)."""
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    found = []
    for n in graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        fed = any(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input)
        feeds = any(c.op_type == "QuantizeLinear" for o in n.output for c in consumers.get(o, []))
        if fed and feeds:
            found.append(n)
    return found


def float_roundtrips(graph: onnx.GraphProto) -> dict[str, int]:
    """:func:`float_roundtrip_nodes` counted by op type, most frequent first."""
    return dict(Counter(n.op_type for n in float_roundtrip_nodes(graph)).most_common())


def optimized_graph_ops(path: Path, provider: str = "cpu", threads: int = 1) -> dict[str, int]:
    """Op-type counts of the graph onnxruntime actually runs after its optimisations (:func:`optimized_graph`).
    Count integer kernels with ``sum(n for op, n in ops.items() if op in INTEGER_OP_TYPES)``."""
    return dict(op_counts(optimized_graph(path, provider, threads)))


def optimized_graph(path: Path, provider: str = "cpu", threads: int = 1,
                    config: Mapping[str, str] | None = None) -> onnx.GraphProto:
    """The graph onnxruntime actually runs after its optimisations: a session is created with
    ``optimized_model_filepath`` set and the written graph is read back.

    Raises
    ------
    ProviderUnavailableError
        the session does not run on ``provider``.

    Parameters
    ----------
    path : Path
        ONNX model file.
    provider : str
        Provider short name (``"cpu"``, ``"cuda"``, ...).
    threads : int
        Intra-op threads for the temporary session.
    config : Mapping[str, str] | None
        More session config entries, e.g. ``{"session.qdqisint8allowed": "1"}`` for the graph ONNX Runtime
        builds for an ARM CPU (:data:`minreal.runtime_bench.cpu.ARM_GRAPH_CONFIG`).
    """
    with tempfile.TemporaryDirectory(prefix="minreal-opt-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        full = provider_name(provider)
        session = create_session(Path(path), full, threads, optimized_model_path=optimized, config=config)
        mismatch = provider_mismatch(full, session.get_providers())
        if mismatch is not None:
            raise ProviderUnavailableError(f"{path}: {mismatch}")
        return load_model_proto(optimized).graph
