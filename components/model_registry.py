"""The MLflow model registry: register a stage's saved model folder, move and tag aliases.

Versions are registered from a stage run's artifacts (components/tracking.py ``StageRun``);
``name@alias`` names what the pipeline uses (``experience-model@candidate``, ``policy@sft``,
``...@champion``, moved only by the promotion rule in components/evaluation/promotion.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.tracking import StageRun


def register_model_dir(
    run: StageRun,
    local_dir: Path,
    name: str,
    aliases: tuple[str, ...] = (),
    artifact_path: str = "model",
    tags: Mapping[str, Any] | None = None,
    kind: str | None = None,
) -> str:
    """Log a saved model directory as run artifacts and register it; returns the version.

    With ``kind`` (components/registry_models.py KINDS) the version is a pyfunc model
    holding the folder as its artifact (``mlflow.pyfunc.load_model("models:/...")``);
    without it, the plain folder.
    """
    import tempfile

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if kind is None:
        run.log_artifact(local_dir, artifact_path)
    else:
        from components.registry_models import save_pyfunc

        with tempfile.TemporaryDirectory() as tmp:
            save_pyfunc(local_dir, kind, Path(tmp) / "pyfunc")
            run.log_artifact(Path(tmp) / "pyfunc", artifact_path)
    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    # register_model("runs:/...") fails for plain artifact dirs in MLflow 3 (API-NOTES §6)
    version = client.create_model_version(
        name,
        source=f"runs:/{run.run_id}/{artifact_path}",
        run_id=run.run_id,
        tags={k: str(v) for k, v in (tags or {}).items()},
    ).version
    for alias in aliases:
        client.set_registered_model_alias(name, alias, version)
    return str(version)


def tag_model_alias(name: str, alias: str, tags: Mapping[str, Any]) -> str | None:
    """Tag the version behind ``name@alias`` (inside an open stage run); its version or None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        version = client.get_model_version_by_alias(name, alias).version
    except MlflowException:
        return None
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value))
    return str(version)


def model_version_by_alias(name: str, alias: str) -> tuple[str, dict[str, str]] | None:
    """(version, tags) of ``name@alias``, or None when the model or the alias is missing."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        mv = MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return str(mv.version), dict(mv.tags or {})


def set_model_alias(name: str, alias: str, version: str) -> None:
    """Point ``name@alias`` at ``version`` (moves the alias if it is set elsewhere)."""
    from mlflow import MlflowClient

    MlflowClient().set_registered_model_alias(name, alias, version)


def download_model_version(name: str, alias: str, dst: Path) -> tuple[str, Path]:
    """(version, local folder) of the model directory registered as ``name@alias``."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        mv = MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException:
        raise FileNotFoundError(f"no registered model {name}@{alias} in this project") from None
    dst.mkdir(parents=True, exist_ok=True)
    local = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst))
    from components.registry_models import model_folder

    # a pyfunc version holds the folder as its artifact (components/registry_models.py)
    return str(mv.version), model_folder(Path(local))
