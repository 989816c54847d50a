"""Session options guard: explicit threads, no spinning (idle sessions must not steal cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minreal.runtime_bench.errors import ModelFileError
from minreal.runtime_bench.sessions import SPINNING_ENTRIES, create_session, session_options


def test_spinning_disabled_in_options() -> None:
    options = session_options(threads=3)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 1


def test_created_session_keeps_settings(reference_model: Path) -> None:
    session = create_session(reference_model, "CPUExecutionProvider", threads=2)
    options = session.get_session_options()
    for key, value in SPINNING_ENTRIES:
        assert options.get_session_config_entry(key) == value
    assert options.intra_op_num_threads == 2
    assert session.get_providers()[0] == "CPUExecutionProvider"


def test_missing_model_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelFileError) as info:
        create_session(missing, "CPUExecutionProvider", threads=1)
    assert str(missing) in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)
