"""The command line starts without torch, onnx or ONNX Runtime: importing it, building its command tree, ``--help`` of
every command, ``minreal methods`` and option errors import none of them, and ``compress`` only torch (a check on
``sys.modules`` in a fresh interpreter, not a timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "onnx", "onnxruntime")
#: Runs ``minreal`` once per argument list (``["*", "--help"]``: every command's ``--help``) in this interpreter,
#: then prints the exit codes and the heavy modules imported, as the last line of stdout.
PROBE = """
import json, sys
from minreal.app.cli import cli, run
calls = []
for args in json.loads(sys.argv[1]):
    calls += [[name, *args[1:]] for name in sorted(cli.commands)] if args[:1] == ["*"] else [args]
codes = [run(args) for args in calls]
print(json.dumps({"codes": codes, "heavy": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""

CASES = {
    "import": ([], 0),
    "help": ([["--help"]], 0),
    "methods": ([["methods"], ["methods", "--json"]], 0),
    "every command's help": ([["*", "--help"]], 0),
    "option errors": ([["compress", "model.py:f", "--data", "digits", "--method", "nope"],
                       ["compress", "model.py:f", "--data", "digits", "--method", "svd", "--rank-fraction", "x"],
                       ["tune", "--grid", "x"],
                       ["tune", "model.py:f", "--data", "digits", "--max-accuracy-drop", "1", "--grid", "x"],
                       ["tune", "model.py:f", "--data", "digits", "--max-accuracy-drop", "1", "--grid", "2"],
                       ["tune", "model.py:f", "--data", "digits"],
                       ["tune", "model.py:f", "--data", "digits", "--max-accuracy-drop", "1", "--min-agreement", "0.9"],
                       ["tune", "model.py:f", "--data", "digits", "--max-accuracy-drop", "1", "--time-budget", "soon"],
                       ["run", "model.py:f", "--data", "digits", "--method", "svd", "--batch", "0"],
                       ["export", "model.py:f", "--out", "m.onnx", "--quant-target", "nope"]], 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_command_line_starts_without_torch_or_onnxruntime(case: str, tmp_path: Path) -> None:
    calls, code = CASES[case]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls), json.dumps(HEAVY)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"{case} imported {result['heavy']}"
    assert len(result["codes"]) >= len(calls) and all(c == code for c in result["codes"]), result["codes"]


def test_compress_imports_no_onnx(tmp_path: Path, factory_file: Path) -> None:
    """``compress`` writes a torch program: it needs torch but neither onnx nor ONNX Runtime (about a second of
    imports on a 2-core machine)."""
    calls = [["compress", f"{factory_file}:make", "--method", "factorize", "--mac-ratio", "0.8", "--data",
              f"{factory_file}:data", "--data-holdout", "0", "--out", str(tmp_path / "small.pt2"),
              "--report", str(tmp_path / "r.json"), "-q"]]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls), json.dumps(HEAVY)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0], proc.stderr
    assert result["heavy"] == ["torch"] and (tmp_path / "small.pt2").is_file() and (tmp_path / "r.json").is_file()


def test_the_console_script_exits_with_the_command_s_code_and_all_its_output(tmp_path: Path,
                                                                             factory_file: Path) -> None:
    """``console()`` skips the interpreter's teardown once torch is loaded: the exit code, stdout, stderr and the
    files a command wrote are all there (a success, and a failure after torch was loaded)."""
    entry = "from minreal.app.cli import console; console()"
    base = ["compress", f"{factory_file}:make", "--method", "svd", "--mac-ratio", "0.8", "--data-holdout", "0",
            "--out", str(tmp_path / "small.pt2")]
    ok = subprocess.run([sys.executable, "-c", entry, *base, "--data", f"{factory_file}:data", "--report",
                         str(tmp_path / "r.json")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "saved" in ok.stdout and json.loads((tmp_path / "r.json").read_text())["method"] == "svd"
    bad = subprocess.run([sys.executable, "-c", entry, *base, "--data", str(tmp_path / "missing.npz")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "missing.npz" in bad.stderr and bad.stderr.rstrip().count("\n") <= 3, bad.stderr
