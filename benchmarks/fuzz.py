"""Seeded fuzzing of every file minreal reads, through the command that reads it.

Each reader (:data:`READERS`) builds genuine input files once (a template folder), and each case copies the template
into a fresh folder, mutates one file with a seeded mutation (byte flips, truncation, splices, huge declared sizes,
type confusions in JSON and TOML, paths pointing at the file beside the case folders, members of a zip archive
edited, dropped, replaced by a pickle that would run code or by an object ``.npy`` holding that pickle) and runs the
real ``minreal`` command on it in this process (:func:`minreal.app.cli.run`), under an alarm.
A case breaks an invariant (:func:`run_case` lists them in ``broken``) when:

- the exit status is not 0, 1 or 2, or the output holds a raw traceback;
- the command did not end within the time limit (``hang``);
- a file outside the case folder was opened (``read_outside``, :func:`reads_outside`: an audit hook sees every
  ``open`` of Python code; any path under the fuzzing root outside the case folder counts, and any file outside the
  root that existed before the case and is not the interpreter's or a library's; ONNX Runtime reads external data
  in C++, so its cases are fixed ones, :func:`escape_cases`, whose escaping data is valid: reading it would make the
  command succeed);
- a failed command left files behind, or a successful one left staging or temporary files (``partial_output``);
- a forged pickle ran (``code_ran``: its marker file exists);
- the process's peak resident memory grew by more than :data:`MAX_RSS_GROWTH_MB`, or the output tells of an
  allocation that was tried and failed (``MemoryError``, numpy's "Unable to allocate"), whatever the exit status:
  a declared size must be refused before it is allocated (``memory``).

An error line (non-zero exit) that does not name the file (``unnamed``; a model may be named by its stem, as
``bench`` names it) is counted too: every refusal should say which file is at fault. ``check``'s exit 1 with its
``FAILED`` line is a verdict, not an error.

``python benchmarks/fuzz.py --seconds N --seed S --out benchmarks/fuzz.json`` fuzzes the readers in turn for N
seconds and writes the cases and their outcomes by exit status per reader (atomically); the tests run a slice
(:func:`fuzz`) with a fixed seed and small counts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["READERS", "Case", "Outcome", "Reader", "escape_cases", "fuzz", "mutate", "npy_declaring", "npy_object",
           "pickle_payload", "reads_outside", "run_case", "templates"]

TIMEOUT_S = 60
"""Seconds a case may run before it counts as a hang."""
MAX_RSS_GROWTH_MB = 1500
"""Growth of the process's peak resident memory during one case that counts as unbounded."""
CANARY = b"minreal-fuzz-canary-"
"""Start of the file beside each case folder that no case may open (``read_outside``)."""

FACTORY = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def image():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
"""
QUICK_BENCH = ["--min-seconds", "0", "--min-runs", "3", "--warmup", "1", "--repeats", "1", "--batch", "1", "-q"]


# --- mutations ------------------------------------------------------------------------------------------------

HUGE = (10**12, 2**31, 2**63 - 1, -1, 0)
CONFUSIONS: tuple[Any, ...] = (None, "", "x", "../outside/secret", [], {}, [1, "a"], True, -1, 0, 1e308, 10**30,
                               float("nan"), float("inf"), "NaN", {"nested": {"deep": [None]}})
"""Values of another type; ``../outside/secret`` is, from a case folder ``root/case-X/``, the file beside it that no
case may read (:func:`mutate` adds that file's absolute path too)."""


def _flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return b"\x00"
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(max(1, len(data)))]


def _splice(data: bytes, rng: random.Random) -> bytes:
    """A chunk of the file copied over another place of it (or a run of 0x00/0xff bytes inserted)."""
    if len(data) < 4:
        return data + b"\xff" * 8
    a, b = sorted(rng.sample(range(len(data)), 2))
    chunk = data[a:b][:4096] if rng.random() < 0.7 else bytes([rng.choice((0, 0xFF))]) * rng.randint(1, 64)
    at = rng.randrange(len(data))
    return data[:at] + chunk + (data[at + len(chunk):] if rng.random() < 0.5 else data[at:])


def _huge_int(data: bytes, rng: random.Random) -> bytes:
    """A little-endian 4- or 8-byte field somewhere set to a huge or negative value (a declared size)."""
    if len(data) < 8:
        return data
    width, at = rng.choice((4, 8)), rng.randrange(len(data) - 8)
    value = rng.choice(HUGE) % (1 << (8 * width))
    return data[:at] + value.to_bytes(width, "little") + data[at + width:]


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "flip": _flip, "truncate": _truncate, "splice": _splice, "huge_int": _huge_int}


def _confuse(doc: Any, rng: random.Random, lures: tuple[str, ...] = ()) -> Any:
    """``doc`` (parsed JSON/TOML) with one value somewhere replaced by a value of another type (or by one of
    ``lures``, paths no case may read), or one key removed."""
    values = CONFUSIONS + lures
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            paths.append((node, key))
            walk(value)

    walk(doc)
    if not paths:
        return rng.choice(values)
    parent, key = rng.choice(paths)
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[key]
    elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool) and rng.random() < 0.5:
        parent[key] = rng.choice(HUGE) * rng.choice((1, -1))
    else:
        parent[key] = rng.choice(values)
    return doc


def _json(data: bytes, rng: random.Random, lures: tuple[str, ...] = ()) -> tuple[str, bytes]:
    try:
        doc = json.loads(data)
    except ValueError:
        return _bytes(data, rng)
    return "json_confuse", json.dumps(_confuse(doc, rng, lures)).encode()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return '""'  # None has no TOML spelling


def _toml(data: bytes, rng: random.Random, lures: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A ``key = value`` line's value replaced by another type, a line dropped or doubled, or a byte mutation."""
    lines = data.decode(errors="replace").splitlines()
    keyed = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
    roll = rng.random()
    if not keyed or roll < 0.25:
        return _bytes(data, rng)
    i = rng.choice(keyed)
    if roll < 0.8:
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {_toml_value(rng.choice(CONFUSIONS + HUGE + lures))}"
        return "toml_confuse", "\n".join(lines).encode()
    if roll < 0.9:
        del lines[i]
        return "toml_drop", "\n".join(lines).encode()
    lines.insert(i, lines[i])
    return "toml_double", "\n".join(lines).encode()


def _bytes(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    name = rng.choice(sorted(BYTE_MUTATIONS))
    return name, BYTE_MUTATIONS[name](data, rng)


class _Marker:
    """Unpickling this creates the file ``path``: the stand-in for code run from a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return open, (self.path, "w")


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(_Marker(str(marker)), protocol=2)


HUGE_SHAPES = ((10**12,), (2, 10**12), (10**6, 10**6), (2**62, 2), (-1, 64))


def npy_declaring(shape: tuple[int, ...], payload: bytes) -> bytes:
    """An ``.npy`` file whose float32 header declares ``shape`` (a huge size) over the bytes ``payload``."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload


def npy_object(payload: bytes) -> bytes:
    """An ``.npy`` file of one Python object (``dtype=object``), whose data is the pickle ``payload``: reading it with
    ``allow_pickle=True`` runs whatever the pickle says."""
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload


def _member_mutation(name: str, rng: random.Random) -> str:
    """How a zip member called ``name`` is mutated, chosen first (so that every one is reachable for every member):
    dropped, replaced by a pickle, its bytes or JSON mutated; an ``.npy`` member also given a huge declared shape or
    made an object array holding the pickle; a pickle member (``.pkl``, ``.pt``) mostly replaced by the pickle."""
    if name.endswith((".pkl", ".pt")) and rng.random() < 0.7:
        return "member_pickle"
    choices = ["member_dropped", "member_pickle", "member_bytes"]
    if name.endswith(".npy"):
        choices += ["npy_huge_shape", "npy_huge_shape", "npy_object_pickle"]
    if name.endswith(".json"):
        choices += ["member_json", "member_json"]
    return rng.choice(choices)


def _zip(data: bytes, rng: random.Random, marker: Path) -> tuple[str, bytes]:
    """One member of a zip archive (``.npz``, ``.pt2``, ``torch.save``) mutated (:func:`_member_mutation`): dropped,
    given a huge ``.npy`` header, replaced by a pickle that runs code or by an object ``.npy`` holding it; or the
    archive's bytes themselves mutated."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zin:
            members = [(info.filename, zin.read(info)) for info in zin.infolist()]
    except (zipfile.BadZipFile, OSError, ValueError):
        return _bytes(data, rng)
    if not members or rng.random() < 0.3:
        return _bytes(data, rng)
    i = rng.randrange(len(members))
    name, member = members[i]
    how = _member_mutation(name, rng)
    if how == "npy_huge_shape":
        members[i] = (name, npy_declaring(rng.choice(HUGE_SHAPES), member[-64:]))
    elif how == "npy_object_pickle":
        members[i] = (name, npy_object(pickle_payload(marker)))
    elif how == "member_dropped":
        members[i] = (name, None)  # type: ignore[assignment]
    elif how == "member_pickle":
        members[i] = (name, pickle_payload(marker))
    else:
        how, mutated = _json(member, rng) if how == "member_json" else _bytes(member, rng)
        how, members[i] = f"member_{how}", (name, mutated)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zout:
        for n, d in members:
            if d is not None:
                zout.writestr(n, d)
    return how, out.getvalue()


def _onnx_field(data: bytes, rng: random.Random, lures: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """An ONNX model with one field set to what a hostile or damaged file could hold: a huge declared size (a
    tensor's or an input's dimension), external data at a missing or escaping place, an unknown operator or
    opset; or its bytes mutated."""
    import onnx

    try:
        model = onnx.load_from_string(data)
    except Exception:  # not parseable: bytes it is
        return _bytes(data, rng)
    graph = model.graph
    how = rng.choice(("tensor_dims", "input_dim", "external", "op_type", "opset"))
    if how == "tensor_dims" and graph.initializer:
        tensor = rng.choice(graph.initializer)
        tensor.dims[0] = rng.choice((10**12, 2**62, 0))
    elif how == "input_dim" and graph.input:
        dims = graph.input[0].type.tensor_type.shape.dim
        dims[rng.randrange(len(dims))].dim_value = rng.choice((10**12, 2**62))
    elif how == "external" and graph.initializer:
        tensor = rng.choice(graph.initializer)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", rng.choice(("missing.bin", "../outside/secret", ".", *lures))),
                           ("offset", rng.choice(("0", "-1", str(2**62)))), ("length", rng.choice(("40", str(2**62))))):
            tensor.external_data.add(key=key, value=value)
        tensor.ClearField("raw_data")
    elif how == "op_type" and graph.node:
        rng.choice(graph.node).op_type = rng.choice(("NoSuchOp", "", "Loop"))
    else:
        model.opset_import[0].version = rng.choice((0, 10**6))
    return f"onnx_{how}", model.SerializeToString()


def mutate(kind: str, data: bytes, rng: random.Random, marker: Path) -> tuple[str, bytes]:
    """``data`` mutated as a file of ``kind`` (``bytes``, ``json``, ``toml``, ``zip``, ``onnx``, ``image``); the
    mutation's name too. ``marker`` (``root/pwned``) is the file a forged pickle creates; paths put into files point
    at ``root/outside/secret``, relatively from a case folder and absolutely."""
    lures = (str((marker.parent / "outside" / "secret").resolve()),)
    if kind == "onnx" and rng.random() < 0.6:
        return _onnx_field(data, rng, lures)
    if kind == "json" and rng.random() < 0.8:
        return _json(data, rng, lures)
    if kind == "toml":
        return _toml(data, rng, lures)
    if kind == "zip":
        return _zip(data, rng, marker)
    if kind == "image" and rng.random() < 0.5:
        return rng.choice((("not_an_image", b"plain text, not an image\n"), ("empty", b""),
                           ("png_huge", _png_huge(data)), ("truncated", data[: len(data) // 3])))
    return _bytes(data, rng)


def _png_huge(data: bytes) -> bytes:
    """A PNG whose header declares 65535 x 65535 pixels (a decompression bomb) over the genuine image's data."""
    import struct
    import zlib

    if not data.startswith(b"\x89PNG") or len(data) < 33:
        return data
    ihdr = b"IHDR" + struct.pack(">II", 65535, 65535) + data[24:29]
    return data[:8] + data[8:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


# --- readers and their genuine files --------------------------------------------------------------------------

@dataclass(frozen=True)
class Reader:
    """A file minreal reads: ``build`` writes genuine inputs into a folder (once), ``target`` is the file (or the
    folder, whose files are then mutated in turn) the cases mutate, ``kind`` says how, ``args`` the command."""

    name: str
    kind: str
    target: str
    args: tuple[str, ...]
    build: Callable[[Path], None]


def _digits(folder: Path, n: int = 40) -> None:
    rng = np.random.default_rng(0)
    np.savez(folder / "d.npz", x=rng.normal(size=(n, 64)).astype(np.float32), y=rng.integers(0, 10, size=n))


def _net(folder: Path) -> None:
    (folder / "net.py").write_text(FACTORY)


def _load_factory(folder: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"fuzz_net_{abs(hash(folder))}", folder / "net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)()


def _onnx(folder: Path, name: str = "m.onnx") -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(folder / name))
    return folder / name


def _build_npz(folder: Path) -> None:
    _net(folder)
    _digits(folder)


def _build_onnx(folder: Path) -> None:
    _onnx(folder)
    _digits(folder)


def _build_ort(folder: Path) -> None:
    from minreal.export.ort_format import convert_to_ort

    convert_to_ort(_onnx(folder / "..", "src.onnx"), folder / "m.ort")
    (folder / ".." / "src.onnx").unlink()
    for extra in folder.iterdir():
        if extra.name != "m.ort":
            shutil.rmtree(extra) if extra.is_dir() else extra.unlink()


def _build_pt2(folder: Path) -> None:
    import torch

    from minreal.export.serialize import save_program

    _net(folder)
    save_program(_load_factory(folder, "make").eval(), torch.randn(2, 64), folder / "m.pt2")
    (folder / "net.py").unlink()


def _build_weights(folder: Path) -> None:
    import torch

    _build_npz(folder)
    torch.save(_load_factory(folder, "make").state_dict(), folder / "w.pt")


def _build_plan(folder: Path) -> None:
    _build_npz(folder)
    (folder / "p.toml").write_text('[[variant]]\nmethod = "svd"\nlayer_mac_ratio = 0.5\nlabel = "half"\n\n'
                                   '[[variant]]\nmethod = ["magnitude", "svd"]\nmagnitude = { mac_ratio = 0.8 }\n'
                                   'svd = { layer_mac_ratio = 0.5 }\n')


def _build_images(folder: Path) -> None:
    from PIL import Image

    _net(folder)
    rng = np.random.default_rng(0)
    for label in ("a", "b", "c"):
        (folder / "imgs" / label).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 255, size=(10, 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / "imgs" / label / f"{i}.png")


def _report(path: Path) -> dict[str, Any]:
    """A ``minreal bench`` report of :func:`_onnx`'s model against a copy of it, measured for real (once per
    template)."""
    from minreal.app.cli import run

    shutil.copy("m.onnx", "copy.onnx")
    with _quiet():
        code = run(["bench", "m.onnx", "copy.onnx", "--out", str(path), *QUICK_BENCH])
    if code != 0:
        raise RuntimeError(f"bench for the fuzz template failed ({code})")
    return json.loads(path.read_text())


def _build_check(folder: Path) -> None:
    with _cwd(folder):
        _onnx(folder)
        _report(folder / "r.json")
        shutil.copy(folder / "r.json", folder / "base.json")
        for name in ("m.onnx", "copy.onnx", "r.md"):
            (folder / name).unlink(missing_ok=True)


def _build_table(folder: Path) -> None:
    from minreal.app.cli import run

    _build_npz(folder)
    with _cwd(folder), _quiet():
        code = run(["latency-table", "net.py:make", "--data", "d.npz", "--out", "t.json"])
    if code != 0:
        raise RuntimeError(f"latency-table for the fuzz template failed ({code})")
    # the measured layers (the genuine file's layout) with times proportional to the rank, so that the budget is
    # reachable whatever this machine measured for layers this small
    table = json.loads((folder / "t.json").read_text())
    for entry in table["layers"].values():
        entry["keep_ms"] = 1.0
        entry["ms"] = [r / entry["ranks"][-1] for r in entry["ranks"]]
    table["model_ms"] = len(table["layers"]) + 0.1
    (folder / "t.json").write_text(json.dumps(table, indent=1))


def _build_cache(folder: Path) -> None:
    from minreal.app.cli import run

    _build_npz(folder)
    with _cwd(folder), _quiet():
        code = run(["compress", "net.py:make", "-m", "factorize", "--cache-dir", "cache", "--data", "d.npz",
                    "--out", "o.pt2", "-q"])
    (folder / "o.pt2").unlink(missing_ok=True)
    if code != 0 or not any((folder / "cache").rglob("*")):
        raise RuntimeError(f"compress --cache-dir for the fuzz template failed ({code})")




def prepare_from_cache() -> int:
    """What tune does with its prepared-state cache: prepare wanda for ``net.py:make`` on ``d.npz`` with the
    cache in ``cache/``, in the current folder; its exit status as the command line would give it (a damaged
    cache file is a miss, so anything but 0 is a failure)."""
    from minreal.app.commands._shared import load_inputs
    from minreal.compress.registry import prepare

    try:
        net, calib, _ = load_inputs("net.py:make", None, False, "d.npz", None, 0.0)
        prepare(net, calib, "wanda", cache_dir="cache")
    except Exception as exc:  # reported as the command line would, so that the outcome says what went wrong
        print(f"minreal: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def tune_cache_entry() -> int:
    """What tune does with an entry of its cache (``entry/``): read the candidate's result, re-judged against the
    constraint; exit status 0 for a hit or a miss (a damaged entry is computed again), 1 on an error."""
    from types import SimpleNamespace

    from minreal.app.tune import Constraint
    from minreal.app.tune.candidate import CandidateSpec, _from_cache
    from minreal.app.tune.config import Quality

    job = SimpleNamespace(spec=CandidateSpec("svd", 0.5), constraint=Constraint(max_accuracy_drop=5.0),
                          reference=Quality(0.9, None, None), int8=False)
    try:
        _from_cache(Path("entry"), job)  # type: ignore[arg-type]
    except Exception as exc:  # reported as the command line would, so that the outcome says what went wrong
        print(f"minreal: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _build_tune_cache(folder: Path) -> None:
    from minreal.app.tune.candidate import FILES, RESULT_FILE, CandidateResult, CandidateSpec

    (folder / "entry").mkdir()
    result = CandidateResult(CandidateSpec("svd", 0.5), "k", quality={"accuracy": 0.9, "agreement": 0.95},
                             mac_ratio=0.5, param_ratio=0.5, params=100, macs=100, seconds={"realise": 0.1},
                             weights_digest="0" * 24)
    (folder / "entry" / RESULT_FILE).write_text(json.dumps(asdict(result), indent=1))
    for name in (FILES["fp32"], FILES["pt2"]):
        (folder / "entry" / name).write_bytes(b"")


LIBRARY_COMMANDS: dict[str, Callable[[], int]] = {"@prepare": prepare_from_cache, "@tune_cache": tune_cache_entry}
"""Readers no command runs alone (tune does, among much else): their "command" is the library call tune makes."""


def _build_prepared(folder: Path) -> None:
    _build_npz(folder)
    with _cwd(folder), _quiet():
        code = prepare_from_cache()
    if code != 0 or not any(p.is_file() for p in (folder / "cache").rglob("*")):
        raise RuntimeError(f"the prepared-state cache for the fuzz template was not written ({code})")


COMPRESS = ("compress", "net.py:make", "-m", "svd", "--data", "d.npz", "--out", "o.pt2", "-q")
READERS: dict[str, Reader] = {r.name: r for r in (
    Reader("npz", "zip", "d.npz", COMPRESS, _build_npz),
    Reader("onnx", "onnx", "m.onnx", ("bench", "m.onnx", "--data", "d.npz", "--out", "b.json", *QUICK_BENCH),
           _build_onnx),
    Reader("ort", "bytes", "m.ort", ("bench", "m.ort", "--out", "b.json", *QUICK_BENCH), _build_ort),
    Reader("pt2", "zip", "m.pt2", ("export", "m.pt2", "--input-shape", "64", "--out", "e.onnx", "-q"), _build_pt2),
    Reader("weights", "zip", "w.pt", (*COMPRESS, "--weights", "w.pt"), _build_weights),
    Reader("plan", "toml", "p.toml", ("tune", "net.py:make", "--plan", "p.toml", "--data", "d.npz", "--dry-run",
                                      "--max-accuracy-drop", "5", "--out", "t", "-q"), _build_plan),
    Reader("images", "image", "imgs", ("compress", "net.py:image", "-m", "svd", "--data", "imgs", "--image-size", "8",
                                       "--out", "o.pt2", "-q"), _build_images),
    Reader("report", "json", "r.json", ("check", "r.json", "--max-latency-ratio", "2", "-q"), _build_check),
    Reader("baseline", "json", "base.json", ("check", "r.json", "--baseline", "base.json", "--max-regression", "50",
                                             "--allow-hardware-mismatch", "-q"), _build_check),
    Reader("latency_table", "json", "t.json", ("compress", "net.py:make", "-m", "factorize", "--latency-table",
                                               "t.json", "--latency-ratio", "0.8", "--data", "d.npz", "--out",
                                               "o.pt2", "-q"), _build_table),
    Reader("factorize_cache", "zip", "cache", ("compress", "net.py:make", "-m", "factorize", "--cache-dir", "cache",
                                               "--data", "d.npz", "--out", "o.pt2", "-q"), _build_cache),
    Reader("prepared_cache", "zip", "cache", ("@prepare",), _build_prepared),
    Reader("tune_cache", "json", "entry/result.json", ("@tune_cache",), _build_tune_cache),
)}


@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _quiet() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def templates(root: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Genuine inputs of each reader in ``names`` (all by default), one folder each under ``root``."""
    made = {}
    for name in names or list(READERS):
        folder = root / "templates" / name
        folder.mkdir(parents=True, exist_ok=True)
        READERS[name].build(folder)
        made[name] = folder
    return made


# --- running one case -----------------------------------------------------------------------------------------

@dataclass
class Case:
    """One command on one set of files: ``files`` maps names under the case folder to their bytes (the template's,
    with the mutated one replaced); ``links`` maps names to symbolic-link targets."""

    reader: str
    mutation: str
    args: tuple[str, ...]
    files: dict[str, bytes]
    target: str
    links: dict[str, str] = field(default_factory=dict)
    must_fail: bool = False
    """True for cases whose success would mean a file outside the folder was read (escape cases)."""


@dataclass
class Outcome:
    reader: str
    mutation: str
    target: str
    code: int
    seconds: float
    line: str
    broken: list[str]
    unnamed: bool


class _Hang(SystemExit):
    """Raised by the alarm: the case ran past its time limit."""


class _Opens:
    """Paths opened by Python code while ``armed`` (an audit hook cannot be removed, so one is installed once)."""

    armed = False
    seen: list[str] = []  # the hook's one sink, read and cleared by run_case

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.armed and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.seen.append(os.path.join(os.getcwd(), os.fsdecode(args[0])))  # relative to the case folder


_HOOKED: list[bool] = []


def _install_hook() -> None:
    if not _HOOKED:
        sys.addaudithook(_Opens.hook)
        _HOOKED.append(True)


def _template_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _materialise(case: Case, folder: Path) -> None:
    for name, data in case.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for name, target in case.links.items():
        (folder / name).symlink_to(target)


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _staging(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(part.startswith(".") and (".tmp" in part or "staging" in part)
                                          for part in Path(n).parts))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Records(logging.Handler):
    """Log records of one case, formatted with their tracebacks (a logged traceback breaks the invariant too)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _raise_hang(*_: object) -> None:
    raise _Hang(124)


def _execute(case: Case, folder: Path, timeout_s: float) -> tuple[int, str, str]:
    """Run the case's command in ``folder`` under an alarm (the alarm of whoever called, such as pytest-timeout's,
    is put back after); its exit status (124 for a hang), stdout with the log records, and stderr."""
    from minreal.app.cli import run

    previous = signal.signal(signal.SIGALRM, _raise_hang)
    start = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    records = _Records()
    logging.getLogger().addHandler(records)
    with _cwd(folder), _quiet() as (out, err):
        _Opens.armed = True
        try:
            library = LIBRARY_COMMANDS.get(case.args[0])
            code = library() if library is not None else run(list(case.args))
        except _Hang:
            code = 124
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _Opens.armed = False
    logging.getLogger().removeHandler(records)
    signal.signal(signal.SIGALRM, previous)
    if outer:
        signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))
    return code, out.getvalue() + "\n".join(records.lines), err.getvalue()


SYSTEM_FILES = ("/etc/os-release", "/etc/mime.types", "/etc/localtime", "/etc/passwd", "/etc/nsswitch.conf",
                "/etc/hosts", "/etc/resolv.conf", "/etc/ld.so.cache", "/etc/timezone")
"""Files under ``/etc`` that Python's and its libraries' own code may read (platform, mimetypes, time zones, name
lookup); any other file there (``/etc/hostname``) is outside what a case names."""


def _library_dirs() -> tuple[str, ...]:
    """Real paths of the folders whose files the interpreter and its libraries read whatever the user names: Python's
    prefixes and import path, the project's source, the system's (``/usr``, ``/lib*``, ``/proc``, ``/sys``, ``/dev``,
    ``/opt``; of ``/etc`` only :data:`SYSTEM_FILES`) and the user's cache and configuration folders (library caches,
    minreal's tune cache)."""
    home = Path.home()
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, str(Path(__file__).resolve().parents[1]),
            "/usr", "/lib", "/lib32", "/lib64", "/proc", "/sys", "/dev", "/opt", *SYSTEM_FILES,
            os.environ.get("XDG_CACHE_HOME") or str(home / ".cache"),
            os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")}
    return tuple(os.path.realpath(d) for d in dirs if d)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def reads_outside(opened: list[str], root: Path, folder: Path, since: float) -> list[str]:
    """The real paths among ``opened`` that a case in ``folder`` (under ``root``) had no business opening: any under
    ``root`` but outside ``folder`` (the file beside the case folders, the templates, the marker); and any regular
    file outside ``root`` that existed before the case (``since``, a ``time.time()``) and lies in none of
    :func:`_library_dirs` (the tool's own temporary files are newer; those of the interpreter are there)."""
    root_real, folder_real, libraries = os.path.realpath(root), os.path.realpath(folder), _library_dirs()
    out = []
    for path in dict.fromkeys(os.path.realpath(p) for p in opened):
        if _under(path, root_real):
            if not _under(path, folder_real):
                out.append(path)
        elif (os.path.isfile(path) and os.stat(path).st_mtime < since and os.stat(path).st_ctime < since
              and not any(_under(path, d) for d in libraries)):
            out.append(path)
    return out


MEMORY_ERRORS = ("MemoryError", "Unable to allocate")
"""What an allocation that was tried and failed prints (numpy's, Python's): a size not bounded before allocating."""


def _broken(case: Case, root: Path, code: int, text: str, new: set[str], rss_growth_mb: float,
            outside: Sequence[str] = ()) -> list[str]:
    """The invariants the case broke (see the module's docstring); ``new``: paths the command left in its folder;
    ``outside``: paths it opened outside what it was given (:func:`reads_outside`)."""
    broken = []
    if code not in (0, 1, 2):
        broken.append("hang" if code == 124 else f"exit_{code}")
    if "Traceback" in text:
        broken.append("traceback")
    if outside or CANARY in text.encode() or (case.must_fail and code == 0):
        broken.append("read_outside")
    if (code != 0 and new) or _staging(new):
        broken.append("partial_output")
    if (root / "pwned").exists():
        broken.append("code_ran")
        (root / "pwned").unlink()
    if rss_growth_mb > MAX_RSS_GROWTH_MB or any(m in text for m in MEMORY_ERRORS):
        broken.append("memory")
    return broken


def run_case(case: Case, root: Path, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Run ``case`` in a fresh folder under ``root`` (beside a canary file no case may open) and check the
    invariants (see the module's docstring)."""
    _install_hook()
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    _materialise(case, folder)
    since = time.time() - 1.0  # files outside root older than this existed before the case (mtime granularity)
    before, rss, start = _listing(folder), _peak_rss_mb(), time.perf_counter()
    _Opens.seen.clear()
    code, out, err = _execute(case, folder, timeout_s)
    seconds = time.perf_counter() - start
    outside = reads_outside(_Opens.seen, root, folder, since)
    broken = _broken(case, root, code, out + err, _listing(folder) - before, _peak_rss_mb() - rss, outside)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    line = lines[-1] if code != 0 and lines else ""
    target = Path(case.target)
    named = target.name in line or f"'{target.stem}'" in line  # bench names models by their stem
    unnamed = code != 0 and "error:" in line and not named  # check's "FAILED ..." (exit 1) is a verdict
    shutil.rmtree(folder, ignore_errors=True)
    return Outcome(case.reader, case.mutation, case.target, code, round(seconds, 3), line[:300], broken, unnamed)


def mutated_case(reader: Reader, template: Path, rng: random.Random, marker: Path) -> Case:
    """A case of ``reader``: its template with the target (or, for a folder, one file under it) mutated."""
    files = _template_files(template)
    target = reader.target
    if (template / target).is_dir():
        target = rng.choice(sorted(n for n in files if n.startswith(target + "/")))
    kind = "zip" if reader.kind == "zip" and zipfile.is_zipfile(io.BytesIO(files[target])) else reader.kind
    how, files[target] = mutate(kind, files[target], rng, marker)
    return Case(reader.name, how, reader.args, files, target)


# --- external data that escapes the model's folder ------------------------------------------------------------

def _external_model(location: str) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = onnx.TensorProto(name="w", dims=[64, 10], data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", str(64 * 10 * 4))):
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [w, numpy_helper.from_array(np.zeros(10, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def escape_cases(root: Path) -> list[Case]:
    """``.onnx`` files whose external data lies outside their folder, by a relative ``location``, an absolute one,
    and a symbolic link in the folder: each must be refused (the data outside is valid, so reading it would make
    the command succeed). The first command of each reads a model in ``models/`` of the case folder."""
    secret = (root / "outside" / "secret").resolve()
    args = ("bench", "models/m.onnx", "--out", "b.json", *QUICK_BENCH)
    named = {"relative": "../../outside/secret", "absolute": str(secret), "symlink": "w.bin"}
    cases = []
    for how, location in named.items():
        links = {"models/w.bin": str(secret)} if how == "symlink" else {}
        depth = "../../../outside/secret"  # case-XXX/models/m.onnx -> root/outside/secret
        loc = depth if how == "relative" else location
        cases.append(Case("onnx_external", f"escape_{how}", args, {"models/m.onnx": _external_model(loc)},
                          "models/m.onnx", links, must_fail=True))
    return cases


def _canary(root: Path) -> None:
    """The file outside every case folder: valid weights for :func:`_external_model`, starting with the canary."""
    (root / "outside").mkdir(exist_ok=True)
    data = np.frombuffer(CANARY.ljust(64 * 10 * 4, b"\x01"), np.uint8).tobytes()
    (root / "outside" / "secret").write_bytes(data)


# --- the loop ---------------------------------------------------------------------------------------------------

def fuzz(root: Path, seed: int, cases_per_reader: int | None = None, seconds: float | None = None,
         readers: list[str] | None = None, say: Callable[[str], None] = lambda _: None) -> list[Outcome]:
    """Fuzz ``readers`` (all by default) in turn, from ``seed``: ``cases_per_reader`` each, or until ``seconds``
    have passed; the escape cases first. Work happens under ``root``."""
    _canary(root)
    names = readers or list(READERS)
    made = templates(root, names)
    rng = random.Random(seed)
    outcomes = [run_case(c, root) for c in escape_cases(root)]
    deadline = None if seconds is None else time.monotonic() + seconds
    done = 0
    while (cases_per_reader is None or done < cases_per_reader) and (deadline is None or time.monotonic() < deadline):
        for name in names:
            case = mutated_case(READERS[name], made[name], rng, root / "pwned")
            outcome = run_case(case, root)
            outcomes.append(outcome)
            if outcome.broken or outcome.unnamed:
                say(f"{name} {outcome.mutation} exit {outcome.code} {outcome.broken} {outcome.line}")
            if deadline is not None and time.monotonic() >= deadline:
                break
        done += 1
    return outcomes


def summary(outcomes: list[Outcome], seed: int, seconds: float) -> dict[str, Any]:
    """Cases and outcomes by exit status per reader, and every case that broke an invariant or named no file."""
    by_reader: dict[str, Any] = {}
    for o in outcomes:
        entry = by_reader.setdefault(o.reader, {"cases": 0, "by_exit": {}, "by_mutation": {}, "broken": 0,
                                                "unnamed": 0})
        entry["cases"] += 1
        entry["by_exit"][str(o.code)] = entry["by_exit"].get(str(o.code), 0) + 1
        entry["by_mutation"][o.mutation] = entry["by_mutation"].get(o.mutation, 0) + 1
        entry["broken"] += bool(o.broken)
        entry["unnamed"] += o.unnamed
    return {"seed": seed, "seconds": round(seconds, 1), "cases": len(outcomes), "readers": by_reader,
            "broken": [asdict(o) for o in outcomes if o.broken],
            "unnamed": [asdict(o) for o in outcomes if o.unnamed][:50]}


USAGE = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/fuzz.py --seconds 480 --seed 0 --out benchmarks/fuzz.json"


def _commit() -> str:
    """The commit this run's code is at (a working tree with changes is marked ``+dirty``)."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reader", action="append", choices=sorted(READERS), help="only these (repeat)")
    parser.add_argument("--out", default="benchmarks/fuzz.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from _common import write_json

    out = Path(args.out).resolve()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minreal-fuzz-") as tmp:
        outcomes = fuzz(Path(tmp), args.seed, seconds=args.seconds, readers=args.reader,
                        say=lambda line: print(line, file=sys.stderr, flush=True))
    document = {"usage": USAGE, "issue": 45, "commit": _commit(),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **summary(outcomes, args.seed, time.monotonic() - start)}
    write_json(out, document)
    print(f"{document['cases']} cases, {len(document['broken'])} broke an invariant, "
          f"{sum(r['unnamed'] for r in document['readers'].values())} named no file; wrote {out}")


if __name__ == "__main__":
    main()
