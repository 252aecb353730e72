"""Co-evolution: each iteration's synthetic experience joins the replay buffer.

After an RL iteration, its synthetic trajectories (``VectorSyntheticEnv.trajectories``
stamps ``Provenance.iteration`` and the policy ``checkpoint``) are appended to the buffer
and the resulting version is tagged ``iter-<i>``, so later iterations retrieve them and an
experiment can be replayed against the exact buffer each iteration saw
(``ReplayBuffer.checkout("iter-3")``). Appending is idempotent (the buffer merges on
transition ids), so a resumed iteration never writes twice; a resumed run first
``rewind``s the buffer to its last checkpointed iteration's tag, so what a killed run
appended after that is gone (never retrieved, never published). The "w/o replay"
ablation retrieves nothing and appends nothing (``coevolution_enabled``).

The seed buffer (``data/buffer``, a DVC output) is never written: a stage forks it into
its own output first (``fork_seed_buffer``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import AblationConfig, BufferConfig
from components.schema import Trajectory

if TYPE_CHECKING:
    from components.buffer.embedders import Embedder
    from components.buffer.store import ReplayBuffer

ITERATION_TAG = "iter-{iteration}"


def iteration_tag(iteration: int) -> str:
    """The buffer tag of an iteration's version, e.g. ``iter-3``."""
    return ITERATION_TAG.format(iteration=iteration)


def coevolution_enabled(ablation: AblationConfig) -> bool:
    """Whether synthetic experience is appended (not in the w/o-replay ablation)."""
    return not ablation.no_replay


@dataclass(frozen=True)
class CoevolutionResult:
    """What one iteration's append did."""

    iteration: int
    tag: str
    version: int
    trajectories: int
    offered: int
    inserted: int
    already_present: int
    evicted: int
    rows: int
    rows_synthetic: int

    def metrics(self) -> dict[str, float]:
        """Flat numbers for MLflow (prefixed by the caller)."""
        return {k: float(v) for k, v in self.__dict__.items() if k != "tag"}


def fork_seed_buffer(
    seed_dir: Path,
    work_dir: Path,
    cfg: BufferConfig,
    *,
    embedder: Embedder | None = None,
    fresh: bool = False,
) -> ReplayBuffer:
    """Open the stage's own copy of the seed buffer (forked on first use, or ``fresh``)."""
    from components.buffer import ReplayBuffer, fork_buffer

    if fresh or not (work_dir / "transitions.lance").exists():
        fork_buffer(seed_dir, work_dir, overwrite=True)
    return ReplayBuffer.open(work_dir, cfg, embedder=embedder, create=False)


def rewind(buffer: ReplayBuffer, iteration: int) -> bool:
    """Make the version tagged ``iter-<iteration>`` the newest again (a resumed run drops
    what a killed one appended, or evicted, after it); False without that tag."""
    version = buffer.tags().get(iteration_tag(iteration))
    if version is None:
        return False
    if buffer.version != version:
        buffer.restore(version)
    return True


def append_iteration(
    buffer: ReplayBuffer,
    trajectories: Iterable[Trajectory],
    iteration: int,
    *,
    overwrite_tag: bool = False,
) -> CoevolutionResult:
    """Add an iteration's synthetic transitions and tag the new version ``iter-<i>``."""
    trajs = list(trajectories)
    rows = []
    for traj in trajs:
        if traj.source != "synthetic":
            raise ValueError(f"episode {traj.episode_id}: only synthetic experience co-evolves")
        for s in traj.steps:
            if s.provenance.iteration != iteration:
                raise ValueError(
                    f"transition {s.id} is stamped iteration {s.provenance.iteration}, "
                    f"not {iteration}: use VectorSyntheticEnv.trajectories(iteration=...)"
                )
            rows.append(s)
    result = buffer.add(rows)
    tag = iteration_tag(iteration)
    version = buffer.tag(tag, overwrite=overwrite_tag)
    stats: dict[str, Any] = buffer.stats()
    return CoevolutionResult(
        iteration=iteration,
        tag=tag,
        version=version,
        trajectories=len(trajs),
        offered=len(rows),
        inserted=result.inserted,
        already_present=result.already_present,
        evicted=result.evicted,
        rows=int(stats["rows"]),
        rows_synthetic=int(stats["rows_synthetic"]),
    )
