"""The ``dreamgym`` commands that run DVC stages: one ``Stage`` row each, in ``STAGES``.

A row names the command, its stage function (``module:function`` under
components.stages, imported only when the command runs), its help and the parameters it
takes beside --params/--profile/--root; components/cli.py turns every row into a typer
command. Adding a stage is adding a row here and its entry in dvc.yaml.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer


@dataclass(frozen=True)
class Param:
    """A parameter of one command beside --params/--profile/--root, passed to its stage."""

    name: str  # the stage function's keyword
    annotation: Any  # Annotated[type, typer.Option(...) or typer.Argument(...)]
    default: Any = inspect.Parameter.empty  # empty: required
    choices: str | None = None  # "module:NAME" of the allowed values, checked before the run
    hint: str | None = None  # how the error names the parameter (None: it doesn't)
    last: bool = False  # listed after --params/--profile/--root (else before them)


@dataclass(frozen=True)
class Stage:
    """One DVC stage as a command: ``run`` is "module:function" under components.stages."""

    name: str
    run: str  # imported when the command runs: nothing heavy at start-up
    help: str
    params: tuple[Param, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)  # keywords always passed to ``run``


AlgoOpt = Annotated[str, typer.Option("--algo", help="RL algorithm: grpo or ppo")]
ALGO = Param("algo", AlgoOpt, "grpo", choices="components.artifacts:ALGOS", hint="--algo")
TrainAlgoOpt = Annotated[
    str | None,
    typer.Option(
        "--algo",
        help="RL algorithm: grpo or ppo (default: both, their seeds in one pool of processes)",
    ),
]
TRAIN_ALGO = Param("algo", TrainAlgoOpt, None, choices="components.artifacts:ALGOS", hint="--algo")
FRESH = Param(
    "fresh",
    Annotated[
        bool, typer.Option("--fresh", help="discard existing annotations instead of resuming")
    ],
    False,
    last=True,
)
VARIANT = Param(
    "variant",
    Annotated[
        str,
        typer.Option(
            help="full: the pipeline's model (registered as experience-model@candidate); "
            "no_reasoning / no_history / no_replay: one ablation on, for the fidelity table"
        ),
    ],
    "full",
    choices="components.artifacts:VARIANTS",
)
METHOD = Param(
    "method",
    Annotated[
        str,
        typer.Argument(
            help="random (the random-admissible baseline), sft, dpo, grpo_real, ppo_real, "
            "dreamgym_grpo, dreamgym_ppo, s2r_grpo, s2r_ppo"
        ),
    ],
    choices="components.agent.table1:METHODS",
)

FORCE_TASKS = Param(
    "force",
    Annotated[
        bool,
        typer.Option(
            "--force",
            help="overwrite data/tasks/tasks.jsonl even if generate-tasks did not write it",
        ),
    ],
    False,
    last=True,
)
EXTERNAL = (
    Param(
        "policy",
        Annotated[
            str,
            typer.Option(
                help="a saved policy folder, a method folder of seed-<s> folders, a method "
                "(sft, grpo_real ...: models/policy/<method>) or a registry alias "
                "(policy@candidate, policy@champion)"
            ),
        ],
    ),
    Param(
        "out",
        Annotated[Path, typer.Option(help="folder for success.json/.md, episodes, quarantine")],
    ),
    Param(
        "games",
        Annotated[
            list[str] | None,
            typer.Option("--games", help="folder or glob of TextWorld games (repeatable)"),
        ],
        None,
    ),
    Param(
        "tasks",
        Annotated[
            list[str] | None,
            typer.Option("--tasks", help="JSONL task list in the Task schema (repeatable)"),
        ],
        None,
    ),
    Param(
        "force",
        Annotated[
            bool,
            typer.Option("--force", help="overwrite files in --out this command did not write"),
        ],
        False,
        last=True,
    ),
)

TRANSFER = (
    Param(
        "source",
        Annotated[
            Path,
            typer.Option(
                help="the source env's project root (its models/policy/dreamgym_<algo>/seed-<s>, "
                "data/tasks, metrics/table1.json)"
            ),
        ],
    ),
    ALGO,
    Param(
        "out",
        Annotated[
            Path | None,
            typer.Option(help="the JSON to update (default: <root>/metrics/transfer.json)"),
        ],
        None,
    ),
    Param(
        "reward",
        Annotated[
            str | None,
            typer.Option(
                help="reward of the S2R leg in this env: won | score (the env's score gain, "
                "partial credit: textworld, scienceworld); default: params' env.reward"
            ),
        ],
        None,
        choices="components.stages.transfer:REWARDS",
        hint="--reward",
    ),
)

# in the order of `dreamgym --help` (dvc.yaml's order but for evaluate-policy/-random/-external)
STAGES: tuple[Stage, ...] = (
    Stage(
        "generate-tasks",
        "data:generate_tasks",
        "Generate the env's task suite (games + train/validation/test split by game)\n"
        "and add the external tasks of tasks.external.",
        (FORCE_TASKS,),
    ),
    Stage(
        "collect",
        "collect:collect",
        "Collect real trajectories (expert / noisy / random); resumable after interruption.",
    ),
    Stage(
        "ingest",
        "data:ingest",
        "Validate raw trajectories with Great Expectations; quarantine bad rows with reasons.",
    ),
    Stage(
        "build-buffer",
        "buffer:build_buffer",
        "Build the seed replay buffer (LanceDB) from real train-split transitions.",
    ),
    Stage(
        "annotate",
        "data:annotate",
        "Annotate every real transition with a teacher reasoning trace (resumable).",
        (FRESH,),
    ),
    Stage(
        "train-experience-model",
        "experience:train_experience_model",
        "Fit the experience model: grounded (cpu) or the SFT'd reasoning LM (resumable).",
        (VARIANT,),
    ),
    Stage(
        "evaluate-fidelity",
        "fidelity:evaluate_fidelity",
        "Fidelity of every trained variant on validation transitions (+ open-loop rollouts).",
    ),
    Stage(
        "train-sft",
        "agent:train_sft_baseline",
        "SFT baseline: clone the train-split steps of agent.sft.policies -> models/policy/sft.",
    ),
    Stage(
        "train-dpo",
        "agent:train_dpo_baseline",
        "DPO baseline from the SFT policy on offline preference pairs -> models/policy/dpo.",
    ),
    Stage(
        "train-rl-real",
        "rl:train_rl_real",
        "RL (GRPO and PPO) from the SFT policy in the real env -> models/policy/<algo>_real.",
        (TRAIN_ALGO,),
    ),
    Stage(
        "train-dreamgym",
        "rl:train_dreamgym",
        "DreamGym: GRPO and PPO in the synthetic env only (0 real steps) ->\n"
        "models/policy/dreamgym_<algo>.",
        (TRAIN_ALGO,),
    ),
    Stage(
        "train-s2r",
        "rl:train_s2r",
        "Sim-to-real: each DreamGym policy plays real train games under a hard cap of\n"
        "rl.s2r_real_fraction of real RL's steps; those probes re-ground the experience model\n"
        "and RL continues in it (rl.s2r_mode: reground; real_rl: RL on the real games)\n"
        "-> models/policy/s2r_<algo>.",
        (TRAIN_ALGO,),
    ),
    Stage(
        "evaluate-policy",
        "agent:evaluate_policy",
        "Every seed of models/policy/METHOD on the held-out test tasks, sampled and greedy ->\n"
        "data/eval/METHOD.jsonl (episodes) and metrics/eval/METHOD.json.",
        (METHOD,),
    ),
    Stage(
        "evaluate-random",
        "agent:evaluate_policy",
        "The random-admissible baseline on the held-out test tasks (same seeds, same step\n"
        "limit as every method) -> data/eval/random.jsonl and metrics/eval/random.json.",
        fixed={"method": "random"},  # components.artifacts.RANDOM
    ),
    Stage(
        "evaluate-external",
        "external:evaluate_external",
        "Any trained policy and the random baseline on your own games (--games) or task\n"
        "list (--tasks) -> --out/success.json and success.md (95% CIs), logged to MLflow.",
        EXTERNAL,
    ),
    Stage(
        "transfer",
        "transfer:transfer",
        "Cross-env transfer: another env's DreamGym policy (--source: that env's project) on\n"
        "this env's test tasks zero-shot and after S2R here -> metrics/transfer.json.",
        TRANSFER,
    ),
    Stage(
        "table1",
        "agent:build_table1",
        "Table 1 (success and real steps per method) -> metrics/table1.json and table1.md.",
    ),
    Stage(
        "judge",
        "evaluation:judge",
        "Judge synthetic experience per model variant (grounded replay, or an LLM judge).",
    ),
    Stage(
        "drift",
        "evaluation:drift",
        "Evidently drift reports: real vs synthetic transitions per co-evolution iteration.",
    ),
    Stage(
        "theorem1",
        "theorem1:theorem1",
        "Theorem-1 terms per DreamGym round (gains, KL, eps_R, eps_P) -> metrics/theorem1.json.",
    ),
    Stage(
        "policy-fidelity",
        "policy_fidelity:policy_fidelity",
        "Policy-level fidelity: SFT and DreamGym policies on the same train games in the\n"
        "dream and the real env, success per task family -> metrics/policy_fidelity.json.",
    ),
    Stage(
        "report",
        "evaluation:report",
        "Write reports/report.md and its plots from the metrics files; log them to MLflow.",
    ),
    Stage(
        "promote",
        "promote:promote",
        "After a run: experience-model@champion if the candidate's held-out fidelity beats\n"
        "the champion and the trivial baselines; policy@champion = Table 1's best held-out\n"
        "success if it beats random and the champion (the Prefect pipeline does the same).",
    ),
)
