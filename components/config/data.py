"""Sections of the data side: real envs, task suites, collection, ingestion, buffer, teacher."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from components.config.base import _Section
from components.schema import Split

# textworld / scienceworld / miniwob run locally; the paper's three go through adapters
# (AgentGym-style HTTP env servers the user runs, see components/envs/agentgym_http.py)
AGENTGYM_ENVS = ("webshop", "alfworld", "webarena")
ENV_NAMES = ("textworld", "scienceworld", "miniwob", *AGENTGYM_ENVS)
PAGE_ENVS = ("miniwob",)  # states are rendered web pages (components/envs/miniwob_dom.py)
EnvName = Literal["textworld", "scienceworld", "miniwob", "webshop", "alfworld", "webarena"]
# won: 1 on the step that wins (the paper's outcome reward); score: the game's own score gain
# normalised by its max score (dense or balanced games keep their partial credit)
RewardMode = Literal["won", "score"]
SCORED_ENVS = ("textworld", "scienceworld")  # the envs whose engine keeps a score


class SplitCountsConfig(_Section):
    """How many task instances (variations, seeds) per split, for each task name."""

    train: int = Field(8, ge=1)
    validation: int = Field(2, ge=0)
    test: int = Field(3, ge=1, description="held out: never collected or trained on")


class ScienceWorldConfig(_Section):
    """ScienceWorld task suite (env.name = scienceworld): task types and variations."""

    task_names: tuple[str, ...] = Field(
        (
            "find-non-living-thing",
            "find-animal",
            "find-plant",
            "lifespan-longest-lived",
            "power-component",
            "chemistry-mix-paint-secondary-color",
        ),
        min_length=1,
        description="ScienceWorld task names (gold paths of 5-17 steps by default)",
    )
    variations: SplitCountsConfig = Field(
        # 8 train variations (48 demos) left SFT at 11% greedy on test; 30 give it 46% on
        # validation: which object is an animal / a plant is learned from demos alone.
        # 10 test variations (capped by each task's list): 3 left a +-9-point CI on gains
        SplitCountsConfig(train=30, validation=4, test=10),
        description="variations per task and split, from ScienceWorld's own train/dev/test lists",
    )
    simplifications: str = Field("", description="e.g. 'easy' or 'openDoors,teleportAction'")
    max_admissible: int = Field(40, ge=4, description="bound on the admissible-action list")


class MiniWoBConfig(_Section):
    """MiniWoB++ task suite (env.name = miniwob) in headless Debian Chromium."""

    task_names: tuple[str, ...] = Field(
        (
            "click-button-sequence",
            "enter-text",
            "enter-password",
            "login-user",
            "click-checkboxes",
            "choose-list",
            "click-option",
            "navigate-tree",
            "search-engine",
            "use-autocomplete-nodelay",
        ),
        min_length=1,
        description="MiniWoB++ task names (each has a scripted expert)",
    )
    seeds: SplitCountsConfig = Field(
        SplitCountsConfig(train=10, validation=2, test=4),
        description="episode seeds per task and split (disjoint seed ranges per split)",
    )
    max_elements: int = Field(20, ge=3, le=60, description="elements shown in the state")
    chrome_binary: str = Field("/usr/lib/chromium/chromium", description="Chromium binary")
    chromedriver: str = Field("/usr/bin/chromedriver", description="ChromeDriver binary")
    timeout_s: float = Field(30.0, gt=0, description="page load / script timeout")


class AgentGymConfig(_Section):
    """Adapters for WebShop / ALFWorld / WebArena served by AgentGym-style HTTP env servers."""

    url_env: str = Field(
        "AGENTGYM_URL", description="env var holding the server base URL (e.g. http://host:36001)"
    )
    base_url: str | None = Field(None, description="server base URL; overrides url_env")
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout")
    max_retries: int = Field(3, ge=0, description="retries of I/O failures (never of app errors)")
    backoff_s: float = Field(0.5, gt=0, description="first retry delay (doubles)")
    splits: dict[Literal["train", "validation", "test"], tuple[int, int]] = Field(
        {"train": (0, 200), "validation": (200, 250), "test": (250, 350)},
        description="[start, stop) item indices (session / game / config ids) per split",
    )
    browsergym: bool = Field(False, description="webarena through BrowserGym (if installed)")


class EnvConfig(_Section):
    """Which real environment the pipeline runs on, and each env's own settings."""

    name: EnvName = Field("textworld", description="real environment")
    max_steps: int = Field(20, ge=1, description="step limit per episode (then truncated)")
    reward: RewardMode = Field(
        "won",
        description="won: 1 on the step that wins the game, else 0; score: the game's own "
        "score gain / its max score (textworld, scienceworld); the step info logs both",
    )
    scienceworld: ScienceWorldConfig = ScienceWorldConfig()
    miniwob: MiniWoBConfig = MiniWoBConfig()
    agentgym: AgentGymConfig = AgentGymConfig()

    @model_validator(mode="after")
    def _scored(self) -> EnvConfig:
        if self.reward == "score" and self.name not in SCORED_ENVS:
            raise ValueError(f"reward: score needs an env that keeps a score {SCORED_ENVS}")
        return self


class TaskFamilyConfig(_Section):
    """One family of generated games."""

    name: Literal["quest", "cooking", "treasure"] = Field(description="generator family")
    n_games: int = Field(ge=1, description="games to generate for this family")
    instruction: Literal["walkthrough", "goal"] = Field(
        "walkthrough",
        description="walkthrough: TextWorld's objective, which spells out every step; goal: "
        "only its last sentence (what to get and where), so the agent has to explore",
    )
    min_difficulty: int = Field(1, ge=1, description="lowest difficulty (family-specific)")
    max_difficulty: int = Field(3, ge=1, description="highest difficulty (family-specific)")

    @model_validator(mode="after")
    def _ordered(self) -> TaskFamilyConfig:
        if self.min_difficulty > self.max_difficulty:
            raise ValueError("min_difficulty must be <= max_difficulty")
        return self


class SplitConfig(_Section):
    """Fractions of games per split; the rest of 1 - train - validation is the test split."""

    train: float = Field(0.55, gt=0, lt=1)
    validation: float = Field(0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _leaves_test(self) -> SplitConfig:
        if self.train + self.validation >= 1:
            raise ValueError("train + validation must leave room for a held-out test split")
        return self


class ExternalGamesConfig(_Section):
    """A folder or glob of TextWorld games made elsewhere (``.z8`` + ``.json``; no ``.ulx``)."""

    path: str = Field(
        min_length=1,
        description="folder (its *.z8 and *.ulx) or glob, relative to the project root",
    )
    split: Split = Field("test", description="split of every game found there")
    family: str = Field("external", min_length=1, description="family name of these tasks")


class ExternalTaskListConfig(_Section):
    """A JSONL file of tasks in the project's Task schema, for any env."""

    path: str = Field(min_length=1, description="JSONL file, relative to the project root")
    split: Split | None = Field(
        None, description="split of every task in it (None: each row's own split)"
    )


class ExternalTasksConfig(_Section):
    """Tasks a user brings: added to the task list, marked ``external``, never rewritten."""

    games: tuple[ExternalGamesConfig, ...] = Field(
        (), description="TextWorld game folders or globs (env.name = textworld)"
    )
    task_lists: tuple[ExternalTaskListConfig, ...] = Field(
        (), description="JSONL task lists; rows of another env than env.name are quarantined"
    )


class TasksConfig(_Section):
    """Deterministic task-suite generation (games are split by game, never by episode)."""

    families: tuple[TaskFamilyConfig, ...] = Field(description="families of games")
    split: SplitConfig = SplitConfig()
    workers: int = Field(2, ge=1, description="parallel game-generation processes")
    external: ExternalTasksConfig = Field(
        ExternalTasksConfig(), description="the user's own games and task lists"
    )


class CollectConfig(_Section):
    """Real trajectory collection: how many episodes per game and policy.

    Demonstrations are the scarce resource (as in the paper): only ``demo_games`` train
    games get the ``episodes`` mix (the expert among them); every other train game gets
    ``explore_episodes`` (random play: the offline logs the experience model learns the
    world from, no demonstration in them). Validation games get ``episodes``.
    """

    episodes: dict[Literal["expert", "noisy", "random", "explore"], Annotated[int, Field(ge=0)]] = (
        Field(description="episodes per demonstration (and validation) game for each policy")
    )
    demo_games: int | None = Field(
        20, ge=1, description="train games with demonstrations (None = every train game)"
    )
    explore_episodes: dict[
        Literal["expert", "noisy", "random", "explore"], Annotated[int, Field(ge=0)]
    ] = Field(
        default_factory=lambda: {"explore": 8},
        description="episodes per other train game for each policy",
    )
    epsilon: float = Field(0.3, ge=0, le=1, description="noisy policy: random-action rate")
    p_invalid: float = Field(
        0.05, ge=0, le=1, description="noisy/random: rate of inadmissible commands"
    )
    splits: tuple[Literal["train", "validation", "test"], ...] = Field(
        ("train", "validation"),
        description="splits to collect from; the test split is only for evaluation",
    )
    workers: int = Field(2, ge=1, description="parallel collection processes")
    round: int = Field(
        0,
        ge=0,
        description="collection round: a new round draws new episodes (new ids and seeds) on "
        "the same train/validation tasks and replaces the old ones; the nightly refresh bumps it",
    )

    @model_validator(mode="after")
    def _some_episodes(self) -> CollectConfig:
        if not any(self.episodes.values()):
            raise ValueError("episodes: at least one policy needs a count > 0")
        return self


class IngestConfig(_Section):
    """Validation bounds applied when raw trajectories are ingested."""

    max_line_bytes: int = Field(2_000_000, ge=1, description="longer JSONL lines are rejected")
    max_state_chars: int = Field(4000, ge=1, description="upper bound on state text length")
    max_action_chars: int = Field(200, ge=1, description="upper bound on action text length")
    max_depth: int = Field(
        32, ge=4, le=100, description="deeper-nested JSON lines are rejected before parsing"
    )


class BufferConfig(_Section):
    """The LanceDB replay buffer: embeddings, retrieval and the co-evolution cap."""

    embedder: Literal["minilm", "wordllama", "sentence-transformers"] = Field(
        "wordllama", description="minilm: packaged all-MiniLM-L6-v2; wordllama: fast static"
    )
    model_name: str | None = Field(
        None, description="sentence-transformers model name/path (embedder=sentence-transformers)"
    )
    batch_size: int = Field(256, ge=1, description="texts per embedding batch")
    k: int = Field(3, ge=0, description="transitions retrieved per query (0 = no replay)")
    synthetic_cap: int = Field(50_000, ge=0, description="max synthetic rows kept")
    eviction: Literal["oldest", "reservoir"] = Field(
        "oldest", description="how synthetic rows are evicted above the cap"
    )
    index_min_rows: int = Field(
        5_000, ge=256, description="build an ANN index from this many rows; exact below"
    )

    @model_validator(mode="after")
    def _model_named(self) -> BufferConfig:
        if self.embedder == "sentence-transformers" and not self.model_name:
            raise ValueError("embedder sentence-transformers needs model_name (a model or path)")
        return self


class TeacherConfig(_Section):
    """Teacher annotation of every transition with a reasoning trace."""

    backend: Literal["grounded", "openai", "hf"] = Field(
        "grounded", description="grounded: offline, from simulator ground truth"
    )
    model: str = Field("gpt-4o", description="model name for openai/hf backends")
    style: Literal["full", "concise"] = Field(
        "full", description="grounded: full trace, or a short one for small experience models"
    )
    base_url: str | None = Field(None, description="OpenAI-compatible server URL (vLLM etc.)")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the API key")
    concurrency: int = Field(8, ge=1, description="parallel requests (openai backend)")
    max_retries: int = Field(
        5, ge=0, description="retries on timeout/429/5xx/bad body/malformed answer"
    )
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout")
    max_cost_usd: float | None = Field(
        None, ge=0, description="per run: stop before a request that could exceed it"
    )
    history_len: int = Field(2, ge=0, description="previous steps shown to the teacher")
    max_tokens: int = Field(512, ge=1, description="max completion tokens per answer")
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0 = greedy)")
    batch_size: int = Field(8, ge=1, description="hf: sequences per generate call")
    backoff_base_s: float = Field(1.0, gt=0, description="first retry delay (doubles)")
    backoff_max_s: float = Field(60.0, gt=0, description="cap on one retry delay")
    price_input_per_mtok: float | None = Field(
        None, ge=0, description="USD per 1M prompt tokens (None: built-in table by model)"
    )
    price_output_per_mtok: float | None = Field(
        None, ge=0, description="USD per 1M completion tokens (None: built-in table by model)"
    )
