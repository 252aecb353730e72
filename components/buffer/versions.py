"""Buffer versions: every write is a table version; tags name them, checkouts replay them.

Old versions are never pruned here, so an experiment can be replayed against the buffer
it saw.
"""

from __future__ import annotations

from typing import Any, NoReturn

from components.buffer.errors import BufferVersionError, first_line
from components.buffer.table import BufferTable


class VersionsMixin(BufferTable):
    """Tags, version listing, read-only checkouts and restores of the table."""

    def tag(self, name: str, *, overwrite: bool = False) -> int:
        """Name the current version (e.g. ``iter-3``); re-tagging the same version is a no-op."""
        self._require_writable()
        version = self.version
        tags = self.tags()
        with self._io("tag"):
            try:
                if name in tags:
                    if tags[name] == version:
                        return version
                    if not overwrite:
                        raise BufferVersionError(
                            f"tag {name!r} already points to version {tags[name]} "
                            f"(current is {version}); pass overwrite=True to move it"
                        )
                    self._table.tags.update(name, version)
                else:
                    self._table.tags.create(name, version)
            except RuntimeError as err:
                if "Ref" in str(err):
                    raise BufferVersionError(f"invalid tag {name!r}: {first_line(err)}") from err
                raise
        return version

    def tags(self) -> dict[str, int]:
        """Tag name -> version."""
        with self._io("list tags"):
            return {k: int(v["version"]) for k, v in self._table.tags.list().items()}

    def versions(self) -> list[dict[str, Any]]:
        """Every version with its timestamp, row count and tags (oldest first)."""
        by_version: dict[int, list[str]] = {}
        for name, v in self.tags().items():
            by_version.setdefault(v, []).append(name)
        with self._io("list versions"):
            listed = self._table.list_versions()
        return [
            {
                "version": int(v["version"]),
                "timestamp": v["timestamp"].isoformat(),
                "rows": int(v.get("metadata", {}).get("total_rows", -1)),
                "tags": sorted(by_version.get(int(v["version"]), [])),
            }
            for v in listed
        ]

    def _resolve(self, ref: int | str) -> int:
        if isinstance(ref, int):
            return ref
        tags = self.tags()
        if ref not in tags:
            raise BufferVersionError(f"{self.table_dir}: unknown tag {ref!r}; tags: {sorted(tags)}")
        return tags[ref]

    def _no_such_version(self, ref: int | str, err: ValueError) -> NoReturn:
        raise BufferVersionError(
            f"{self.table_dir}: version {ref!r} does not exist: {first_line(err)}"
        ) from err

    def checkout(self, ref: int | str) -> None:
        """Read-only view of a version or tag (writes raise until ``checkout_latest``)."""
        version = self._resolve(ref)
        try:
            self._table.checkout(version)
        except ValueError as err:
            self._no_such_version(ref, err)
        self._pinned = version
        self._changed()
        self._check_schema()

    def checkout_latest(self) -> None:
        """Back to the newest version (also picks up other processes' commits)."""
        self._checkout_latest()

    def refresh(self) -> None:
        """See commits made by other processes (no-op on a checked-out view)."""
        if self._pinned is None:
            self.checkout_latest()

    def restore(self, ref: int | str) -> int:
        """Make an old version (or tag) the newest one again; history is kept. Returns it."""
        version = self._resolve(ref)
        self.checkout_latest()
        with self._write_lock(), self._io("restore"):
            try:
                self._table.restore(version)
            except ValueError as err:
                self._no_such_version(ref, err)
        self._changed()
        return self.version
