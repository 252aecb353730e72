"""The command-scoring policy: its memory and features, its interface, and that it learns."""

from __future__ import annotations

import math

import pytest

from components.agent.features import N_COMMAND_SCALARS, command_scalars
from components.agent.policy import Observation
from components.memory import VERBS, EpisodeMemory, instruction_steps

QUEST = (
    "Welcome to TextWorld! First, go east. Then, take the key from the table. "
    "And then, unlock the chest with the key. Once that's done, you win!"
)


def _state(room: str, things: str, inventory: str = "nothing", feedback: str = "Hi.") -> str:
    return (
        f"Location: {room}\nExits: east, west. {things}\n"
        f"Inventory: {inventory}\nFeedback: {feedback}"
    )


def test_instruction_steps_and_pointer_follow_the_executed_steps():
    assert instruction_steps(QUEST) == [
        "First, go east.",
        "Then, take the key from the table.",
        "And then, unlock the chest with the key.",
    ]
    start = _state("Hall", "On the table: a key.")
    mem = EpisodeMemory.replay(QUEST, start)
    assert mem.pointer == 0
    mem.update("examine table", _state("Hall", "On the table: a key."))  # changed nothing
    assert mem.pointer == 0
    mem.update("go east", _state("Vault", "On the table: a key."))
    assert mem.pointer == 1 and mem.exits[("Hall", "east")] == "Vault"
    mem.update("take key from table", _state("Vault", "Nothing is on the table.", "a key"))
    assert mem.pointer == 2 and mem.current_step.startswith("And then, unlock")
    # a command that matches the step but did not change the world does not advance
    mem.update("take key from table", _state("Vault", "Nothing is on the table.", "a key"))
    assert mem.pointer == 2 and mem.tried[("Vault", "take key from table")] == 2


def test_a_greeting_that_names_a_verb_does_not_stall_the_pointer():
    # TextWorld's greetings and verbs: "pick"/"put" in the greeting, "ditch" for drop,
    # "unlock the chest" without its key
    quest = (
        "Get ready to pick stuff up and put it in places, because you've just entered "
        "TextWorld! First, go east. Then, unlock the chest. After that, ditch the key on "
        "the floor of the vault. And if you do that, you're the winner!"
    )
    mem = EpisodeMemory.replay(quest, _state("Hall", "On the table: a key.", "a key"))
    assert len(mem.steps) == 4 and mem.pointer == 0
    mem.update("go east", _state("Vault", "The chest is locked.", "a key"))
    assert mem.pointer == 2  # the greeting is skipped
    mem.update("unlock chest with key", _state("Vault", "The chest is closed.", "a key"))
    assert mem.pointer == 3
    mem.update("drop key", _state("Vault", "The chest is closed. On the floor: a key."))
    assert mem.pointer == 4


def test_command_scalars_mark_the_next_step_and_what_was_tried():
    mem = EpisodeMemory.replay(QUEST, _state("Hall", "On the table: a key."))
    go, west = command_scalars(mem, "go east"), command_scalars(mem, "go west")
    assert len(go) == N_COMMAND_SCALARS
    next_overlap = len(VERBS) + 1  # the first feature after the verb one-hot
    assert go[next_overlap] == 1.0 and west[next_overlap] == 0.0
    mem.update("go west", _state("Garden", ""))
    mem.update("go east", _state("Hall", "On the table: a key."))
    back = command_scalars(mem, "go west")
    assert back[-6] == 1.0  # the destination of west from the Hall is known now


def test_a_namesake_is_not_the_thing_the_instruction_names():
    # "keycard" and "locker" are in the instruction only inside longer names
    from components.memory import EXACT, NAMESAKE, naming, object_phrases

    quest = (
        "First step, lift the type K keycard from the floor of the bedroom. Then, make "
        "it so that the type K locker is unlocked. Once that's done, you win!"
    )
    assert object_phrases("take type K keycard from table") == (
        ("type", "k", "keycard"),
        ("table",),
    )
    assert naming(("keycard",), quest) == NAMESAKE
    assert naming(("type", "k", "keycard"), quest) == EXACT
    room = _state("Bedroom", "On the floor: a keycard, a type K keycard.")
    mem = EpisodeMemory.replay(quest, room)
    wrong, right = command_scalars(mem, "take keycard"), command_scalars(mem, "take type K keycard")
    exact_step, exact_goal, namesake = len(VERBS) + 1 + 8, len(VERBS) + 1 + 9, len(VERBS) + 1 + 10
    assert [wrong[i] for i in (exact_step, exact_goal, namesake)] == [0.0, 0.0, 1.0]
    assert [right[i] for i in (exact_step, exact_goal, namesake)] == [1.0, 1.0, 0.0]
    # the namesake does not move the pointer; the thing itself does, then "unlock locker" not
    mem.update("take keycard", _state("Bedroom", "On the floor: a type K keycard.", "a keycard"))
    assert mem.pointer == 0
    mem.update("take type K keycard", _state("Bedroom", "", "a keycard, a type K keycard"))
    assert mem.pointer == 1
    mem.update("unlock locker with keycard", _state("Bedroom", "The locker is unlocked."))
    assert mem.pointer == 1


def test_the_frontier_is_the_nearest_room_with_an_exit_never_taken():
    def room(name: str, exits: str) -> str:
        return f"Location: {name}\nExits: {exits}.\nInventory: nothing\nFeedback: Hi."

    # Hall (east, south (closed door)) - east -> Den (west) : a dead end
    mem = EpisodeMemory.replay("Find the key.", room("Hall", "east, south (closed door)"))
    assert mem.frontier_distance("Hall") == 0
    mem.update("go east", room("Den", "west"))
    # the way back is known from the move itself, so the Den has nothing left to explore
    assert mem.exits[("Den", "west")] == "Hall"
    assert mem.frontier_distance("Den") == 1 and mem.frontier_distance("Hall") == 0
    west = command_scalars(mem, "go west")
    assert west[-2:] == [1.0, 0.0]  # toward the frontier, which is the Hall itself
    assert west[-3] == 0.0  # not an untried exit: the Hall is known
    mem.update("go west", room("Hall", "east, south (closed door)"))
    east_again = command_scalars(mem, "go east")
    assert east_again[-2] == 0.0 and east_again[-1] == pytest.approx(1 / 5)
    mem.update("go south", room("Hall", "east, south (closed door)"))  # tried: shut door
    assert mem.frontier_distance("Hall") == 5  # no frontier known: capped


def test_a_state_without_exits_has_no_frontier():
    # ScienceWorld and MiniWoB++ states list no exits: the frontier inputs stay constant
    from components.agent.features import context_scalars

    page = "Location: \nHere: a button ONE, a button TWO\nInventory: nothing\nFeedback: ."
    mem = EpisodeMemory.replay("Click ONE.", page)
    mem.update("click [3]", page)
    assert command_scalars(mem, "click [4]")[-2:] == [0.0, 0.0]
    assert context_scalars(mem, 10)[-2:] == [1.0, 0.0]


@pytest.fixture
def scorer():
    from components.agent.scorer import ScorerPolicy, ScorerSettings

    return ScorerPolicy(ScorerSettings(max_steps=10), seed=0)


def _obs(admissible: tuple[str, ...]) -> Observation:
    start = _state("Hall", "On the table: a key.")
    return Observation(QUEST, start, admissible=admissible, initial_state=start)


def test_features_are_the_same_whether_memory_is_extended_or_replayed(scorer):
    import numpy as np

    from components.agent.features import Featurizer

    adm = ("go east", "go west", "take key", "look")
    obs = [_obs(adm)]
    for action, room in (("go east", "Vault"), ("take key", "Vault"), ("go west", "Hall")):
        obs.append(obs[-1].then(action, _state(room, "A chest."), adm))
    shared = scorer.featurizer  # decides the episode in order: extends its last memory
    for o in obs:
        live = shared.decide(o)
        fresh = Featurizer(shared.encoder, shared.max_steps, shared.design).decide(o)
        assert np.array_equal(live.candidates, fresh.candidates)
        assert np.array_equal(live.context, fresh.context)
    assert shared.memory(obs[-1]).n_steps == 3 and shared.memory(obs[-1]).location == "Hall"
    assert shared.memory(obs[1]).location == "Vault"  # a prefix's memory was not changed


def test_on_a_page_the_features_tell_which_field_a_value_belongs_in(scorer):
    """login-user: the same value typed into Username or Password reads alike to the
    embeddings; the page scalars mark the field the instruction pairs it with."""
    import numpy as np

    from components.agent.features import N_PAGE_SCALARS, Featurizer
    from components.envs.miniwob_dom import Element, render_state

    form = render_state(
        [
            Element(7, "textbox", "Username", ""),
            Element(8, "password", "Password", ""),
            Element(9, "button", "Login"),
        ],
        "Loaded.",
    )
    asked = 'Enter the username "jess" and the password "u9W" into the text fields and press login.'
    adm = ('type [7] "jess"', 'type [8] "jess"', 'type [7] "u9W"', 'type [8] "u9W"', "click [9]")
    obs = Observation(asked, form, admissible=adm, initial_state=form)
    plain = scorer.featurizer
    page = Featurizer(plain.encoder, plain.max_steps, plain.design, page=True)
    wide, narrow = page.decide(obs).candidates, plain.decide(obs).candidates
    assert wide.shape[1] == narrow.shape[1] + N_PAGE_SCALARS == page.candidate_dim
    assert np.array_equal(wide[:, : narrow.shape[1]], narrow)  # other envs see what they saw
    as_asked = wide[:, -1]
    assert as_asked.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    # a text game's state is no page: a page featurizer would give it all-zero page scalars
    tw = page.decide(_obs(("go east", "look"))).candidates
    assert not tw[:, -N_PAGE_SCALARS:].any()


def test_act_logprobs_match_score_and_greedy_picks_the_best(scorer, one_thread):
    import torch

    torch.manual_seed(0)
    obs = [_obs(("go east", "go west", "look")), _obs(("take key from table", "look"))]
    acts = scorer.act(obs, temperature=1.0)
    assert all(a.action in o.admissible for a, o in zip(acts, obs, strict=True))
    assert all(not a.malformed and len(a.completion_ids) == 1 for a in acts)
    scores = scorer.score(acts, 1.0, with_entropy=True, with_hidden=True)
    assert scores.logprobs.shape == (2, 1) and scores.last_hidden.shape[0] == 2
    for a, lp in zip(acts, scores.logprobs.squeeze(1).tolist(), strict=True):
        assert a.logprobs[0] == pytest.approx(lp, abs=1e-5)
    assert float(scores.entropy[0, 0].detach()) <= math.log(3) + 1e-5
    greedy = scorer.act(obs, temperature=0.0)
    again = scorer.act(obs, temperature=0.0)
    assert [a.action for a in greedy] == [a.action for a in again]


def test_save_load_roundtrip(scorer, tmp_path, one_thread):
    from components.agent.loading import load_policy, save_policy

    save_policy(scorer, tmp_path / "p", {"method": "sft"})
    loaded = load_policy(tmp_path / "p")
    obs = [_obs(("go east", "go west", "look"))]
    a, b = scorer.act(obs, temperature=0.0), loaded.act(obs, temperature=0.0)
    assert a[0].action == b[0].action and a[0].logprobs[0] == pytest.approx(b[0].logprobs[0])


def test_the_scoring_policy_refuses_states_without_admissible_commands(scorer):
    with pytest.raises(ValueError, match="admissible"):
        scorer.act([_obs(())])


# --- learning on real TextWorld games -------------------------------------------------------


@pytest.fixture(scope="session")
def quest_games(tmp_path_factory):
    """12 short quests (difficulty 1-3): 8 train, 4 held out, with expert episodes."""
    from components.config.small import small_config
    from components.data.collect import collect
    from components.schema import Trajectory, read_jsonl
    from tests.integration.textworld_suite import games_pool, generate_shared

    root = tmp_path_factory.mktemp("quests")
    cfg = small_config(
        [("quest", 12, 1, 3)], seed=3, max_steps=10, split=(0.67, 0.0), splits=("train",)
    )
    tasks = generate_shared(cfg, root, games_pool(tmp_path_factory))
    collect(cfg, tasks, root / "raw", root, progress=False)
    trajs = [t for f in sorted((root / "raw").glob("*.jsonl")) for t in read_jsonl(f, Trajectory)]
    return cfg, root, tasks, trajs


@pytest.mark.integration
def test_sft_beats_the_random_admissible_policy_on_held_out_games(quest_games, one_thread):
    """Behaviour cloning of 8 games' expert steps wins unseen games of the same family far
    more often than picking uniformly among admissible commands (fixed seeds)."""
    import torch

    from components.agent.evaluate import held_out_tasks, run_episodes
    from components.agent.loading import Acting, RandomAdmissible
    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.scorer_training import expert_steps, train_sft
    from components.envs.textworld_env import TextWorldEnv

    cfg, root, tasks, trajs = quest_games
    demos, stats = expert_steps(trajs)
    assert stats["games"] == 8 and stats["steps"] >= 8
    policy = ScorerPolicy(ScorerSettings(max_steps=cfg.env.max_steps), seed=0)
    result = train_sft(policy, demos, epochs=20, learning_rate=1e-3, batch_size=32, seed=0)
    assert result["train_accuracy"] > 0.9
    test = held_out_tasks(tasks)
    assert len(test) == 4

    def success(actor) -> float:
        wins = []
        for seed in range(5):
            torch.manual_seed(seed)
            records = run_episodes(
                actor(seed), test, lambda: TextWorldEnv(cfg.env.max_steps, root, expert=False)
            )
            wins += [r.success for r in records]
        return sum(wins) / len(wins)

    sft = success(lambda seed: Acting(policy, 1.0))
    rand = success(RandomAdmissible)
    assert sft >= rand + 0.25, (sft, rand)


@pytest.mark.integration
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rl_trainers_update_the_scoring_policy(quest_games, algo, tmp_path, one_thread):
    """One short GRPO / PPO run on real games changes the weights through >= 1 update."""
    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.train import train_rl
    from components.curriculum.sampling import VarianceTaskSampler
    from components.envs.textworld_env import TextWorldEnv
    from tests.factories import grpo_config, ppo_config

    cfg, root, tasks, _ = quest_games
    train = [t for t in tasks if t.split == "train"]
    policy = ScorerPolicy(ScorerSettings(max_steps=cfg.env.max_steps), seed=1)
    before = [p.detach().clone() for p in policy.model.parameters()]
    common = {"iterations": 2, "learning_rate": 1e-3, "epochs": 2, "minibatch_size": 64}
    algo_cfg = (
        grpo_config(tasks_per_iteration=4, rollouts_per_task=4, **common)
        if algo == "grpo"
        else ppo_config(tasks_per_iteration=8, **common)
    )
    summary = train_rl(
        policy,
        lambda: TextWorldEnv(cfg.env.max_steps, root, expert=False),
        VarianceTaskSampler(train, seed=0),
        algo_cfg,
        tmp_path,
    )
    assert summary["optimizer_updates"] >= 1 and summary["real_steps"] > 0
    after = list(policy.model.parameters())
    assert any(not b.equal(a) for b, a in zip(before, after, strict=True))


@pytest.mark.integration
def test_the_sft_term_clones_the_expert_during_rl(quest_games, tmp_path, one_thread):
    """With ``sft_coef`` every GRPO minibatch also fits the expert's steps: a fresh policy
    ranks far more of them first after two rounds; without demonstrations it refuses."""
    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.scorer_training import accuracy, demo_loss_fn, expert_steps
    from components.agent.train import train_rl
    from components.envs.textworld_env import TextWorldEnv
    from tests.factories import grpo_config

    cfg, root, tasks, trajs = quest_games
    train = [t for t in tasks if t.split == "train"]
    demos, _ = expert_steps(trajs)
    policy = ScorerPolicy(ScorerSettings(max_steps=cfg.env.max_steps), seed=1)
    algo_cfg = grpo_config(
        iterations=2, tasks_per_iteration=8, rollouts_per_task=4, learning_rate=1e-3,
        epochs=4, minibatch_size=16, sft_coef=1.0,
    )  # fmt: skip
    env = lambda: TextWorldEnv(cfg.env.max_steps, root, expert=False)  # noqa: E731
    with pytest.raises(ValueError, match="demonstrations"):
        train_rl(policy, env, train, algo_cfg, tmp_path / "none")
    before = accuracy(policy, demos)
    summary = train_rl(
        policy, env, train, algo_cfg, tmp_path / "sft", demo_loss=demo_loss_fn(policy, demos, 32, 0)
    )
    assert summary["optimizer_updates"] >= 1
    assert accuracy(policy, demos) >= before + 0.2, (before, accuracy(policy, demos))


@pytest.mark.integration
def test_the_sft_term_keeps_dpo_from_lowering_the_expert_command(quest_games, one_thread):
    """Plain DPO widens the margin by lowering the chosen command too (its mass goes to
    commands no pair holds); with ``sft_weight`` the chosen command keeps its probability."""
    import copy

    import torch

    from components.agent.scorer import ScorerPolicy, ScorerSettings, collate
    from components.agent.scorer_training import (
        expert_steps,
        preference_pairs,
        train_dpo,
        train_sft,
    )

    cfg, _, _, trajs = quest_games
    demos, _ = expert_steps(trajs)
    sft = ScorerPolicy(ScorerSettings(max_steps=cfg.env.max_steps), seed=0)
    train_sft(sft, demos, epochs=5, learning_rate=1e-3, batch_size=32, seed=0)
    pairs = preference_pairs(demos, 3, seed=0)

    def chosen_logp(policy: ScorerPolicy) -> float:
        decisions = policy.decide([d.observation for d in demos])
        with torch.no_grad():
            logp = torch.log_softmax(policy.model(*collate(decisions))[0], -1)
        pairs_ = zip(decisions, demos, strict=True)
        idx = torch.tensor([dec.commands.index(d.action) for dec, d in pairs_])
        return float(logp.gather(1, idx.unsqueeze(1)).mean())

    out = {}
    for weight in (0.0, 1.0):
        policy = ScorerPolicy(
            sft.scorer_settings, encoder=sft.encoder, net=copy.deepcopy(sft.model)
        )
        result = train_dpo(
            policy, pairs, beta=0.1, epochs=30, learning_rate=3e-3, batch_size=16,
            sft_weight=weight, seed=0,
        )  # fmt: skip
        assert result["reward_accuracy"] > 0.5
        out[weight] = chosen_logp(policy)
    # the expert command's log-loss (mean -log p) at least halves with the term
    assert -out[1.0] < 0.5 * -out[0.0] and out[0.0] < -0.01, out


def test_a_resumed_run_with_the_sft_term_draws_the_uninterrupted_runs_batches(tmp_path):
    """The demonstrations' batch sampler is checkpointed: after a kill at round 3 and a
    resume from round 2, the weights equal an uninterrupted run's (they drifted when the
    sampler restarted from its seed)."""
    import copy

    import torch

    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.scorer_training import Demonstration, demo_loss_fn
    from components.agent.train import train_rl
    from tests.agent.rl_env import INSTRUCTION, START, WORDS, MagicWordEnv, magic_task
    from tests.factories import grpo_config

    torch.set_num_threads(1)
    demos = [
        Demonstration(f"t{i}", Observation(INSTRUCTION, f"{START} room {i}", (), WORDS), w)
        for i, w in enumerate(WORDS * 13)
    ]
    cfg = grpo_config(
        iterations=4, tasks_per_iteration=1, rollouts_per_task=4, learning_rate=1e-2, epochs=1,
        minibatch_size=None, save_every=2, sft_coef=1.0, drop_zero_std_groups=False,
    )  # fmt: skip
    base = ScorerPolicy(ScorerSettings(max_steps=2), seed=1)
    start = copy.deepcopy(base.model.state_dict())

    def run(out: str, crash_at: int | None = None) -> ScorerPolicy:
        policy = ScorerPolicy(ScorerSettings(max_steps=2), encoder=base.encoder, seed=1)
        policy.model.load_state_dict(start)

        def log(metrics: dict, step: int) -> None:
            if step == crash_at:
                raise KeyboardInterrupt

        train_rl(
            policy, lambda: MagicWordEnv(max_steps=2), [magic_task()], cfg, tmp_path / out,
            log_fn=log, demo_loss=demo_loss_fn(policy, demos, 4, 0),
        )  # fmt: skip
        return policy

    straight = run("a")
    with pytest.raises(KeyboardInterrupt):
        run("b", crash_at=3)
    resumed = run("b")
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(a[k].allclose(b[k], atol=1e-6) for k in a)
