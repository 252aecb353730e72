"""Issue 21: each reliability finding (F1-F9, config) reproduced, and what it does now.

- F1 a line nested 500-990 levels deep is quarantined before parsing; the batch ingests.
- F2 a seed of 2**64 is a schema error of its line; a writer failing late replaces nothing.
- F3 a transition id used twice quarantines only the later line.
- F4 no type coercion: "true" is not a bool, "3" is not an int.
- F5 a buffer killed before its first version is rebuilt by the next build-buffer.
- F6 disk full / permission denied / read-only: one line naming the output, exit 1, the
  previous outputs intact, no temporary file left.
- F7-F9 a second collect / annotate / ingest / build-buffer on the same outputs fails at
  once (exit 75, one line) while the first holds them; concurrent writers never share a
  temporary name.
- config: every malformed params file or override is one line naming the key, exit 2.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from components.cli import EXIT_BUSY, EXIT_CONFIG, EXIT_ERROR, app
from components.config import IngestConfig
from components.data.ingest import (
    QUARANTINE_FILE,
    TRAJECTORIES_FILE,
    TRANSITIONS_FILE,
    VALIDATION_FILE,
    ingest,
)
from components.io import TMP_SUFFIX, atomic_write_text, output_lock, swap_dir, temp_path_for
from components.schema import Trajectory, read_jsonl, write_jsonl
from tests.reliability.project import (
    child_env,
    make_project,
    make_trajectories,
    python_argv,
    spawn,
    wait_until,
    without_tracking,
    write_params,
)

pytestmark = pytest.mark.timeout(120)
CFG = IngestConfig()
OUTPUTS = (TRAJECTORIES_FILE, TRANSITIONS_FILE, VALIDATION_FILE)


def _line(traj: Trajectory, edit=None) -> bytes:
    obj = json.loads(traj.model_dump_json())
    if edit:
        edit(obj)
    return json.dumps(obj).encode()


def _ingest_lines(tmp: Path, lines: list[bytes]):
    raw = tmp / "raw" / "batch.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_bytes(b"\n".join(lines) + b"\n")
    report = ingest([raw], tmp / "ingested", tmp / "quarantine", CFG)
    kept = [t.episode_id for t in read_jsonl(tmp / "ingested" / TRAJECTORIES_FILE, Trajectory)]
    text = (tmp / "quarantine" / QUARANTINE_FILE).read_text(encoding="utf-8")
    quarantined = {q["line_no"]: q["reasons"] for q in map(json.loads, text.splitlines())}
    return report, kept, quarantined


def _snapshot(*folders: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def _temps(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"*{TMP_SUFFIX}")]


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_error_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.output
    return errors[0]


def test_f1_deep_nesting_is_quarantined_before_parsing_and_the_batch_ingests(tmp_path) -> None:
    good, extra = make_trajectories(3), make_trajectories(2, start=10)

    def deep(traj: Trajectory, levels: int) -> bytes:
        # built as text: the test process could not even parse it without hitting the limit
        nest = ("[" * levels + "]" * levels).encode()
        return _line(traj, lambda o: o["steps"][0].update(state="@@")).replace(b'"@@"', nest)

    lines = [_line(t) for t in good] + [deep(extra[0], 500), deep(extra[1], 990)]
    report, kept, quarantined = _ingest_lines(tmp_path, lines)
    assert kept == [t.episode_id for t in good]
    assert sorted(quarantined) == [4, 5]
    assert all("nested too deeply" in r[0] for r in quarantined.values())
    assert report.n_lines == 5 and report.n_ingested + report.n_quarantined == 5


def test_f2_seed_beyond_int64_is_its_lines_error_not_a_late_crash(tmp_path) -> None:
    trajs = make_trajectories(4)

    def huge(obj):
        obj["steps"][0]["provenance"]["seed"] = 2**64

    report, kept, quarantined = _ingest_lines(tmp_path, [_line(t) for t in trajs[:3]] + [
        _line(trajs[3], huge)
    ])  # fmt: skip
    assert kept == [t.episode_id for t in trajs[:3]]
    assert any("provenance.seed" in r and "less than or equal" in r for r in quarantined[4])
    assert len(pd.read_parquet(tmp_path / "ingested" / TRANSITIONS_FILE)) == report.n_transitions


def test_f2_a_writer_failing_late_replaces_no_output(tmp_path, monkeypatch) -> None:
    _ingest_lines(tmp_path, [_line(t) for t in make_trajectories(3)])
    before = _snapshot(tmp_path / "ingested", tmp_path / "quarantine")

    def overflow(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", overflow)
    with pytest.raises(OverflowError):
        _ingest_lines(tmp_path, [_line(t) for t in make_trajectories(5, start=20)])
    assert _snapshot(tmp_path / "ingested", tmp_path / "quarantine") == before
    assert not _temps(tmp_path)


def test_f3_reused_transition_id_quarantines_only_the_later_line(tmp_path) -> None:
    a, b, c = make_trajectories(3)

    def reuse(obj):
        obj["steps"][0]["id"] = a.steps[0].id

    _, kept, quarantined = _ingest_lines(tmp_path, [_line(a), _line(b, reuse), _line(c)])
    assert kept == [a.episode_id, c.episode_id]
    assert list(quarantined) == [2]
    assert quarantined[2][0].startswith("duplicate transition id:") and ":1" in quarantined[2][0]


COERCIBLE = [  # a lax validator would turn each into a valid value
    ("success", "true"),
    ("truncated", "false"),
    ("provenance.iteration", "3"),
    ("provenance.seed", "3"),
    ("provenance.seed", 3.0),
    ("initial_state", 7),
]


def test_f4_types_are_never_coerced(tmp_path) -> None:
    trajs = make_trajectories(len(COERCIBLE) + 1)

    def edit(where: str, value):
        def apply(obj):
            if where.startswith("provenance."):
                obj["steps"][0]["provenance"][where.split(".")[1]] = value
            else:
                obj[where] = value

        return apply

    lines = [_line(t, edit(*case)) for t, case in zip(trajs, COERCIBLE, strict=False)]
    _, kept, quarantined = _ingest_lines(tmp_path, [*lines, _line(trajs[-1])])
    assert kept == [trajs[-1].episode_id]
    for line_no, (where, _) in enumerate(COERCIBLE, start=1):
        reasons = quarantined[line_no]
        assert any(r.startswith("schema:") and where.split(".")[-1] in r for r in reasons)


def test_f5_interrupted_first_build_is_rebuilt_with_a_message(
    tmp_path, ci_config, wordllama, caplog
) -> None:
    import lancedb
    import pyarrow as pa

    from components.buffer import build_buffer
    from components.buffer.store import BufferCorruptedError, ReplayBuffer

    buffer_dir = tmp_path / "buffer"
    # what a kill between the first transaction file and the first manifest leaves
    lancedb.connect(str(buffer_dir)).create_table("transitions", schema=pa.schema([("a", "int32")]))
    shutil.rmtree(buffer_dir / "transitions.lance" / "_versions")
    with pytest.raises(BufferCorruptedError, match=r"first build was interrupted.*build-buffer"):
        ReplayBuffer.open(buffer_dir, ci_config.buffer, embedder=wordllama, create=False)

    rows = [s for t in make_trajectories(6) for s in t.steps]
    with caplog.at_level(logging.WARNING):
        stats = build_buffer(ci_config, rows, buffer_dir, embedder=wordllama, splits=None)
    assert stats["inserted"] == len(rows)
    assert "first build of this buffer was interrupted" in caplog.text
    buf = ReplayBuffer.open(buffer_dir, ci_config.buffer, embedder=wordllama, create=False)
    assert buf.verify()["rows"] == len(rows)

    # a table whose manifests are gone but whose rows exist is never deleted silently
    shutil.rmtree(buffer_dir / "transitions.lance" / "_versions")
    with pytest.raises(BufferCorruptedError, match="no readable table version"):
        ReplayBuffer.open(buffer_dir, ci_config.buffer, embedder=wordllama)
    assert any((buffer_dir / "transitions.lance" / "data").iterdir())


@pytest.fixture
def no_tracking(monkeypatch):
    """The stages run without MLflow (its first database costs seconds per project)."""
    without_tracking(monkeypatch)


FS_ERRORS = [
    (errno.ENOSPC, "No space left on device"),
    (errno.EACCES, "Permission denied"),
    (errno.EROFS, "Read-only file system"),
]


def test_f6_disk_full_is_one_line_and_leaves_outputs_intact(
    tmp_path, monkeypatch, no_tracking
) -> None:
    import components.io as io

    _, paths = make_project(tmp_path, make_trajectories(4))
    ingest(sorted(paths.raw.glob("*.jsonl")), paths.ingested, paths.quarantine, CFG)
    write_jsonl(paths.raw / "more.jsonl", make_trajectories(3, start=30))
    before = _snapshot(paths.ingested, paths.quarantine)

    def full(path: Path, directory: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))  # on the temp file

    monkeypatch.setattr(io, "_fsync_path", full)
    result = _cli("ingest", "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path))
    line = _one_error_line(result, EXIT_ERROR)
    assert f"{paths.ingested / TRAJECTORIES_FILE}: No space left on device" in line
    assert "free some disk space" in line and "previous outputs are unchanged" in line
    assert _snapshot(paths.ingested, paths.quarantine) == before
    assert not _temps(tmp_path)


@pytest.mark.parametrize(("code", "text"), FS_ERRORS)
def test_f6_every_write_failure_keeps_outputs_and_maps_to_one_line(
    tmp_path, monkeypatch, code: int, text: str
) -> None:
    import components.io as io
    from components.cli_process import _known_error

    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, make_trajectories(3))
    ingest([raw], tmp_path / "ingested", tmp_path / "quarantine", CFG)
    before = _snapshot(tmp_path / "ingested", tmp_path / "quarantine")
    write_jsonl(raw, make_trajectories(5))

    real_open = os.open

    def fail(path, flags, *args, **kwargs) -> int:
        if str(path).endswith(TMP_SUFFIX):  # creating an output's temp file is refused
            raise OSError(code, text, str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(io.os, "open", fail)
    with pytest.raises(OSError) as info:
        ingest([raw], tmp_path / "ingested", tmp_path / "quarantine", CFG)
    monkeypatch.undo()
    assert info.value.filename == str(tmp_path / "ingested" / TRAJECTORIES_FILE)
    exit_code, message = _known_error(info.value)
    assert exit_code == EXIT_ERROR and text in message and "\n" not in message
    assert _snapshot(tmp_path / "ingested", tmp_path / "quarantine") == before
    assert not _temps(tmp_path)


def test_input_folder_named_jsonl_is_one_line(tmp_path, no_tracking) -> None:
    _, paths = make_project(tmp_path, make_trajectories(2))
    (paths.raw / "x.jsonl").mkdir()
    result = _cli("ingest", "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path))
    line = _one_error_line(result, EXIT_ERROR)
    assert "x.jsonl is a folder, not a JSONL file" in line
    assert not paths.ingested.exists()


@pytest.mark.parametrize(
    ("command", "output"),
    [
        ("collect", "data/raw"),  # F7
        ("annotate", "data/annotations"),  # F8
        ("build-buffer", "data/buffer"),
    ],
)
def test_f7_f8_second_run_on_the_same_outputs_fails_at_once(
    tmp_path, no_tracking, command: str, output: str
) -> None:
    _, paths = make_project(tmp_path, make_trajectories(2))
    paths.transitions_file.parent.mkdir(parents=True)
    paths.transitions_file.touch()  # build-buffer checks its input before locking
    paths.trajectories_file.touch()  # so does annotate
    with output_lock(tmp_path / output, command=command):  # the first run
        before = _snapshot(paths.data)
        result = _cli(command, "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path))
    line = _one_error_line(result, EXIT_BUSY)
    assert f"{tmp_path / output} is being written by another run" in line
    assert _snapshot(paths.data) == before  # nothing written twice


def test_f9_concurrent_ingest_waits_for_nobody_and_never_crashes(tmp_path, no_tracking) -> None:
    """A real second process holds data/ingested: ingest fails at once, then succeeds."""
    _, paths = make_project(tmp_path, make_trajectories(3))
    go, log = tmp_path / "go", tmp_path / "holder.log"
    holder = python_argv(
        "import sys, time\nfrom pathlib import Path\nfrom components.io import output_lock\n"
        "with output_lock(Path(sys.argv[1]), command='ingest'):\n"
        "    print('HELD', flush=True)\n"
        "    while not Path(sys.argv[2]).exists(): time.sleep(0.01)\n",
        str(paths.ingested),
        str(go),
    )
    proc = spawn(holder, child_env(), log)
    args = ("ingest", "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path))
    try:
        wait_until(lambda: b"HELD" in log.read_bytes(), proc, timeout=60, what="the lock")
        line = _one_error_line(_cli(*args), EXIT_BUSY)
        assert "data/ingested is being written by another run" in line
        assert not paths.ingested.exists()
    finally:
        go.touch()
        proc.wait(timeout=30)
    assert _cli(*args).exit_code == 0
    assert len(list(read_jsonl(paths.trajectories_file, Trajectory))) == 3


def test_f9_writers_of_one_file_never_share_a_temporary_name(tmp_path) -> None:
    target = tmp_path / "out" / "metrics.json"
    assert temp_path_for(target) != temp_path_for(target)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(40):
                atomic_write_text(target, json.dumps({"writer": n, "i": i}))
        except BaseException as err:  # a shared temp name used to crash one writer
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(target.read_text())["i"] == 39
    assert not _temps(tmp_path)


# -- config -------------------------------------------------------------------------------


def _params(tmp_path: Path, overrides=None, text: str | None = None, data: bytes | None = None):
    path = write_params(tmp_path, overrides)
    if text is not None:
        path.write_text(text)
    if data is not None:
        path.write_bytes(data)
    return path


CONFIG_CASES = {
    "yaml_syntax": (
        dict(text="profile: ci\ncollect: [1, 2\nseed: 0\n"),
        r"params\.yaml:\d+:\d+: YAML",
    ),
    "not_utf8": (dict(data=b"profile: ci\nseed: \xff\n"), r"params\.yaml:2: not UTF-8"),
    "duplicate_key": (
        dict(text="profile: ci\nseed: 0\nseed: 1\n"),
        "duplicate key 'seed' .*line 2",
    ),
    "profiles_list": (dict(text="profile: ci\nprofiles: {ci: [1, 2]}\n"), "profiles.ci: must be a"),
    "profiles_scalar": (dict(text="profile: ci\nprofiles: 3\n"), "profiles: must be a mapping"),
    "unknown_profile": (
        dict(text="profile: prod\n"),
        "unknown profile 'prod'; known: .*git checkout",
    ),
    "negative_episodes": (
        dict(overrides={"collect": {"episodes": {"noisy": -1}}}),
        r"collect\.episodes\.noisy: Input should be greater than or equal to 0 \(got -1\)",
    ),
    "no_episodes": (
        dict(overrides={"collect": {"episodes": {"expert": 0, "noisy": 0, "explore": 0}}}),
        "collect: Value error, episodes: at least one policy",
    ),
    "zero_workers": (dict(overrides={"collect": {"workers": 0}}), r"collect\.workers: Input"),
    "zero_max_steps": (dict(overrides={"env": {"max_steps": 0}}), r"env\.max_steps: Input"),
    "zero_games": (
        dict(overrides={"tasks": {"families": [{"name": "quest", "n_games": 0}]}}),
        r"tasks\.families\.0\.n_games: Input should be greater than or equal to 1",
    ),
    "bad_depth": (dict(overrides={"ingest": {"max_depth": 1}}), r"ingest\.max_depth"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_errors_are_one_line_naming_the_key(tmp_path, case: str) -> None:
    kwargs, pattern = CONFIG_CASES[case]
    path = _params(tmp_path, **kwargs)
    line = _one_error_line(_cli("config", "--params", str(path)), EXIT_CONFIG)
    assert re.search(pattern, line), line


def test_config_folder_and_unknown_cli_profile_are_one_line(tmp_path) -> None:
    line = _one_error_line(_cli("config", "--params", str(tmp_path)), EXIT_CONFIG)
    assert "is a folder, not a params file" in line
    path = _params(tmp_path)
    line = _one_error_line(_cli("config", "--params", str(path), "--profile", "prod"), EXIT_CONFIG)
    assert "--profile: unknown profile 'prod'; known: ['ci', 'cpu', 'gpu']" in line


def test_a_folder_output_is_swapped_in_whole(tmp_path, monkeypatch) -> None:
    # models/experience/full was removed before the new one was renamed in: a kill between
    # the two left no model at all. Now the old one is moved aside first: killed there,
    # the new folder is still staged and the old one kept beside it
    target, staged = tmp_path / "full", tmp_path / "full.tmp"
    for folder, text in ((target, "old"), (staged, "new")):
        folder.mkdir()
        (folder / "model.json").write_text(text)
    real_replace, calls = os.replace, []

    def killed_after_first(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        swap_dir(staged, target)
    monkeypatch.undo()
    kept = {p.name: (p / "model.json").read_text() for p in tmp_path.iterdir()}
    assert sorted(kept.values()) == ["new", "old"]  # nothing lost
    swap_dir(staged, target)
    assert (target / "model.json").read_text() == "new"
    swap_dir(target, tmp_path / "sub" / "fresh")  # no old one, a new parent
    assert (tmp_path / "sub" / "fresh" / "model.json").read_text() == "new"
