"""EnginePool: loaded TextWorld games kept for reuse (least recently returned closed first)
and the answer trees of their command paths."""

from __future__ import annotations

from components.envs.textworld_engines import Answer, EnginePool


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


def answer(feedback: str) -> Answer:
    return Answer(feedback, "", "", ("look",), False, False, 0, 1)


def test_answers_are_kept_per_game_and_command_path() -> None:
    pool = EnginePool()
    assert pool.known(key("a")) is None
    root = pool.remember(key("a"), answer("start"))
    assert root is not None and pool.known(key("a")) is root
    assert pool.known(key("b")) is None  # another game (or expert/format) has its own tree
    east = pool.remember_after(root, "go east", answer("east"))
    assert east is not None and pool.known_after(root, "go east") is east
    assert pool.known_after(root, "go west") is None
    assert pool.known_after(east, "go east") is None  # a path, not a command
    assert (pool.answered, pool.n_answers) == (2, 2)


def test_beyond_max_answers_nothing_new_is_kept_and_the_known_stay() -> None:
    pool = EnginePool(max_answers=1)
    root = pool.remember(key("a"), answer("start"))
    assert root is not None
    assert pool.remember_after(root, "look", answer("looked")) is None
    assert pool.remember(key("b"), answer("other")) is None
    assert pool.known(key("a")) is root and pool.known(key("b")) is None
    pool.close()  # closing the engines keeps the answers: they stay true
    assert pool.known(key("a")) is root
