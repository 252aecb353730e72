"""The suite's file order: `make test` relies on it to start the e2e pipeline first."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import pytest_collection_modifyitems


@dataclass
class FakeItem:
    path: Path
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.markers else None


def test_e2e_first_then_files_with_slow_tests_then_collection_order():
    items = [
        FakeItem(Path("a.py")),
        FakeItem(Path("b.py")),
        FakeItem(Path("b.py"), {"slow"}),  # one slow test moves its whole file
        FakeItem(Path("c.py")),
        FakeItem(Path("e2e.py"), {"e2e"}),
        FakeItem(Path("e2e.py"), {"e2e"}),
    ]
    pytest_collection_modifyitems(items)
    assert [str(i.path) for i in items] == ["e2e.py", "e2e.py", "b.py", "b.py", "a.py", "c.py"]
    assert [bool(i.markers) for i in items[2:4]] == [False, True]  # stable within a file
