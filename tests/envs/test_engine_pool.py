"""EnginePool: loaded TextWorld games kept for reuse, least recently returned closed first."""

from __future__ import annotations

from components.envs.textworld_env import EnginePool


class FakeEngine:
    """Stands in for a loaded game: only ``close`` is called by the pool."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def key(game: str) -> tuple[str, bool, str]:
    return (game, False, "compact")


def test_take_returns_an_idle_engine_of_the_same_game_once() -> None:
    pool = EnginePool(max_idle=4)
    a = FakeEngine("a")
    pool.give(key("a"), a)
    assert pool.take(key("b")) is None
    assert pool.take(key("a")) is a
    assert pool.take(key("a")) is None
    assert (pool.hits, pool.misses) == (1, 2)


def test_beyond_max_idle_the_least_recently_returned_engines_close() -> None:
    pool = EnginePool(max_idle=3)
    engines = [FakeEngine(f"g{i}") for i in range(5)]
    for i, e in enumerate(engines):
        pool.give(key(f"g{i % 2}"), e)  # g0, g1, g0, g1, g0: g1 was returned last but one
    closed = [e.name for e in engines if e.closed]
    assert len(closed) == 2
    kept = [e for e in engines if not e.closed]
    # every kept engine can be taken back, and nothing more
    taken = [pool.take(key("g0")), pool.take(key("g0")), pool.take(key("g1")), pool.take(key("g1"))]
    assert sorted(e.name for e in taken if e is not None) == sorted(e.name for e in kept)
    assert pool.take(key("g0")) is None


def test_close_closes_every_idle_engine_and_the_pool_refills() -> None:
    pool = EnginePool(max_idle=2)
    a, b = FakeEngine("a"), FakeEngine("b")
    pool.give(key("a"), a)
    pool.give(key("b"), b)
    pool.close()
    assert a.closed and b.closed
    c, d = FakeEngine("c"), FakeEngine("d")
    pool.give(key("c"), c)
    pool.give(key("d"), d)  # the count restarted at 0: two fit again
    assert not c.closed and not d.closed


def test_default_holds_a_grpo_round_for_every_train_game() -> None:
    # cpu profile: 160 train games x 4 rollouts per task must all stay loaded
    assert EnginePool().max_idle >= 160 * 4
