"""The co-evolution cap: which synthetic rows (stored and incoming) are evicted.

Real rows are never evicted. ``oldest`` drops the lowest ``provenance.iteration`` first
(a hash-of-id key breaks ties inside one iteration); ``reservoir`` keeps the ``cap`` rows
with the smallest hash-of-id key (a bottom-k sketch). Either way the kept set depends only
on the set of rows offered, never on their order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.schema import Transition

Eviction = Literal["oldest", "reservoir"]


def reservoir_key(transition_id: str) -> int:
    """Deterministic pseudo-random 63-bit key of a transition id (eviction order)."""
    digest = hashlib.sha256(b"dreamgym-reservoir\x1f" + transition_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class EvictionPlan:
    """What the cap removes: incoming rows never to insert, stored rows to delete."""

    reject_new: frozenset[int]  # positions (in the new-row arrays) never to insert
    delete_where: str | None  # predicate removing existing synthetic rows
    n_delete: int


NO_EVICTION = EvictionPlan(frozenset(), None, 0)


def plan_eviction(
    cap: int,
    policy: Eviction,
    old_iteration: np.ndarray,
    old_rkey: np.ndarray,
    new_iteration: np.ndarray,
    new_rkey: np.ndarray,
) -> EvictionPlan:
    """Decide which synthetic rows (existing and incoming) the cap removes."""
    n_old, n_new = len(old_rkey), len(new_rkey)
    if n_old + n_new <= cap:
        return NO_EVICTION
    if cap == 0:
        where = "source = 'synthetic'" if n_old else None
        return EvictionPlan(frozenset(range(n_new)), where, n_old)
    is_new = np.concatenate([np.zeros(n_old, bool), np.ones(n_new, bool)])
    pos = np.concatenate([np.arange(n_old), np.arange(n_new)])
    key = np.concatenate([old_rkey, new_rkey]).astype(np.int64)
    if policy == "oldest":
        # Age = co-evolution iteration; inside one iteration the hash key breaks ties, so
        # the kept set depends only on which rows were offered, never on arrival order.
        it = np.concatenate([old_iteration, new_iteration]).astype(np.int64)
        order = np.lexsort((key, it))  # oldest first
        drop = order[: len(order) - cap]
        last = drop[-1]  # the youngest dropped row: everything at or below it goes
        i_t, k_t = int(it[last]), int(key[last])
        where = (
            f"source = 'synthetic' AND (iteration < {i_t} OR (iteration = {i_t} AND rkey <= {k_t}))"
        )
    elif policy == "reservoir":
        order = np.argsort(key, kind="stable")  # keep the smallest keys
        drop = order[cap:]
        threshold = int(key[order[cap - 1]])
        where = f"source = 'synthetic' AND rkey > {threshold}"
    else:
        raise ValueError(f"unknown eviction policy {policy!r}")
    reject = frozenset(int(pos[i]) for i in drop if is_new[i])
    n_delete = int(np.count_nonzero(~is_new[drop]))
    return EvictionPlan(reject, where if n_delete else None, n_delete)


def plan_add_eviction(
    cap: int,
    policy: Eviction,
    existing: pa.Table,
    new_rows: list[Transition],
    rkeys: np.ndarray,
) -> EvictionPlan:
    """``plan_eviction`` for an ``add``: stored keys vs the new rows (real ones never count)."""
    synth = existing.filter(pc.equal(existing["source"], "synthetic"))
    is_syn = np.array([t.source == "synthetic" for t in new_rows], dtype=bool)
    if not is_syn.any() and synth.num_rows <= cap:
        return NO_EVICTION
    syn_pos = np.flatnonzero(is_syn)
    plan = plan_eviction(
        cap,
        policy,
        synth["iteration"].to_numpy(),
        synth["rkey"].to_numpy(),
        np.array([new_rows[i].provenance.iteration for i in syn_pos], dtype=np.int64),
        rkeys[syn_pos],
    )
    # map positions among the synthetic newcomers back to positions among all newcomers
    reject = frozenset(int(syn_pos[j]) for j in plan.reject_new)
    return EvictionPlan(reject, plan.delete_where, plan.n_delete)
