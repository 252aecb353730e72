"""Third-party log noise is off by default (issue 23, item 4)."""

from __future__ import annotations

import logging

from components.cli_process import _QUIET_ENV, _quiet_libraries


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(f"{record.levelname} {record.name}")


def test_library_info_lines_are_dropped_and_warnings_and_our_lines_kept():
    handler = _Collect()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        _quiet_libraries("WARNING")
        gx = logging.getLogger("great_expectations.data_context.types.base")
        gx.setLevel(logging.INFO)  # as GX itself does
        gx.info("Created temporary directory")
        gx.warning("a real problem")
        logging.getLogger("dreamgym").info("round 1/3")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert handler.names == [
        "WARNING great_expectations.data_context.types.base",
        "INFO dreamgym",
    ]


def test_mlflow_and_lance_are_quiet_by_default():
    assert _QUIET_ENV["MLFLOW_LOGGING_LEVEL"] == "WARNING"
    assert _QUIET_ENV["LANCEDB_LOG"] == "error"
