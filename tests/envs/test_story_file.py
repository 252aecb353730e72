"""The Z-machine header check that keeps a bad game file from killing the process."""

from __future__ import annotations

from pathlib import Path

from components.envs.textworld_env import story_file_problem


def story(body_len: int = 200, version: int = 8, declared: int | None = None) -> bytearray:
    """A minimal Z-machine image: a header with version, length and checksum, then a body."""
    data = bytearray(64 + body_len)
    data[0] = version
    for i in range(64, len(data)):
        data[i] = (i * 7) % 256
    length = len(data) if declared is None else declared
    data[0x1A:0x1C] = (length // 8).to_bytes(2, "big")  # version 8: length / 8
    data[0x1C:0x1E] = (sum(data[0x40:length]) % 0x10000).to_bytes(2, "big")
    return data


def test_a_whole_story_file_passes(tmp_path: Path):
    path = tmp_path / "game.z8"
    path.write_bytes(story())
    assert story_file_problem(path) is None


def test_each_kind_of_damage_is_named(tmp_path: Path):
    path = tmp_path / "game.z8"
    assert "cannot read" in (story_file_problem(path) or "")  # missing
    path.write_bytes(b"\x08" * 10)
    assert "shorter than a Z-machine header" in (story_file_problem(path) or "")
    path.write_bytes(b"<html>" + bytes(100))
    assert "not a Z-machine story file" in (story_file_problem(path) or "")
    path.write_bytes(story()[:150])
    assert "truncated (150 of 264 bytes)" in (story_file_problem(path) or "")
    garbled = story()
    garbled[100] ^= 0x01
    path.write_bytes(garbled)
    assert "checksum mismatch" in (story_file_problem(path) or "")
