"""``read_rows``: a damaged JSON-lines file is one error naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.io import InputError, read_rows


def test_read_rows_names_bad_lines_and_bad_bytes(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n[2]\n')
    assert read_rows(path) == [{"a": 1}, [2]]  # blank lines skipped
    path.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(
        InputError, match=r"rows\.jsonl:2: not a JSON line \(Expecting value: line 1 column 1"
    ):
        read_rows(path)
    path.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(InputError, match=r"rows\.jsonl: not UTF-8 text"):
        read_rows(path)
