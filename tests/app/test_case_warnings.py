"""What a case logs at WARNING, on any logger, and the Python warnings it raises become that case's warnings, each text
once; the console's handler holds them back meanwhile (the results show them) and does not count them as repeats."""

import io
import logging
import warnings

from minreal.app.case_warnings import CaseWarnings, HeldForResults, collected_warnings
from minreal.app.console import RepeatFilter


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
