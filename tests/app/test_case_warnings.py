"""What a case logs at WARNING, on any logger, and the Python warnings it raises become that case's warnings, each text
once; the console's handler holds them back meanwhile (the results show them) and does not count them as repeats."""

import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from minreal.app import pipeline
from minreal.app.case_warnings import CaseWarnings, HeldForResults, collected_warnings, split_level
from minreal.app.console import Console, RepeatFilter, shown_live


def test_log_records_and_python_warnings_are_collected_once_each() -> None:
    with collected_warnings() as raised:
        for _ in range(2):
            logging.getLogger("minreal.export.int8.preprocess").warning("quant_pre_process failed: %s", "shapes")
        logging.getLogger("onnxruntime").warning("a third-party line")
        logging.getLogger("minreal.export").info("progress is not a warning")
        warnings.warn("a Python warning", UserWarning, stacklevel=1)
    assert raised == ["quant_pre_process failed: shapes", "a third-party line",
                      "UserWarning (test_case_warnings.py): a Python warning"]
    assert not any(isinstance(h, CaseWarnings) for h in logging.getLogger().handlers)  # nothing left attached
    logging.getLogger("minreal.export").warning("after the case")
    assert len(raised) == 3


def test_the_console_holds_a_case_warning_back_without_counting_it() -> None:
    stream = io.StringIO()
    console, repeats = logging.StreamHandler(stream), RepeatFilter()
    console.addFilter(HeldForResults())
    console.addFilter(repeats)  # as setup_logging orders them
    log = logging.getLogger("minreal.test_case_warnings")
    log.addHandler(console)
    try:
        with collected_warnings() as raised:
            log.warning("held")
            log.warning("held")
        log.warning("shown")
    finally:
        log.removeHandler(console)
    assert stream.getvalue() == "shown\n" and raised == ["held"]
    assert repeats.summary() is None  # the held records were not counted as repeats shown once


def test_a_failing_block_still_fills_its_list_and_shows_what_the_console_held() -> None:
    stream = io.StringIO()
    console, root = logging.StreamHandler(stream), logging.getLogger()
    console.addFilter(HeldForResults())
    root.addHandler(console)
    try:
        with pytest.raises(KeyboardInterrupt), collected_warnings() as raised:
            logging.getLogger("minreal.compress").warning("recovery interrupted after 3 steps")
            assert stream.getvalue() == ""  # held while the case runs
            raise KeyboardInterrupt
    finally:
        root.removeHandler(console)
    assert raised == ["recovery interrupted after 3 steps"]
    assert stream.getvalue() == "recovery interrupted after 3 steps\n"  # shown when the case failed


def test_a_block_that_ends_normally_leaves_the_held_records_to_the_results() -> None:
    stream, held = io.StringIO(), HeldForResults()
    console, root = logging.StreamHandler(stream), logging.getLogger()
    console.addFilter(held)
    root.addHandler(console)
    try:
        with collected_warnings() as raised:
            logging.getLogger("minreal.export").warning("shown with the results")
    finally:
        root.removeHandler(console)
    assert raised == ["shown with the results"] and stream.getvalue() == "" and held.held == []


def test_an_error_record_is_collected_under_its_level() -> None:
    with collected_warnings() as raised:
        logging.getLogger("minreal.export").error("the ORT file was not written")
        logging.getLogger("minreal.export").warning("a warning")
    assert raised == ["ERROR: the ORT file was not written", "a warning"]
    assert [split_level(t) for t in raised] == [("ERROR", "the ORT file was not written"), ("WARNING", "a warning")]
    assert split_level("UserWarning (a.py): ERROR: x") == ("WARNING", "UserWarning (a.py): ERROR: x")


def test_without_any_handler_the_records_still_reach_stderr(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a Python API user who set up no logging (pytest adds its own)
    with collected_warnings() as raised:
        logging.getLogger("minreal.export").warning("seen by a Python API user")
    assert raised == ["seen by a Python API user"]
    assert capsys.readouterr().err == "seen by a Python API user\n"  # as logging.lastResort prints it
    assert root.handlers == []


def test_a_nested_block_passes_its_python_warnings_outward() -> None:
    with collected_warnings() as outer:
        with collected_warnings() as inner:
            warnings.warn("raised inside", UserWarning, stacklevel=1)
            logging.getLogger("minreal.export").warning("logged inside")
    text = "UserWarning (test_case_warnings.py): raised inside"
    assert inner == ["logged inside", text]
    assert outer == ["logged inside", text]


@pytest.fixture
def console_handler() -> Iterator[tuple[logging.Handler, io.StringIO]]:
    """A console handler on the root logger as :func:`minreal.app.console.setup_logging` makes it."""
    stream = io.StringIO()
    handler, root = logging.StreamHandler(stream), logging.getLogger()
    handler.addFilter(RepeatFilter())
    root.addHandler(handler)
    yield handler, stream
    root.removeHandler(handler)


def test_only_a_brief_console_holds_a_case_warning_back(console_handler: tuple[logging.Handler, io.StringIO]) -> None:
    handler, stream = console_handler
    Console(quiet=True, as_json=False)  # minreal run's console: a case's warnings are shown as they come
    assert not any(isinstance(f, HeldForResults) for f in handler.filters)
    with collected_warnings() as raised:
        logging.getLogger("minreal.compress").warning("recovery interrupted after 3 steps")
        assert stream.getvalue() == "recovery interrupted after 3 steps\n"  # live, not after the benchmark
    assert raised == ["recovery interrupted after 3 steps"]  # and still collected for report.json
    assert shown_live("recovery interrupted after 3 steps") and not shown_live("never logged")
    Console(quiet=True, as_json=False, brief=True)  # the demo's
    assert isinstance(handler.filters[0], HeldForResults)  # before the repeat filter: a held record is not counted
    with collected_warnings() as raised:
        logging.getLogger("minreal.compress").warning("held for the results")
        assert "held" not in stream.getvalue()
    assert raised == ["held for the results"] and not shown_live("held for the results")
    Console(quiet=True, as_json=False)
    assert not any(isinstance(f, HeldForResults) for f in handler.filters)


def test_the_progress_line_counts_the_collected_warnings_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def case_run(*_: object) -> SimpleNamespace:
        logging.getLogger("minreal.export").warning("quant_pre_process failed")
        logging.getLogger("minreal.export").warning("a slowdown")  # the same text as one of the run's own
        return SimpleNamespace(warnings=["a slowdown"])

    monkeypatch.setattr(pipeline, "_run_case", case_run)
    said: list[str] = []
    result = pipeline.run_case(SimpleNamespace(name="mlp", model=None), Path("unused"), None, said.append)
    assert result.warnings == ["a slowdown", "quant_pre_process failed"]
    assert said == ["[mlp] 2 warning(s), listed with the results"]
