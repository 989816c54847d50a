"""The fuzz harness (benchmarks/fuzz.py) over every reader, a slice of it with a fixed seed, and the bugs it found:
huge declared sizes in .npz/.npy refused before anything is allocated, damaged archives named, malformed report
and baseline JSON refused in one line, external data outside the model's folder never read."""

from __future__ import annotations

import io
import json
import os
import random
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fuzz
from _common import run_measured
from fuzz import READERS, Case, escape_cases, mutated_case, run_case, templates

from minreal.app.callables import SpecError
from minreal.app.data import load_dataset
from tests.hostile.test_inputs import refused

SLICE_CASES = {"onnx": 4, "ort": 2, "pt2": 8, "npz": 30, "weights": 12, "plan": 24, "images": 16, "report": 40,
               "baseline": 40, "latency_table": 12, "factorize_cache": 8, "prepared_cache": 8, "tune_cache": 40}
"""Cases per reader in `make test`'s slice (about a minute on two cores; benchmarks/fuzz.py runs longer)."""


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    fuzz._canary(root)
    return root


@pytest.fixture(scope="module")
def made(fuzz_root: Path) -> dict[str, Path]:
    return templates(fuzz_root)


def test_slice_covers_every_reader() -> None:
    assert set(SLICE_CASES) == set(READERS)


def test_genuine_files_pass(made: dict[str, Path], fuzz_root: Path) -> None:
    """The templates are genuine: each command succeeds on them unmutated (so a refusal below is the mutation's)."""
    for name, reader in READERS.items():
        case = Case(name, "none", reader.args, fuzz._template_files(made[name]), reader.target)
        outcome = run_case(case, fuzz_root)
        assert outcome.code == 0 and not outcome.broken, (name, outcome)


@pytest.mark.parametrize("reader", sorted(SLICE_CASES))
def test_fuzz_slice(reader: str, made: dict[str, Path], fuzz_root: Path) -> None:
    rng = random.Random(f"slice-{reader}")
    for _ in range(SLICE_CASES[reader]):
        outcome = run_case(mutated_case(READERS[reader], made[reader], rng, fuzz_root / "pwned"), fuzz_root)
        assert not outcome.broken, outcome
        assert outcome.code in (0, 1, 2)


@pytest.mark.parametrize("case", range(3), ids=["relative", "absolute", "symlink"])
def test_external_data_escape_is_refused(case: int, fuzz_root: Path) -> None:
    """Valid weights lie outside the model's folder (reading them would make bench succeed): every way of pointing
    at them is refused in one line, and nothing is written."""
    escape = escape_cases(fuzz_root)[case]
    outcome = run_case(escape, fuzz_root)
    assert outcome.code == 2 and not outcome.broken, outcome
    assert "m.onnx" in outcome.line and "outside the model's folder" in outcome.line


def test_harness_sees_a_read_outside_the_case_folder(fuzz_root: Path) -> None:
    """The read_outside invariant is live: a command told to read the file beside the case folder is caught."""
    secret = str((fuzz_root / "outside" / "secret").resolve())
    outcome = run_case(Case("self", "none", ("check", secret, "--max-latency-ratio", "2"), {}, "secret"), fuzz_root)
    assert "read_outside" in outcome.broken, outcome


def _npz_declaring(path: Path, shape: tuple[int, ...]) -> Path:
    """A 2-row .npz whose ``x`` header declares ``shape``: the few bytes of two rows behind a huge header."""
    np.savez(path, x=np.zeros((2, 4), np.float32), y=np.zeros(2, np.int64))
    with zipfile.ZipFile(path) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    members["x.npy"] = fuzz.npy_declaring(shape, members["x.npy"][-32:])
    with zipfile.ZipFile(path, "w") as zout:
        for name, data in members.items():
            zout.writestr(name, data)
    return path


def test_npz_declaring_1e12_elements_is_refused_before_allocation(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = _npz_declaring(tmp_path / "d.npz", (10**12,))

    def allocates(*args: object, **kwargs: object) -> None:
        raise AssertionError("the array was read (and allocated)")

    monkeypatch.setattr(np.lib.format, "read_array", allocates)
    with pytest.raises(SpecError, match=r"array 'x' in .*d\.npz declares shape \(1000000000000,\) of float32 "
                                        r"\(4000000000000 bytes\) but holds 32 bytes of data") as info:
        load_dataset(str(path))
    assert "\n" not in str(info.value)


def test_npz_declaring_1e12_elements_through_the_cli_keeps_memory_small(fuzz_root: Path, tmp_path: Path) -> None:
    """Through compress, under the harness's invariants (peak memory growth, no output, one line)."""
    _npz_declaring(tmp_path / "d.npz", (2, 5 * 10**11))
    files = {"d.npz": (tmp_path / "d.npz").read_bytes(), "net.py": fuzz.FACTORY.encode()}
    outcome = run_case(Case("npz", "declared_1e12", fuzz.COMPRESS, files, "d.npz"), fuzz_root)
    assert outcome.code == 2 and not outcome.broken and not outcome.unnamed, outcome
    assert "declares shape (2, 500000000000)" in outcome.line


def test_npy_declaring_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "d.npy", np.zeros((2, 4), np.float32))
    data = (tmp_path / "d.npy").read_bytes()
    (tmp_path / "d.npy").write_bytes(fuzz.npy_declaring((10**6, 10**6), data[-32:]))
    with pytest.raises(SpecError, match=r"d\.npy declares shape \(1000000, 1000000\)"):
        load_dataset(str(tmp_path / "d.npy"))


def test_damaged_npz_member_is_named(workdir: Path, run_cli: Callable) -> None:
    np.savez(workdir / "d.npz", x=np.ones((40, 64), np.float32))
    data = bytearray((workdir / "d.npz").read_bytes())
    data[200] ^= 0xFF  # inside x's data: the member's CRC no longer matches
    (workdir / "d.npz").write_bytes(bytes(data))
    refused(run_cli, ["compress", "net.py:make", "-m", "svd", "--data", "d.npz", "--out", "o.pt2", "-q"],
            "'x'", "d.npz", "corrupt")


def _bench_report(made: dict[str, Path]) -> dict:
    return json.loads((made["report"] / "r.json").read_text())


@pytest.mark.parametrize("edit", [
    lambda r: r.update(latency=[[1, 2]] + r["latency"][1:]),
    lambda r: r["latency"][0].update(model=["a"]),
    lambda r: r["latency"][0].update(batch_size={"b": 1}),
    lambda r: r["latency"][0].pop("provider"),
    lambda r: r["latency"][1].update(model=7),
], ids=["row_a_list", "model_a_list", "batch_a_dict", "row_without_provider", "model_a_number"])
def test_malformed_baseline_is_refused_in_one_line(edit: Callable, made: dict[str, Path], workdir: Path,
                                                   run_cli: Callable) -> None:
    report = _bench_report(made)
    (workdir / "r.json").write_text(json.dumps(report))
    edit(report)
    (workdir / "base.json").write_text(json.dumps(report))
    code, _, err = run_cli(["check", "r.json", "--baseline", "base.json", "--max-regression", "50",
                            "--allow-hardware-mismatch", "-q"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "base.json" in lines[0]


def test_baseline_that_is_not_text_is_refused(made: dict[str, Path], workdir: Path, run_cli: Callable) -> None:
    (workdir / "r.json").write_bytes((made["report"] / "r.json").read_bytes())
    (workdir / "base.json").write_bytes(b'{"schema_version": \x80\xff}')
    refused(run_cli, ["check", "r.json", "--baseline", "base.json", "--max-regression", "50", "-q"], "base.json")


def test_forged_weights_pickle_runs_no_code(workdir: Path, run_cli: Callable) -> None:
    marker = workdir / "pwned"
    np.savez(workdir / "d.npz", x=np.zeros((40, 64), np.float32))
    buffer = io.BytesIO()
    import torch

    torch.save({"w": torch.zeros(2)}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as zin, zipfile.ZipFile(workdir / "w.pt", "w") as zout:
        for info in zin.infolist():
            data = fuzz.pickle_payload(marker) if info.filename.endswith("data.pkl") else zin.read(info)
            zout.writestr(info.filename, data)
    refused(run_cli, ["compress", "net.py:make", "--weights", "w.pt", "-m", "svd", "--data", "d.npz", "--out",
                      "o.pt2", "-q"], "w.pt")
    assert not marker.exists()


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.update(model_ms=float("nan")), "model_ms is nan"),
    (lambda t: t["layers"]["1"].update(keep_ms=-1.0), "keep_ms is -1.0"),
    (lambda t: t["layers"]["1"]["ms"].pop(), "equally long"),
    (lambda t: t["layers"]["3"].update(ranks=list(reversed(t["layers"]["3"]["ranks"]))), "do not increase"),
    (lambda t: t["layers"]["3"]["ms"].__setitem__(0, "fast"), "'fast', not a finite positive number"),
    (lambda t: t.update(layers=[]), "latency table t.json"),
], ids=["nan_model", "negative_keep", "short_ms", "ranks_decrease", "time_a_string", "layers_a_list"])
def test_latency_table_with_impossible_values_is_refused(edit: Callable, says: str, made: dict[str, Path],
                                                         workdir: Path, run_cli: Callable) -> None:
    table = json.loads((made["latency_table"] / "t.json").read_text())
    edit(table)
    (workdir / "t.json").write_text(json.dumps(table))
    np.savez(workdir / "d.npz", x=np.zeros((40, 64), np.float32))
    (workdir / "net.py").write_text(fuzz.FACTORY)
    refused(run_cli, ["compress", "net.py:make", "-m", "factorize", "--latency-table", "t.json", "--latency-ratio",
                      "0.8", "--data", "d.npz", "--out", "o.pt2", "-q"], "t.json", says)


@pytest.mark.parametrize("content", ["pickle", "list", "no_moment", "nan"])
def test_forged_or_foreign_factorize_cache_entry_is_a_miss(content: str, tmp_path: Path) -> None:
    """A cache entry is recomputed when it is a pickle that would run code (never run), not a dict of tensors, or
    lacks the field its reader needs."""
    import torch

    from minreal.compress.core.cache import load_entry, save_entry

    marker = tmp_path / "pwned"
    save_entry(tmp_path, "k", {"moment": torch.ones(2)})
    path = next(p for p in tmp_path.rglob("*") if p.is_file())
    if content == "pickle":
        path.write_bytes(fuzz.pickle_payload(marker))
    elif content == "list":
        torch.save([torch.ones(2)], path)
    elif content == "nan":
        torch.save({"moment": torch.tensor([1.0, float("nan")])}, path)
    else:
        torch.save({"other": torch.ones(2)}, path)
    assert load_entry(tmp_path, "k", ("moment",)) is None
    assert not marker.exists()


def test_plan_that_is_not_text_is_refused(workdir: Path, run_cli: Callable) -> None:
    (workdir / "p.toml").write_bytes(b'[[variant]]\nmethod = "svd\xff"\n')
    refused(run_cli, ["tune", "net.py:make", "--plan", "p.toml", "--data", "digits-flat", "--dry-run",
                      "--max-accuracy-drop", "5", "-q"], "p.toml", "not UTF-8")


def test_weights_holding_nan_are_refused_by_name(workdir: Path, run_cli: Callable) -> None:
    import torch

    state = fuzz._load_factory(workdir, "make").state_dict()
    state["3.weight"][2, 5] = float("nan")
    torch.save(state, workdir / "w.pt")
    refused(run_cli, ["compress", "net.py:make", "--weights", "w.pt", "-m", "svd", "--data", "digits-flat", "--out",
                      "o.pt2", "-q"], "w.pt", "'3.weight' holds NaN")


@pytest.mark.parametrize("field, value", [("quality", "high"), ("quality", {"accuracy": "x"}), ("macs", "many"),
                                          ("mac_ratio", [0.5]), ("seconds", None), ("error", 3)])
def test_tune_cache_entry_of_wrong_types_is_a_miss(field: str, value: object, tmp_path: Path) -> None:
    """A tune cache entry whose result.json holds a field of another type (damaged, edited) is computed again,
    not an internal error of the whole tune."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from minreal.app.tune import Constraint
    from minreal.app.tune.candidate import RESULT_FILE, CandidateResult, CandidateSpec, _from_cache
    from minreal.app.tune.config import Quality

    spec = CandidateSpec("svd", 0.5)
    genuine = asdict(CandidateResult(spec, "k", quality={"accuracy": 0.9}, mac_ratio=0.5, params=10, macs=10))
    job = SimpleNamespace(spec=spec, constraint=Constraint(max_accuracy_drop=5.0), reference=Quality(0.9, None, None),
                          int8=False)
    for name in ("model.onnx", "model.pt2"):  # the files a cached fp32 candidate needs beside its result
        (tmp_path / name).write_bytes(b"")
    (tmp_path / RESULT_FILE).write_text(json.dumps({**genuine, "spec": None}))
    cached = _from_cache(tmp_path, job)
    assert cached is not None and cached.cached and cached.feasible  # the genuine entry is a hit
    (tmp_path / RESULT_FILE).write_text(json.dumps({**genuine, "spec": None, field: value}))
    assert _from_cache(tmp_path, job) is None


def test_npz_declaring_1e12_elements_in_a_fresh_process_stays_small(tmp_path: Path) -> None:
    """The command in its own process: refused in one line, and its peak resident memory (its own, from wait4)
    stays that of a process that imported torch: 4 TB are declared, 2 GiB is far below anything allocating them
    would touch. Linux keeps a process's peak across fork and exec, so a child of this (large) test process would
    report this process's peak: run_measured's small launcher starts the command and reports the command's own."""
    _npz_declaring(tmp_path / "d.npz", (10**12,))
    (tmp_path / "net.py").write_text(fuzz.FACTORY)
    done = run_measured([sys.executable, "-m", "minreal.app.cli", *fuzz.COMPRESS], timeout=300, cwd=tmp_path,
                        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert done.peak_mib is not None, done.stderr
    code, maxrss_kib = done.returncode, done.peak_mib * 1024
    err = done.stderr
    assert code == 2 and "declares shape (1000000000000,)" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert maxrss_kib / 1024 < 2048, maxrss_kib
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "net.py"]


def test_path_mutations_point_at_the_file_beside_the_case_folders(fuzz_root: Path) -> None:
    """The paths the mutations write into JSON, TOML and ONNX files lead from a case folder (``root/case-X/``) to
    ``root/outside/secret``, relatively and absolutely (not above the root, where nothing is watched)."""
    secret = (fuzz_root / "outside" / "secret").resolve()
    case_folder = fuzz_root / "case-x"
    written: set[str] = set()
    for seed in range(400):
        how, data = fuzz.mutate("json", json.dumps({"a": "b"}).encode(), random.Random(seed), fuzz_root / "pwned")
        if how == "json_confuse":  # (the others mutate bytes)
            written |= {v for v in json.loads(data).values() if isinstance(v, str) and "secret" in v}
    assert written == {"../outside/secret", str(secret)}
    assert all((case_folder / p).resolve() == secret for p in written)


def test_reads_outside_flags_the_root_beyond_the_case_and_unnamed_files_elsewhere(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    case, old = root / "case-a", elsewhere / "old.txt"
    for folder in (case, root / "outside", root / "templates", elsewhere):
        folder.mkdir(parents=True)
    for path in (case / "d.npz", root / "outside" / "secret", root / "templates" / "d.npz", old):
        path.write_text("x")
    since = old.stat().st_mtime + 1
    new = elsewhere / "new.txt"  # the command's own temporary file: written during the case
    new.write_text("x")
    os.utime(new, (since + 1, since + 1))
    library = np.__file__  # the interpreter's: read whatever the case names
    opened = [str(case / "d.npz"), str(case / ".." / "outside" / "secret"), str(root / "templates" / "d.npz"),
              str(old), str(new), library, str(root / "pwned")]
    assert fuzz.reads_outside(opened, root, case, since) == [
        str((root / "outside" / "secret").resolve()), str((root / "templates" / "d.npz").resolve()),
        str(old.resolve()), str((root / "pwned").resolve())]
    if Path("/etc/hostname").is_file():
        assert fuzz.reads_outside(["/etc/hostname"], root, case, time.time()) == ["/etc/hostname"]


def test_every_member_mutation_is_reached_for_an_npy_member() -> None:
    rng = random.Random(0)
    assert {fuzz._member_mutation("x.npy", rng) for _ in range(400)} == {
        "member_dropped", "member_pickle", "member_bytes", "npy_huge_shape", "npy_object_pickle"}


def test_object_npy_member_runs_no_code(fuzz_root: Path, made: dict[str, Path]) -> None:
    """An .npz whose ``x.npy`` is an object array holding a pickle that would create a file: refused, nothing run
    (the .npy itself would run it if read with allow_pickle=True, which the harness checks first)."""
    marker = fuzz_root / "pwned"
    forged = fuzz.npy_object(fuzz.pickle_payload(marker))
    with pytest.raises(ValueError, match="allow_pickle"):
        np.load(io.BytesIO(forged))
    files = fuzz._template_files(made["npz"])
    with zipfile.ZipFile(io.BytesIO(files["d.npz"])) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    members["x.npy"] = forged
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zout:
        for name, data in members.items():
            zout.writestr(name, data)
    files["d.npz"] = out.getvalue()
    outcome = run_case(Case("npz", "npy_object_pickle", fuzz.COMPRESS, files, "d.npz"), fuzz_root)
    assert outcome.code == 2 and not outcome.broken, outcome
    assert not marker.exists()
    np.load(io.BytesIO(forged), allow_pickle=True)  # the payload is live: read as a pickle, it runs
    assert marker.exists()
    marker.unlink()


def test_a_failed_allocation_is_broken_whatever_the_exit_status(fuzz_root: Path) -> None:
    case = Case("npz", "none", ("check",), {}, "d.npz")
    for text in ("minreal: error: MemoryError", "numpy._core._exceptions: Unable to allocate 3.64 TiB for an array"):
        for code in (1, 2):
            assert "memory" in fuzz._broken(case, fuzz_root, code, text, set(), 0.0)
    assert fuzz._broken(case, fuzz_root, 2, "minreal: error: d.npz declares 4 TB", set(), 0.0) == []
