"""The one place that talks to MLflow tracking: runs, params, code and data versions, metrics.

Tracking uses a SQLite backend (``mlflow.db``) with artifacts under ``mlruns/``, one
experiment per stage family (``dreamgym-data``, ``dreamgym-buffer`` ...). A stage run is
nested under a pipeline run, in the pipeline's experiment (``dreamgym-pipeline``), when
``DREAMGYM_PARENT_RUN_ID`` is set (the Prefect flow sets it). Every run records the git
commit and the DVC md5 of the data it read. The model registry: components/model_registry.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.config import Config, Paths

PARENT_RUN_ENV = "DREAMGYM_PARENT_RUN_ID"
EXPERIMENT_PREFIX = "dreamgym"
_SECRET_MARKERS = ("api_key", "apikey", "secret", "password", "authorization")
# a token is secret as a name's last word (hf_token, access_token), not as a count or a
# metric (max_tokens, state_token_f1, tokenizer)
_SECRET_TOKEN = re.compile(r"(^|[_.-])token$")
REDACTED = "***"
DATASET_SAMPLE_ROWS = 100  # rows of a logged dataset kept in MLflow (its schema and profile)
DATASET_DIGEST_MAX_BYTES = 64 << 20  # larger datasets are not hashed (the DVC lock has them)


def tracking_uri(root: Path) -> str:
    """SQLite tracking URI for the project at ``root``."""
    return f"sqlite:///{(root / 'mlflow.db').resolve()}"


def _is_secret_key(key: str) -> bool:
    low = key.lower()
    # `api_key_env` names a variable, it is not a secret itself
    secret = any(m in low for m in _SECRET_MARKERS) or bool(_SECRET_TOKEN.search(low))
    return secret and not low.endswith("_env")


def flatten(data: Mapping[str, Any], prefix: str = "", redact: bool = True) -> dict[str, Any]:
    """Flatten nested mappings into dotted keys; secret-looking keys are redacted."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}.", redact))
        elif redact and _is_secret_key(str(key)):
            out[name] = REDACTED
        elif isinstance(value, list | tuple):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


def _md5_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def dvc_md5(path: Path) -> str:
    """The md5 DVC 3 records for ``path`` in dvc.lock (``<md5>.dir`` for directories)."""
    if path.is_file():
        return _md5_file(path)
    if not path.is_dir():
        raise FileNotFoundError(path)
    entries = [
        {"md5": _md5_file(p), "relpath": p.relative_to(path).as_posix()}
        for p in sorted(path.rglob("*"))
        if p.is_file()
    ]
    entries.sort(key=lambda e: e["relpath"])
    blob = json.dumps(entries, sort_keys=True).encode("utf-8")
    return hashlib.md5(blob).hexdigest() + ".dir"


# what a pipeline run itself rewrites (DVC's lock, metrics, reports): not "uncommitted code"
_RUN_OUTPUTS = ("dvc.lock", "metrics", "reports", "bench/results")


def git_commit(root: Path, *, params_ok: bool = False) -> tuple[str, bool]:
    """(commit sha or 'unknown', whether tracked files other than the pipeline's own
    outputs have uncommitted changes; ``params_ok``: params.yaml edits do not count, the
    caller records them with ``params_overrides``)."""
    excluded = (*_RUN_OUTPUTS, "params.yaml") if params_ok else _RUN_OUTPUTS
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                [
                    "git",
                    "status",
                    "--porcelain",
                    "--untracked-files=no",
                    "--",
                    ".",
                    *(f":(exclude){p}" for p in excluded),
                ],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        return sha, dirty
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown", True  # not a git checkout: nothing shows the code is committed


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def params_overrides(root: Path) -> dict[str, Any]:
    """Keys of params.yaml that differ from the committed one (``dvc exp run -S k=v``):
    ``{dotted.key: value}``, None for a removed key; {} outside git."""
    import yaml

    try:
        committed = subprocess.run(
            ["git", "show", "HEAD:params.yaml"], cwd=root, capture_output=True, check=True
        ).stdout
        head = _flat(yaml.safe_load(committed) or {})
        now = _flat(yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {})
    except (subprocess.CalledProcessError, FileNotFoundError, yaml.YAMLError):
        return {}
    return {k: now.get(k) for k in sorted(set(head) | set(now)) if head.get(k) != now.get(k)}


def run_provenance(root: Path, profile: str, env: str) -> dict[str, Any]:
    """A stage's metrics ``_provenance``: commit, dirty, profile, env and params overrides
    (another env is a ``dvc exp run -S`` override, not uncommitted code)."""
    sha, dirty = git_commit(root, params_ok=True)
    return {
        "git_commit": sha,
        "dirty": dirty,
        "profile": profile,
        "env": env,
        "params_overrides": params_overrides(root),
    }


def git_tags(root: Path) -> dict[str, str]:
    """A run's code tags, as ``run_provenance`` judges them: edits to params.yaml (a
    ``dvc exp run -S``, the nightly collection round) are not dirty code; they are tagged
    ``params.overrides``."""
    sha, dirty = git_commit(root, params_ok=True)
    tags = {"mlflow.source.git.commit": sha, "git.dirty": str(dirty).lower()}
    overrides = params_overrides(root)
    if overrides:  # MLflow caps a tag's value at 5,000 characters
        tags["params.overrides"] = json.dumps(overrides, sort_keys=True, default=str)[:4000]
    return tags


class StageRun:
    """An open MLflow run of one stage: log metrics, dicts, tables and artifacts."""

    def __init__(self, run_id: str, root: Path):
        self.run_id = run_id
        self.root = root

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log numeric metrics (nested keys flattened; non-numbers skipped)."""
        import mlflow

        flat = {  # numbers are never secrets: a redacted metric was silently dropped
            k: float(v)
            for k, v in flatten(metrics, redact=False).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if flat:
            mlflow.log_metrics(flat, step=step)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log extra params (flattened, secrets redacted)."""
        import mlflow

        mlflow.log_params({k: str(v)[:6000] for k, v in flatten(params).items()})

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Store a JSON/YAML-serialisable object as an artifact."""
        import mlflow

        mlflow.log_dict(data, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Store a text (markdown table, report) as an artifact."""
        import mlflow

        mlflow.log_text(text, artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Store a file or a directory as artifacts of the run."""
        import mlflow

        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path)
        else:
            mlflow.log_artifact(str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Attach tags to the run."""
        import mlflow

        mlflow.set_tags({k: str(v) for k, v in tags.items()})

    @contextmanager
    def child(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator[StageRun]:
        """A nested run (e.g. one training seed, with its per-step curves)."""
        import mlflow

        with mlflow.start_run(
            run_name=name, nested=True, tags={k: str(v) for k, v in (tags or {}).items()}
        ) as run:
            yield StageRun(run.info.run_id, self.root)

    def log_dataset(
        self,
        path: Path,
        name: str,
        context: str,
        sample: Path | None = None,
        rows: int = DATASET_SAMPLE_ROWS,
        digest: str | None = None,
    ) -> None:
        """Log ``path`` as an MLflow dataset input: its first ``rows`` rows, not the file.

        ``sample``: the JSONL/Parquet file the rows come from (default ``path``; a folder
        without it logs no rows). The digest is the md5 DVC records for ``path`` when it
        is at most ``DATASET_DIGEST_MAX_BYTES`` (larger ones: MLflow's digest of the rows)
        unless ``digest`` gives it.
        """
        import mlflow

        size = _size(path)
        df = _sample_frame(sample or path, rows)
        if digest is None and 0 < size <= DATASET_DIGEST_MAX_BYTES:
            digest = dvc_md5(path)
        try:
            source = path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            source = str(path)
        # MLflow warns about an ambiguous local source and integer columns: both harmless
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(df, source=source, name=name, digest=digest)
            tags = {"bytes": str(size), "sample_rows": str(len(df))}
            mlflow.log_input(dataset, context=context, tags=tags)

    def log_history(self, rows: Sequence[Mapping[str, Any]], step_key: str) -> None:
        """Per-step curves: every numeric field of each row at step ``row[step_key]``."""
        for i, row in enumerate(rows):
            self.log_metrics(
                {k: v for k, v in row.items() if k != step_key}, step=int(row.get(step_key, i + 1))
            )


# stages whose inputs are evaluation data (the MLflow dataset context), the rest train
_EVALUATION_STAGES = ("evaluate", "judge", "drift", "theorem1", "table1")


def _is_data(path: Path, root: Path) -> bool:
    """A data file or folder under ``root/data`` (models and policies are not datasets)."""
    try:
        path.resolve().relative_to((root / "data").resolve())
    except ValueError:
        return False
    return True


def _size(path: Path) -> int:
    """Bytes of a file or of every file under a folder (0 if missing)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are, a list by its length, a mapping as JSON."""
    if isinstance(value, list | tuple):
        return len(value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)[:200]
    return value


def _sample_frame(path: Path, rows: int) -> Any:
    """The first ``rows`` rows of a JSONL or Parquet file as a DataFrame (else empty)."""
    import pandas as pd

    if path.is_file() and path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            batch = next(pq.ParquetFile(path).iter_batches(batch_size=max(rows, 1)), None)
        except (pa.ArrowException, OSError):  # damaged: the stage reading it says so
            return pd.DataFrame()
        return batch.to_pandas().head(rows) if batch is not None else pd.DataFrame()
    records: list[dict[str, Any]] = []
    if path.is_file():
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if len(records) >= rows:
                    break
                try:
                    row = json.loads(line) if line.strip() else None
                except ValueError:
                    continue
                if isinstance(row, dict):
                    records.append({k: _cell(v) for k, v in row.items()})
    return pd.DataFrame.from_records(records)


def configure(root: Path) -> None:
    """Point MLflow at the project's SQLite store, quietly and offline."""
    import mlflow

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    ensure_store(root)
    mlflow.set_tracking_uri(tracking_uri(root))


def ensure_store(root: Path) -> None:
    """Create the project's SQLite store whole: built beside it, then renamed into place.

    MLflow builds its schema on first use in a few hundred statements; a stage killed in
    that window, or a second stage starting in it, left a half-built mlflow.db that failed
    every later stage ("table ... already exists"). A lock makes concurrent first stages
    wait for one build.
    """
    import fcntl

    db = Paths(root).mlflow_db
    if db.exists():
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(f".{db.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if db.exists():  # built by another process while this one waited
            return
        for stale in db.parent.glob(f".{db.name}.*.tmp"):  # builds killed midway
            stale.unlink(missing_ok=True)
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        try:
            _build_store(tmp, Paths(root).mlruns)
            os.replace(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)


def _build_store(path: Path, artifacts: Path) -> None:
    """MLflow's tracking and registry schema in a new SQLite file at ``path``."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{path.resolve()}"
    for store in (SqlAlchemyStore(uri, artifacts.resolve().as_uri()), RegistryStore(uri)):
        store.engine.dispose()  # every connection closed before the file is renamed


def experiment_id(root: Path, family: str) -> str:
    """Id of the ``dreamgym-<family>`` experiment, created with artifacts under mlruns/."""
    import mlflow

    name = f"{EXPERIMENT_PREFIX}-{family}"
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = (Paths(root).mlruns / name).resolve().as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


def parent_experiment_id(parent_run_id: str) -> str:
    """The experiment of a (pipeline) parent run."""
    from mlflow import MlflowClient

    return MlflowClient().get_run(parent_run_id).info.experiment_id


@contextmanager
def stage_run(
    stage: str,
    family: str,
    cfg: Config,
    sections: tuple[str, ...],
    root: Path,
    data: Mapping[str, Path] | None = None,
) -> Iterator[StageRun]:
    """Open an MLflow run for ``stage`` logging its params, code and data versions."""
    import mlflow

    configure(root)
    parent = os.environ.get(PARENT_RUN_ENV) or None
    # under a pipeline run the stage joins the parent's experiment: the MLflow UI nests
    # child runs only within one experiment; alone it goes to dreamgym-<family>
    exp_id = parent_experiment_id(parent) if parent else experiment_id(root, family)
    tags: dict[str, str] = {"stage": stage, "family": family, "profile": cfg.profile}
    tags |= git_tags(root)
    for name, path in (data or {}).items():
        tags[f"dvc.md5.{name}"] = dvc_md5(path) if path.exists() else "missing"
    with mlflow.start_run(
        experiment_id=exp_id,
        run_name=stage,
        tags=tags,
        parent_run_id=parent,
        nested=mlflow.active_run() is not None,  # in-process callers (flows, tests)
    ) as run:
        params: dict[str, Any] = {"profile": cfg.profile, "seed": cfg.seed}
        for s in sections:
            params[s] = cfg.section(s)
        tracked = StageRun(run.info.run_id, root)
        tracked.log_params(params)
        # the data it reads as MLflow datasets (a sample each; models are not datasets)
        context = "evaluation" if stage.startswith(_EVALUATION_STAGES) else "training"
        for name, path in (data or {}).items():
            if path.exists() and _is_data(path, root):
                tracked.log_dataset(path, name, context, digest=tags[f"dvc.md5.{name}"])
        yield tracked


@contextmanager
def pipeline_run(root: Path, name: str, params: Mapping[str, Any]) -> Iterator[str]:
    """Open the parent MLflow run of a pipeline execution; yields its run id."""
    import mlflow

    configure(root)
    tags = git_tags(root)
    with mlflow.start_run(
        experiment_id=experiment_id(root, "pipeline"), run_name=name, tags=tags
    ) as run:
        mlflow.log_params({k: str(v) for k, v in flatten(params).items()})
        yield run.info.run_id
