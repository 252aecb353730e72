"""Drift of synthetic from real transitions, with Evidently (one report per iteration).

Each transition becomes one row of features of what the experience model generated:

| feature | type | what |
|---|---|---|
| ``state_chars`` / ``action_chars`` | numeric | text lengths of the next state / action |
| ``state_ttr`` | numeric | type-token ratio of the next state's words (repetitiveness) |
| ``state_oov`` | numeric | share of next-state words outside the real vocabulary |
| ``reward`` | categorical | the reward (the reward rate) |
| ``action_verb`` | categorical | first word of the action (action types) |
| ``emb_dist`` | numeric | cosine distance of the next state's embedding to the real centroid |
| ``emb_pc<i>`` | numeric | projection on the i-th principal component of the real embeddings |

The real vocabulary is the words used by at least ``min_vocab_episodes`` distinct real
episodes, and real rows are scored against the same vocabulary, so an identical synthetic
set has the same OOV distribution as the real one. Evidently's ``DataDriftPreset`` picks a
stat test per column (K-S / Wasserstein for numbers, chi-square / Z-test for categories);
per-feature verdicts are read from its tests (``FAIL`` = drift), never by comparing values
whose direction differs per method. The overall flag is ``drift_share >= drift.drift_share``.
Evidently ~7 s to import: imported inside the functions.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from components.config import BufferConfig, DriftConfig
from components.schema import Transition

if TYPE_CHECKING:  # the buffer package imports LanceDB (~5 s): only its types here
    from components.buffer.embedders import Embedder

NUMERIC = ("state_chars", "action_chars", "state_ttr", "state_oov")
CATEGORICAL = ("reward", "action_verb")
EMB_DIST = "emb_dist"
MIN_ROWS = 5  # fewer rows on a side: no statistical test is meaningful
HASHING_DIM = 256
_WORD = re.compile(r"[a-z][a-z'-]*")
_FAIL = "FAIL"


class HashingEmbedder:
    """Signed feature hashing of unigrams and bigrams: no model, deterministic, fast."""

    def __init__(self, dim: int = HASHING_DIM) -> None:
        self._dim = dim

    @property
    def name(self) -> str:
        """Identity of the vector space."""
        return f"hashing:{self._dim}"

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit float32 rows of hashed word unigrams + bigrams."""
        from components.buffer.embedders import normalize_rows

        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for gram in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                # blake2b, not hash(): Python's string hash is salted per process
                h = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "big")
                out[i, h % self._dim] += 1.0 if (h >> 63) & 1 else -1.0
        return normalize_rows(out)


def make_drift_embedder(cfg: DriftConfig) -> Embedder | None:
    """The embedder named by ``drift.embedder`` (None: no embedding features)."""
    if cfg.embedder == "none":
        return None
    if cfg.embedder == "hashing":
        return HashingEmbedder()
    from components.buffer.embedders import make_embedder

    return make_embedder(BufferConfig(embedder=cfg.embedder))


def words(text: str) -> list[str]:
    """Lower-case words of a text."""
    return _WORD.findall(text.lower())


def real_vocabulary(real: Iterable[Transition], min_episodes: int) -> frozenset[str]:
    """Words that at least ``min_episodes`` distinct real episodes use in their states."""
    episodes: dict[str, set[str]] = defaultdict(set)
    for t in real:
        episodes[t.episode_id].update(words(t.state), words(t.next_state))
    df: Counter[str] = Counter()
    for vocab in episodes.values():
        df.update(vocab)
    return frozenset(w for w, n in df.items() if n >= min_episodes)


def text_features(t: Transition, vocabulary: frozenset[str]) -> dict[str, Any]:
    """The non-embedding features of one transition."""
    ws = words(t.next_state)
    action = words(t.action)
    return {
        "state_chars": float(len(t.next_state)),
        "action_chars": float(len(t.action)),
        "state_ttr": len(set(ws)) / len(ws) if ws else 0.0,
        "state_oov": sum(w not in vocabulary for w in ws) / len(ws) if ws else 0.0,
        "reward": str(t.reward),
        "action_verb": action[0] if action else "<none>",
    }


def _subsample(rows: Sequence[Transition], n: int, seed: int) -> list[Transition]:
    ordered = sorted(rows, key=lambda t: t.id)  # input order must not change the sample
    return ordered if len(ordered) <= n else random.Random(seed).sample(ordered, n)


@dataclass(frozen=True)
class EmbeddingBasis:
    """The real embeddings' centroid and principal axes: computed once per drift run."""

    centroid: np.ndarray
    unit: np.ndarray  # the centroid's direction
    axes: np.ndarray  # (k, dim): the first k right singular vectors

    @classmethod
    def of(cls, real_vecs: np.ndarray, n_components: int) -> EmbeddingBasis:
        """The basis of ``real_vecs`` (SVD of the centred matrix)."""
        centroid = real_vecs.mean(axis=0)
        norm = float(np.linalg.norm(centroid)) or 1.0
        k = min(n_components, real_vecs.shape[0] - 1, real_vecs.shape[1])
        axes = np.zeros((0, real_vecs.shape[1]), dtype=real_vecs.dtype)
        if k > 0:
            axes = np.linalg.svd(real_vecs - centroid, full_matrices=False)[2][:k]
        return cls(centroid, centroid / norm, axes)

    def features(self, vecs: np.ndarray) -> dict[str, np.ndarray]:
        """Distance to the real centroid and the projections on the real axes."""
        out = {EMB_DIST: (1.0 - vecs @ self.unit).astype(float)}
        for i, axis in enumerate(self.axes):
            out[f"emb_pc{i + 1}"] = ((vecs - self.centroid) @ axis).astype(float)
        return out


class Reference(NamedTuple):
    """The real side of every report: its feature frame, embedding basis, vocabulary."""

    frame: Any
    basis: EmbeddingBasis | None
    vocabulary: frozenset[str]


@cache
def _embedder(name: str) -> Embedder | None:
    # one per process: a worker builds it once for all the reports it runs
    return make_drift_embedder(DriftConfig(embedder=name))


def _frame(rows: Sequence[Transition], vocabulary: frozenset[str]) -> Any:
    """The text features of ``rows`` (no embedding columns)."""
    import pandas as pd

    return pd.DataFrame([text_features(t, vocabulary) for t in rows])


def reference_features(
    real: Sequence[Transition], cfg: DriftConfig, vocabulary: frozenset[str] | None = None
) -> Reference:
    """The real side's features (a seeded subsample), computed once per drift run."""
    vocab = vocabulary if vocabulary is not None else real_vocabulary(real, cfg.min_vocab_episodes)
    rows = _subsample(real, cfg.max_rows, cfg.seed)
    frame = _frame(rows, vocab)
    embedder = _embedder(cfg.embedder)
    if embedder is None or not rows:
        return Reference(frame, None, vocab)
    vecs = embedder.embed([t.next_state for t in rows])
    basis = EmbeddingBasis.of(vecs, cfg.embedding_components)
    for name, values in basis.features(vecs).items():
        frame[name] = values
    return Reference(frame, basis, vocab)


def current_features(
    synthetic: Sequence[Transition], cfg: DriftConfig, reference: Reference
) -> Any:
    """The synthetic side's features (a seeded subsample), in the reference's columns."""
    rows = _subsample(synthetic, cfg.max_rows, cfg.seed)
    frame = _frame(rows, reference.vocabulary)
    embedder = _embedder(cfg.embedder)
    if embedder is not None and reference.basis is not None and rows:
        vecs = embedder.embed([t.next_state for t in rows])
        for name, values in reference.basis.features(vecs).items():
            frame[name] = values
    return frame


def side_stats(frame: Any) -> dict[str, Any]:
    """Plain means of a feature frame (reward rate, lengths, vocabulary) for the summary."""
    if len(frame) == 0:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(frame), "reward_rate": float((frame["reward"] == "1").mean())}
    for col in frame.columns:
        if col not in CATEGORICAL:
            out[f"{col}_mean"] = float(frame[col].mean())
    verbs = frame["action_verb"].value_counts(normalize=True).head(5)
    out["top_action_verbs"] = {str(k): round(float(v), 4) for k, v in verbs.items()}
    return out


def _test_verdicts(snapshot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per column: drifted (the test's FAIL), method, score and threshold."""
    values = {
        m["config"].get("column"): m
        for m in snapshot["metrics"]
        if m["config"].get("type", "").endswith("ValueDrift")
    }
    out: dict[str, dict[str, Any]] = {}
    for test in snapshot.get("tests", []):
        params = test.get("metric_config", {}).get("params", {})
        column = params.get("column")
        if column is None or not params.get("type", "").endswith("ValueDrift"):
            continue
        metric = values.get(column, {})
        score = metric.get("value")
        out[column] = {
            "drifted": test.get("status") == _FAIL,
            "method": params.get("method"),
            "threshold": params.get("threshold"),
            "score": None if score is None or score != score else float(score),  # NaN -> None
        }
    return out


def _drift_share(snapshot: dict[str, Any]) -> tuple[float, int]:
    for m in snapshot["metrics"]:
        if m["config"].get("type", "").endswith("DriftedColumnsCount"):
            return float(m["value"]["share"]), int(m["value"]["count"])
    raise ValueError("the Evidently snapshot has no DriftedColumnsCount metric")


def run_drift(
    real: Sequence[Transition],
    synthetic: Sequence[Transition],
    cfg: DriftConfig,
    html_path: Path | None = None,
    *,
    reference: Reference | None = None,
    html_only_if_drifted: bool = False,
) -> dict[str, Any]:
    """Evidently drift report of synthetic vs real transitions: summary dict (+ HTML file).

    ``reference``: ``reference_features`` of ``real``, reused across calls.
    ``html_only_if_drifted``: write the HTML only when the drift flag is raised.
    """
    reference = reference or reference_features(real, cfg)
    cur = current_features(synthetic, cfg, reference)
    return evidently_drift(reference.frame, cur, cfg, html_path, html_only_if_drifted)


def _iteration_report(
    synthetic: Sequence[Transition],
    reference: Reference,
    cfg: DriftConfig,
    html_path: Path,
    html_only_if_drifted: bool,
) -> dict[str, Any]:
    # a worker job: the features (embeddings are most of a report's time) and the report
    cur = current_features(synthetic, cfg, reference)
    return evidently_drift(reference.frame, cur, cfg, html_path, html_only_if_drifted)


def evidently_drift(
    ref: Any,
    cur: Any,
    cfg: DriftConfig,
    html_path: Path | None = None,
    html_only_if_drifted: bool = False,
) -> dict[str, Any]:
    """``run_drift`` on feature frames already built (picklable: runs in a worker process)."""
    summary: dict[str, Any] = {
        "n_reference": len(ref),
        "n_current": len(cur),
        "reference": side_stats(ref),
        "current": side_stats(cur),
    }
    if len(ref) < MIN_ROWS or len(cur) < MIN_ROWS:
        return {
            **summary,
            "skipped": f"fewer than {MIN_ROWS} transitions on a side",
            "drift_share": None,
            "drifted": None,
        }
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    numeric = [c for c in ref.columns if c not in CATEGORICAL]
    definition = DataDefinition(numerical_columns=numeric, categorical_columns=list(CATEGORICAL))
    preset = DataDriftPreset(
        drift_share=cfg.drift_share,
        num_method=cfg.num_method,
        cat_method=cfg.cat_method,
        threshold=cfg.threshold,
    )
    # include_tests on the Report: the preset's own flag alone emits no tests (API-NOTES §7)
    report = Report([preset], include_tests=True)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # Evidently correlates the numeric columns: a constant one divides by zero (harmless)
        warnings.simplefilter("ignore", RuntimeWarning)
        snap = report.run(
            reference_data=Dataset.from_pandas(ref, data_definition=definition),
            current_data=Dataset.from_pandas(cur, data_definition=definition),
        )
    data = snap.dict()
    share, count = _drift_share(data)
    features = _test_verdicts(data)
    drifted = share >= cfg.drift_share
    # one report is ~4 MB and ~1 s to render: an undrifted middle iteration needs neither
    if html_path is not None and (drifted or not html_only_if_drifted):
        html_path.parent.mkdir(parents=True, exist_ok=True)
        snap.save_html(str(html_path))
        summary["html"] = str(html_path)
    return {
        **summary,
        "drift_share": share,
        "n_drifted": count,
        "n_features": len(features),
        "drifted": drifted,
        "threshold_share": cfg.drift_share,
        "features": features,
    }


def by_iteration(transitions: Iterable[Transition]) -> dict[int, list[Transition]]:
    """Synthetic transitions grouped by their co-evolution iteration (provenance)."""
    groups: dict[int, list[Transition]] = defaultdict(list)
    for t in transitions:
        groups[t.provenance.iteration].append(t)
    return dict(sorted(groups.items()))


def drift_by_iteration(
    real: Sequence[Transition],
    synthetic: Sequence[Transition],
    cfg: DriftConfig,
    out_dir: Path,
    *,
    run_jobs: Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]] | None = None,
) -> dict[str, Any]:
    """One report per iteration; summaries + overall flag (``drift_by_run`` of one run)."""
    return drift_by_run(real, {"": synthetic}, cfg, out_dir, run_jobs=run_jobs)[""]


def drift_by_run(
    real: Sequence[Transition],
    runs: Mapping[str, Sequence[Transition]],
    cfg: DriftConfig,
    out_dir: Path,
    *,
    run_jobs: Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per synthetic run: one report per iteration, summaries + overall flag.

    The HTML (``out_dir/<run>/drift_iter<k>.html``) is kept for the first, the last and
    every flagged iteration; the others say why they have none (``report_note``). The real
    side's features and embedding basis are built once, here; each iteration's features
    and report are one job of ``run_jobs(fn, jobs)``, which runs every run's jobs in one
    call (one worker pool: embedding the synthetic states is most of the work); default:
    one after the other, here.
    """
    reference = reference_features(real, cfg)
    keys: list[tuple[str, int]] = []
    jobs: list[tuple[Any, ...]] = []
    for name, synthetic in runs.items():
        groups = by_iteration(synthetic)
        ends = {min(groups, default=0), max(groups, default=0)}
        for it, rows in groups.items():
            keys.append((name, it))
            html = out_dir / name / f"drift_iter{it}.html"
            jobs.append((rows, reference, cfg, html, it not in ends))
    if run_jobs is None:
        results = [_iteration_report(*job) for job in jobs]
    else:
        results = run_jobs(_iteration_report, jobs)
    iterations: dict[str, dict[str, Any]] = {name: {} for name in runs}
    for (name, it), result in zip(keys, results, strict=True):
        if result.get("drift_share") is not None and "html" not in result:
            result["html"] = None
            result["report_note"] = "not kept (no drift; first, last and flagged iterations are)"
        iterations[name][str(it)] = result
    out: dict[str, dict[str, Any]] = {}
    for name, its in iterations.items():
        flags = [r["drifted"] for r in its.values() if r.get("drifted") is not None]
        out[name] = {
            "iterations": its,
            "drifted": any(flags),
            "n_iterations": len(its),
            "n_drifted_iterations": sum(flags),
        }
    return out


def drift_metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics-file view of ``drift_by_iteration``: per iteration drift_share, drifted."""
    return {
        f"iter_{it}": {
            "drift_share": r.get("drift_share"),
            "drifted": r.get("drifted"),
            "n_drifted": r.get("n_drifted"),
            "n_transitions": r.get("n_current"),
        }
        for it, r in result["iterations"].items()
    }


def index_html(runs: Mapping[str, Mapping[str, Any]], index_path: Path, threshold: float) -> str:
    """One HTML page over every run's iterations, linking each Evidently report."""
    import html
    import os

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return html.escape("n/a" if value is None else str(value))

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Drift of synthetic "
        "experience</title><style>body{font-family:sans-serif;margin:2em}table{border-"
        "collapse:collapse;margin-bottom:2em}td,th{border:1px solid #ccc;padding:4px 8px}"
        ".drift{background:#fdd}</style></head><body>",
        "<h1>Drift of synthetic from real transitions (Evidently)</h1>",
        f"<p>An iteration is flagged when the share of drifted features is &ge; {threshold}.</p>",
    ]
    for run, result in runs.items():
        flag = "drift flagged" if result.get("drifted") else "no drift flagged"
        parts.append(f"<h2>{html.escape(run)}: {flag}</h2>")
        parts.append(
            "<table><tr><th>iteration</th><th>synthetic transitions</th><th>drift share</th>"
            "<th>drifted</th><th>drifted features</th><th>report</th></tr>"
        )
        for it, r in result.get("iterations", {}).items():
            features = sorted(k for k, v in (r.get("features") or {}).items() if v["drifted"])
            link = "skipped: " + str(r["skipped"]) if r.get("skipped") else "n/a"
            link = html.escape(r.get("report_note") or link)
            if r.get("html"):
                href = os.path.relpath(r["html"], index_path.parent)
                link = f"<a href='{html.escape(href)}'>Evidently report</a>"
            row_class = " class='drift'" if r.get("drifted") else ""
            parts.append(
                f"<tr{row_class}><td>{cell(it)}</td><td>{cell(r.get('n_current'))}</td>"
                f"<td>{cell(r.get('drift_share'))}</td><td>{cell(r.get('drifted'))}</td>"
                f"<td>{cell(', '.join(features) or '-')}</td><td>{link}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    text = "\n".join(parts)
    index_path.parent.mkdir(parents=True, exist_ok=True)
    index_path.write_text(text, encoding="utf-8")
    return text
