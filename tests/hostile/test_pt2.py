"""Forged .pt2 archives: no unpickling without --trust-pickle, whatever the archive's bytes or configs say."""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.app.cli import main
from minreal.app.models import load_model
from minreal.export.pickle_guard import UnpicklingRefused, no_unpickling
from minreal.export.serialize import save_program

WEIGHTS_CONFIG = "m/data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "m/data/constants/model_constants_config.json"
SAMPLE_INPUTS = "m/data/sample_inputs/model.pt"


class _Touch:
    """Unpickling this creates ``path``: the stand-in for arbitrary code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return open, (self.path, "w")


def _payload(marker: Path, protocol: int) -> bytes:
    return pickle.dumps(_Touch(marker), protocol=protocol)


@pytest.fixture
def genuine(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "m.pt2"  # torch names the archive's top folder after the file: "m/"
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), path)
    return path


def _rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None],
             extra: dict[str, bytes] | None = None) -> Path:
    """Copy the archive member by member through ``edit`` (None drops a member), then add ``extra``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in (extra or {}).items():
            zout.writestr(name, data)
    return dst


def _pickled_weight(src: Path, dst: Path, payload: bytes, decoy: bool) -> Path:
    """weight_0 becomes a pickle the real config declares ``use_pickle``; a decoy config may call it raw."""
    def edit(name: str, data: bytes) -> bytes:
        if name == WEIGHTS_CONFIG:
            config = json.loads(data)
            config["config"]["0.weight"]["use_pickle"] = True
            return json.dumps(config).encode()
        return payload if name == "m/data/weights/weight_0" else data

    decoy_config = {"config": {"0.weight": {"path_name": "weight_0", "use_pickle": False}}}
    extra = {"m/data/weights/decoy_weights_config.json": json.dumps(decoy_config).encode()} if decoy else None
    return _rewrite(src, dst, edit, extra)


def _custom_object(src: Path, dst: Path, payload: bytes, prefix: str) -> Path:
    """A custom-object constant (unpickled by torch with ``_pickle_load_obj`` or ``pickle.loads``)."""
    def edit(name: str, data: bytes) -> bytes:
        if name == CONSTANTS_CONFIG:
            return json.dumps({"config": {"evil": {"path_name": f"{prefix}0", "use_pickle": True}}}).encode()
        return data

    return _rewrite(src, dst, edit, {f"m/data/constants/{prefix}0": payload})


FORGERIES = {
    **{f"sample_inputs_protocol_{p}": (lambda s, d, pl: _rewrite(s, d, lambda n, b: pl if n == SAMPLE_INPUTS else b), p)
       for p in (0, 1, 2, 4)},
    **{f"pickled_weight_protocol_{p}": (lambda s, d, pl: _pickled_weight(s, d, pl, decoy=False), p) for p in (0, 1)},
    "pickled_weight_with_decoy_config": (lambda s, d, pl: _pickled_weight(s, d, pl, decoy=True), 0),
    "custom_obj_constant": (lambda s, d, pl: _custom_object(s, d, pl, "custom_obj_"), 2),
    "opaque_obj_constant": (lambda s, d, pl: _custom_object(s, d, pl, "opaque_obj_"), 0),
}


def test_payload_really_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The forgeries below are meaningful: a plain unpickle of the payload does create the marker."""
    for protocol in (0, 1, 2, 4):
        marker = tmp_path / f"ran-{protocol}"
        pickle.loads(_payload(marker, protocol))
        assert marker.exists()


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_forged_archive_is_refused_and_runs_no_code(kind: str, genuine: Path, tmp_path: Path) -> None:
    forge, protocol = FORGERIES[kind]
    marker = tmp_path / "pwned"
    evil = forge(genuine, tmp_path / "evil.pt2", _payload(marker, protocol))
    with pytest.raises(SpecError) as info:
        load_model(str(evil))
    message = str(info.value)
    assert "evil.pt2" in message and "--trust-pickle" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("command", [
    ["compress", "{evil}", "-m", "svd", "--data", "{data}", "--out", "{tmp}/o.pt2"],
    ["export", "{evil}", "--data", "{data}", "--out", "{tmp}/o.onnx"],
    ["run", "{evil}", "-m", "svd", "--data", "{data}", "--out", "{tmp}/run"],
])
def test_cli_refuses_forged_archive(command: list[str], genuine: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    marker = tmp_path / "pwned"
    evil = _rewrite(genuine, tmp_path / "evil.pt2",
                    lambda n, b: _payload(marker, 0) if n == SAMPLE_INPUTS else b)
    data = tmp_path / "d.npz"
    import numpy as np

    np.savez(data, x=np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32))
    args = [a.format(evil=evil, data=data, tmp=tmp_path) for a in command]
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2
    assert "evil.pt2" in err and "--trust-pickle" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "evil.pt2", "src"]


def test_trusted_load_may_unpickle(genuine: Path, tmp_path: Path) -> None:
    """--trust-pickle lifts the guard: the same forged sample inputs are then unpickled (the marker appears)."""
    marker = tmp_path / "ran"
    evil = _rewrite(genuine, tmp_path / "evil.pt2", lambda n, b: _payload(marker, 2) if n == SAMPLE_INPUTS else b)
    try:
        load_model(str(evil), trust_pickle=True)
    except SpecError:
        pass  # the payload is not a valid sample input; what matters is that it was unpickled
    assert marker.exists()


def test_genuine_program_written_by_minreal_still_loads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).eval()
    path = save_program(model, torch.randn(7, 6), tmp_path / "m.pt2")
    loaded = load_model(str(path))
    x = torch.randn(4, 6)
    torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_truncated_archive_is_named_not_blamed_on_pickles(genuine: Path, tmp_path: Path, cut: float) -> None:
    data = genuine.read_bytes()
    short = tmp_path / "short.pt2"
    short.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(SpecError, match=r"short\.pt2 is not a complete \.pt2 archive \(truncated") as info:
        load_model(str(short))
    assert "pickl" not in str(info.value)


def test_guard_blocks_every_unpickling_entry_point(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = _payload(marker, 2)
    import _pickle
    import io

    attempts = [
        lambda: pickle.loads(payload), lambda: pickle.load(io.BytesIO(payload)),
        lambda: pickle.Unpickler(io.BytesIO(payload)).load(), lambda: _pickle.loads(payload),
        lambda: torch.load(io.BytesIO(payload), weights_only=False), lambda: torch.load(io.BytesIO(payload)),
        lambda: torch.serialization.load(io.BytesIO(payload), weights_only=False),
        lambda: torch._C._pickle_load_obj(payload),
    ]
    with no_unpickling() as refusals:
        for attempt in attempts:
            with pytest.raises(UnpicklingRefused):
                attempt()
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(3.0)}, buffer)
        buffer.seek(0)
        assert torch.equal(torch.load(buffer, weights_only=True)["w"], torch.arange(3.0))
    assert len(refusals) == len(attempts)
    assert not marker.exists()
    assert pickle.loads(pickle.dumps([1, 2])) == [1, 2]  # restored after the block


def _dynamic_program(tmp_path: Path) -> Path:
    """A .pt2 with a dynamic batch, as minreal writes it: its model.json holds symbolic-shape expressions."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    (tmp_path / "dyn").mkdir()
    return save_program(model, torch.randn(5, 4), tmp_path / "dyn" / "m.pt2")


def _edit_program_json(src: Path, dst: Path, edit: Callable[[str], str]) -> Path:
    def member(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        text = edit(data.decode())
        assert text != data.decode(), "the forgery must change the program"
        return text.encode()

    return _rewrite(src, dst, member)


def test_symbolic_shape_expression_cannot_run_code(tmp_path: Path) -> None:
    """torch.export.load sympifies (evals) the program's ``expr_str``; a forged one must not run."""
    import re

    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch() + Symbol('s9', positive=True, integer=True)"
    evil = _edit_program_json(_dynamic_program(tmp_path), tmp_path / "evil.pt2",
                              lambda t: re.sub(r'"expr_str": "[^"]*"', lambda _: '"expr_str": ' + json.dumps(payload),
                                               t, count=1))
    with pytest.raises(SpecError, match=r"evil\.pt2 .*--trust-pickle"):
        load_model(str(evil))
    assert not marker.exists()


def test_program_naming_a_module_to_import_is_refused(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """Pytree specs name enum classes by module (torch imports it); an untrusted file may not make minreal
    import anything. The stand-in for a hostile module is the standard library's ``this``, whose import
    prints the Zen of Python."""
    import sys

    assert "this" not in sys.modules, "the check needs 'this' not yet imported"
    enum_key = json.dumps([{"__enum__": True, "fqn": "this:s", "name": "A"}])

    def forge(text: str) -> str:
        program = json.loads(text)
        signature = program["graph_module"]["module_call_graph"][0]["signature"]
        signature["in_spec"] = signature["in_spec"].replace('"context": "[]"', '"context": ' + json.dumps(enum_key))
        return json.dumps(program)

    evil = _edit_program_json(_dynamic_program(tmp_path), tmp_path / "evil.pt2", forge)
    with pytest.raises(SpecError, match=r"evil\.pt2 .*importing module 'this'.*--trust-pickle"):
        load_model(str(evil))
    assert "this" not in sys.modules
    assert "Beautiful is better" not in capfd.readouterr().out


def test_genuine_dynamic_program_passes_the_expression_guard(tmp_path: Path) -> None:
    path = _dynamic_program(tmp_path)
    loaded = load_model(str(path))
    assert loaded(torch.randn(7, 4)).shape == (7, 2)


@pytest.mark.parametrize("text, allowed", [
    ("Symbol('s31', positive=True, integer=True)", True),
    ("2*s31 + FloorDiv(s31, 4) - Max(1, s12)", True),
    ("__import__('os').system('true')", False),
    ("s31.__class__", False),
    ("(lambda: 1)()", False),
    ("Symbol('s1')[0]", False),
    ("Symbol('a b')", False),
])
def test_expression_allow_list(text: str, allowed: bool) -> None:
    from minreal.export.pickle_guard import _is_plain_arithmetic, _sympy_names

    assert _is_plain_arithmetic(text, _sympy_names()) is allowed


def test_program_written_by_compress_loads_in_a_fresh_process(tmp_path: Path) -> None:
    """The guard must not depend on what a process happens to have imported: compress, then export the result
    in a new interpreter (torch imports modules of its own while loading, which the guard leaves alone)."""
    import os
    import subprocess
    import sys

    (tmp_path / "net.py").write_text("import torch\nfrom torch import nn\n\ndef make():\n    torch.manual_seed(0)\n"
                                     "    return nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 10))\n")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    for args in (["compress", "net.py:make", "-m", "svd", "--data", "digits-flat", "--out", "c.pt2", "-q"],
                 ["export", "c.pt2", "--data", "digits-flat", "--out", "c.onnx", "-q"]):
        done = subprocess.run([sys.executable, "-m", "minreal.app.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "c.onnx").stat().st_size > 0
