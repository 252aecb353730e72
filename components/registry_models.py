"""Registered models as MLflow pyfunc models: load by URI, predict from a DataFrame.

A registered version (``experience-model``, ``policy``) is a pyfunc model whose one
artifact, ``model_dir``, is the saved model folder byte for byte (``models/...``); the
python model only adapts rows to the project's own loaders, so
``mlflow.pyfunc.load_model("models:/policy@champion")`` works from the project root
(the ``components`` package must be importable; nothing is installed or resolved at load).

Input rows (a DataFrame, a dict or a list of dicts), one decision or step each:

- experience model: ``instruction``, ``state``, ``action``; optional ``admissible``
  (list), ``history`` (list of ``[action, resulting state]`` from the episode's start),
  ``initial_state``, ``task_id``. Output: ``next_state``, ``reward``, ``done``,
  ``reasoning`` (``None`` everywhere for an answer the LM model got malformed).
- policy: ``instruction``, ``state``; optional ``admissible``, ``history``,
  ``initial_state``. Output: ``action``, ``malformed``. Greedy unless the load's
  ``model_config`` sets ``temperature``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# the classes must subclass PythonModel: this module is imported only when registering or
# loading a model (components/tracking.py imports it inside a function)
import mlflow.pyfunc

EXPERIENCE, POLICY = "experience", "policy"
KINDS = (EXPERIENCE, POLICY)
MODEL_DIR_ARTIFACT = "model_dir"
# the project's venv is the environment (load with env_manager "local"): no requirement
# inference at save (slow, imports optional packages) and no pip resolution at load
_PIP_REQUIREMENTS: list[str] = []


def _rows(model_input: Any) -> list[dict[str, Any]]:
    """Input rows as plain dicts (DataFrame, one dict, or a list of dicts)."""
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        return [dict(r) for r in model_input.to_dict(orient="records")]
    if isinstance(model_input, Mapping):
        return [dict(model_input)]
    return [dict(r) for r in model_input]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _strings(value: Any) -> tuple[str, ...] | None:
    """An optional list column (pandas may hand back an array, or NaN when absent)."""
    if _missing(value):
        return None
    return tuple(str(v) for v in value)


def _history(value: Any) -> tuple[tuple[str, str], ...]:
    if _missing(value):
        return ()
    return tuple((str(a), str(s)) for a, s in value)


def _required(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if _missing(value):
        raise ValueError(f"input row lacks {key!r}")
    return str(value)


class ExperienceModel(mlflow.pyfunc.PythonModel):
    """The experience model (grounded or LM) answering next state, reward and done."""

    def load_context(self, context: Any) -> None:
        """Load the saved folder with the project's own loader."""
        from components.experience.grounded import GroundedModel, is_grounded_dir

        path = Path(context.artifacts[MODEL_DIR_ARTIFACT])
        self.config = dict(context.model_config or {})
        self.grounded = GroundedModel.load(path) if is_grounded_dir(path) else None
        if self.grounded is None:
            from components.experience.dataset import PromptSettings
            from components.experience.sft import load_meta
            from components.lm.generate import Generator
            from components.lm.models import load_pretrained_dir

            model, tokenizer = load_pretrained_dir(path)
            self.generator = Generator(model, tokenizer)
            self.prompt = PromptSettings(**load_meta(path)["prompt"])

    # model_input is left unannotated: MLflow 3 turns a predict hint into a schema (and
    # warns that ``Any`` is not one); rows are checked by _rows/_required instead
    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        """One predicted step per input row (see the module docstring)."""
        import pandas as pd

        rows = _rows(model_input)
        out = self._grounded(rows) if self.grounded is not None else self._lm(rows)
        return pd.DataFrame(out, columns=["next_state", "reward", "done", "reasoning"])

    def _grounded(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from components.experience.grounded import Query
        from components.memory import EpisodeMemory
        from components.schema import Task

        queries = []
        for i, r in enumerate(rows):
            instruction, state = _required(r, "instruction"), _required(r, "state")
            task_id = r.get("task_id")
            task = Task(
                task_id=f"query-{i}" if _missing(task_id) else str(task_id),
                env="textworld",
                family="query",
                difficulty=0,
                split="test",
                instruction=instruction,
                seed=0,
            )
            initial = r.get("initial_state")
            memory = EpisodeMemory.replay(
                instruction,
                state if _missing(initial) else str(initial),
                _history(r.get("history")),
            )
            admissible = _strings(r.get("admissible")) or ()
            queries.append(Query(task, memory, state, _required(r, "action"), admissible))
        return [
            {
                "next_state": o.next_state,
                "reward": int(o.reward),
                "done": bool(o.won or o.lost),
                "reasoning": o.reasoning,
            }
            for o in self.grounded.predict_batch(queries)  # type: ignore[union-attr]
        ]

    def _lm(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from components.experience.format import (
            SYSTEM_PROMPT,
            MalformedOutputError,
            StepContext,
            parse_answer,
            render_prompt,
        )

        n, target = self.prompt.history_len, self.prompt.state_target
        contexts = [
            StepContext(
                instruction=_required(r, "instruction"),
                state=_required(r, "state"),
                action=_required(r, "action"),
                history=_history(r.get("history"))[-n:] if n > 0 else (),
            )
            for r in rows
        ]
        prompts = [
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": render_prompt(c, target)},
            ]
            for c in contexts
        ]
        texts = self.generator.generate(
            prompts,
            max_new_tokens=int(self.config.get("max_new_tokens", 256)),
            temperature=float(self.config.get("temperature", 0.0)),
        )
        out = []
        for ctx, text in zip(contexts, texts, strict=True):
            try:
                p = parse_answer(
                    text, self.prompt.with_reasoning, state=ctx.state, state_target=target
                )
            except MalformedOutputError:
                out.append({"next_state": None, "reward": None, "done": None, "reasoning": None})
                continue
            # the synthetic env ends an episode on reward 1 (components/experience)
            out.append(
                {
                    "next_state": p.next_state,
                    "reward": p.reward,
                    "done": p.reward == 1,
                    "reasoning": p.reasoning,
                }
            )
        return out


class PolicyModel(mlflow.pyfunc.PythonModel):
    """A trained policy (scorer or LM) answering one action per observation."""

    def load_context(self, context: Any) -> None:
        """Load the saved folder with the project's own loader."""
        from components.agent.loading import load_policy

        self.config = dict(context.model_config or {})
        self.policy = load_policy(Path(context.artifacts[MODEL_DIR_ARTIFACT]))

    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        """One action per input row (see the module docstring)."""
        import pandas as pd

        from components.agent.policy import Observation

        observations = [
            Observation(
                instruction=_required(r, "instruction"),
                state=_required(r, "state"),
                history=_history(r.get("history")),
                admissible=_strings(r.get("admissible")),
                initial_state=None if _missing(r.get("initial_state")) else str(r["initial_state"]),
            )
            for r in _rows(model_input)
        ]
        results = self.policy.act(
            observations,
            temperature=float(self.config.get("temperature", 0.0)),
            max_new_tokens=int(self.config.get("max_new_tokens", 64)),
        )
        return pd.DataFrame(
            [{"action": a.action, "malformed": a.malformed} for a in results],
            columns=["action", "malformed"],
        )


# models from code (no pickle): the model file only names the class; it is executed at
# load, so the project's ``components`` package must be importable (project root or venv)
_MODEL_CODE = """import mlflow.models

from components.registry_models import {cls}

mlflow.models.set_model({cls}())
"""


def save_pyfunc(local_dir: Path, kind: str, dst: Path) -> None:
    """Write a pyfunc model at ``dst`` wrapping the saved folder ``local_dir``."""
    import tempfile

    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; known: {KINDS}")
    cls = ExperienceModel if kind == EXPERIENCE else PolicyModel
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / f"{kind}_model.py"
        code.write_text(_MODEL_CODE.format(cls=cls.__name__), encoding="utf-8")
        mlflow.pyfunc.save_model(
            path=str(dst),
            python_model=str(code),
            artifacts={MODEL_DIR_ARTIFACT: str(local_dir)},
            pip_requirements=_PIP_REQUIREMENTS,
            metadata={"dreamgym.kind": kind},
        )


def model_folder(downloaded: Path) -> Path:
    """The saved model folder inside a downloaded version (itself for a plain folder)."""
    from mlflow.models import Model

    downloaded = Path(downloaded)
    if not (downloaded / "MLmodel").exists():
        return downloaded  # registered as a plain folder (no kind, or before the wrapper)
    conf = Model.load(str(downloaded / "MLmodel")).flavors["python_function"]
    return downloaded / conf["artifacts"][MODEL_DIR_ARTIFACT]["path"]


def raw_model_dir(model_uri: str, dst: Path | None = None) -> Path:
    """Download a registered version and return its saved model folder (as in models/)."""
    import mlflow.artifacts

    root = mlflow.artifacts.download_artifacts(
        model_uri, dst_path=None if dst is None else str(dst)
    )
    return model_folder(Path(root))
