"""ONNX files whose weights may live beside the graph (ONNX external data), written, copied and moved as one unit.

One protobuf holds at most 2 GiB, so a larger model is a graph file ``NAME.onnx`` whose tensors keep their bytes
in one data file beside it, ``NAME.onnx.data`` (the name the torch.export-based exporter gives it), named in the
graph by that relative ``location``. Graph and data are published together (:func:`staged_onnx`): written in a
temporary folder beside the destination under their final names, then the data file is moved in first and the
graph last, so a graph never points at missing data. A graph being replaced is set aside (with its
``NAME.onnx.data``) before the new data arrives, so no reader pairs one graph with another's data; if publishing
fails, the new files are removed and the old ones put back.

Nothing here loads a model's weights into memory: graphs are read with ``load_external_data=False`` and data
files are renamed, hard-linked or copied in chunks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx.external_data_helper import ExternalDataInfo

from minreal.export.atomic import ensure_distinct
from minreal.export.errors import SameFileError
from minreal.runtime_bench.atomic import OutputWriteError, write_error
from minreal.runtime_bench.inputs import external_tensors, load_model_proto

__all__ = ["DATA_SUFFIX", "PROTOBUF_LIMIT", "copy_onnx", "data_file_name", "data_files", "externalize",
           "has_external_data", "iter_nodes", "move_onnx", "onnx_size", "staged_onnx"]

logger = logging.getLogger(__name__)


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs (If branches, Loop and Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from iter_nodes(sub)

DATA_SUFFIX = ".data"
"""Suffix of a graph's data file: ``model.onnx`` keeps its external tensors in ``model.onnx.data``."""

PROTOBUF_LIMIT = 2**31
"""Bytes one protobuf message (one ONNX file without external data) can hold."""

_ALIGN = 4096
_CHUNK = 64 * 2**20


def data_file_name(graph: str | os.PathLike[str]) -> str:
    """Name of the data file beside ``graph``: ``model.onnx`` → ``model.onnx.data``."""
    return Path(graph).name + DATA_SUFFIX


def _location(tensor: onnx.TensorProto) -> str:
    return ExternalDataInfo(tensor).location


def _referenced(model: onnx.ModelProto, folder: Path) -> list[Path]:
    """Distinct data files the graph names, in order of first use, resolved in ``folder``."""
    return list(dict.fromkeys(folder / _location(t) for t in external_tensors(model)))


def data_files(path: str | os.PathLike[str]) -> list[Path]:
    """The external data files the graph at ``path`` names (empty when its weights are embedded).

    Only the graph is read. Raises :class:`minreal.runtime_bench.errors.ModelFileError` for a missing or unreadable file
    or a location outside the graph's folder.
    """
    path = Path(path)
    return _referenced(load_model_proto(path), path.parent)


def has_external_data(path: str | os.PathLike[str]) -> bool:
    """Whether the graph at ``path`` keeps tensors in external data files."""
    return bool(data_files(path))


def onnx_size(path: str | os.PathLike[str]) -> int:
    """Bytes of the graph at ``path`` plus its external data files."""
    path = Path(path)
    return path.stat().st_size + sum(f.stat().st_size for f in data_files(path))


def externalize(path: str | os.PathLike[str]) -> None:
    """Rewrite a graph with embedded weights (under 2 GiB) in place so its tensors live in ``NAME.onnx.data``.

    Tensors under 1 KiB stay in the graph (``onnx.save_model``'s threshold). Meant for a staged file
    (:func:`staged_onnx`); the rewrite itself is not atomic.
    """
    path = Path(path)
    model = onnx.load(str(path))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_file_name(path))


def _copy_range(src: Path, offset: int, length: int, dst: BinaryIO) -> None:
    """Append ``length`` bytes of ``src`` from ``offset`` to the open file ``dst``, in chunks."""
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(left, _CHUNK))
            if not chunk:
                raise ValueError(f"external data file {src.name} ends before offset {offset} + length {length}")
            dst.write(chunk)
            left -= len(chunk)


def _gather(model: onnx.ModelProto, folder: Path, out: Path) -> None:
    """Copy every external tensor's bytes from the files in ``folder`` into ``out`` (4 KiB-aligned offsets) and
    point the graph's tensors there."""
    with open(out, "wb") as dst:
        for tensor in external_tensors(model):
            info = ExternalDataInfo(tensor)
            src = folder / info.location
            offset = info.offset or 0
            length = info.length if info.length is not None else src.stat().st_size - offset
            dst.write(b"\0" * (-dst.tell() % _ALIGN))
            start = dst.tell()
            _copy_range(src, offset, length, dst)
            del tensor.external_data[:]
            for key, value in (("location", out.name), ("offset", start), ("length", length)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)


def _relocate(model: onnx.ModelProto, name: str) -> None:
    """Point every external tensor of ``model`` at the data file ``name`` (offsets and lengths unchanged)."""
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = name


def _one_data_file(graph: Path) -> Path | None:
    """Make the staged ``graph`` keep all its external tensors in ``graph.data`` (rewritten only when the writer
    used other files, e.g. the TorchScript exporter's file per tensor); return that file, or ``None``."""
    model = load_model_proto(graph)
    files = _referenced(model, graph.parent)
    target = graph.with_name(data_file_name(graph))
    if files in ([], [target]):
        return target if files else None
    gathered = graph.with_name(f".{target.name}.gathered")
    _gather(model, graph.parent, gathered)
    os.replace(gathered, target)
    onnx.save_model(model, str(graph))
    logger.debug("gathered %d external data files of %s into %s", len(files), graph.name, target.name)
    return target


@contextlib.contextmanager
def staged_onnx(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield ``path``'s name in a temporary folder beside it; publish the graph and its data when the block succeeds.

    Whatever the block writes there is published as ``path`` plus, when the graph has external data,
    ``path.data`` (its tensors gathered into that one file if the writer used others). The data file is moved in
    before the graph; an existing ``path`` (and its ``path.data``) is set aside first and put back if publishing
    fails. If the block raises, nothing is published and the temporary folder is removed.

    Raises
    ------
    OutputWriteError
        the temporary folder or a move failed for lack of permission or space; names ``path``.
    """
    final = Path(path)
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    except OSError as exc:
        raise write_error(final, exc) from exc
    try:
        staged = work / final.name
        yield staged
        try:
            _publish(staged, final, _one_data_file(staged), work)
        except OutputWriteError:
            raise
        except OSError as exc:
            raise write_error(final, exc) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish(staged: Path, final: Path, data: Path | None, work: Path) -> None:
    """Set the old graph and data aside, move the new data in, then the graph; undo all on failure."""
    old = [p for p in (final, final.with_name(data_file_name(final))) if p.exists()]
    aside: list[tuple[Path, Path]] = []
    moved: list[Path] = []
    try:
        for p in old:  # the graph first: a reader never sees it without its data
            aside.append((p, work / f".old{len(aside)}{p.suffix}"))
            os.replace(p, aside[-1][1])
        if data is not None:
            moved.append(final.with_name(data.name))
            os.replace(data, moved[-1])
        os.replace(staged, final)
    except BaseException:
        for p in moved:
            p.unlink(missing_ok=True)
        for p, kept in reversed(aside):
            os.replace(kept, p)
        raise
    logger.debug("published %s%s", final, f" with {data.name}" if data else "")


def _check_sources(src: Path, dst: Path, files: list[Path]) -> None:
    """Refuse a destination (graph or data file) that is the source graph or one of its data files."""
    ensure_distinct(src, dst)
    taken = {f.resolve() for f in (src, *files)}
    for out in (dst, dst.with_name(data_file_name(dst))):
        if out.resolve() in taken:
            raise SameFileError(f"output {out} is a file of the input model {src}; choose a different output path")


def _stage_copy(src: Path, staged: Path, files: list[Path], link: bool) -> None:
    """Write ``src`` (graph and data) at ``staged``: data hard-linked (``link``, when the file system allows) or
    copied, then re-pointed at ``staged.data``; several data files are gathered into one."""
    place = _link_or_copy if link else shutil.copyfile
    target = staged.with_name(data_file_name(staged))
    if not files:
        place(src, staged)
        return
    model = load_model_proto(src)
    if len(files) == 1:
        place(files[0], target)
        _relocate(model, target.name)
    else:
        _gather(model, src.parent, target)
    onnx.save_model(model, str(staged))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def copy_onnx(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy an ONNX file and its external data to ``dst`` (data in ``dst.data``), published atomically.

    Raises
    ------
    SameFileError
        ``dst`` (or ``dst.data``) is the input graph or one of its data files.
    ModelFileError
        ``src`` is missing, unreadable, or names data outside its folder.
    """
    src, dst = Path(src), Path(dst)
    files = data_files(src)
    _check_sources(src, dst, files)
    with staged_onnx(dst) as staged:
        _stage_copy(src, staged, files, link=False)
    return dst


def move_onnx(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Move an ONNX file and its external data to ``dst`` (data in ``dst.data``), published atomically.

    Data files are hard-linked where the file system allows (no copy); the source files are removed, graph
    first, only once ``dst`` is complete. Raises as :func:`copy_onnx`.
    """
    src, dst = Path(src), Path(dst)
    files = data_files(src)
    _check_sources(src, dst, files)
    with staged_onnx(dst) as staged:
        _stage_copy(src, staged, files, link=True)
    for f in (src, *files):
        f.unlink(missing_ok=True)
    return dst
