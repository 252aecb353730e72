"""transfer checks --out before it trains and records the target run's provenance; theorem1
measures the seed its method trained and records its run's provenance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.config import Config, Paths, load_config
from components.io import InputError
from components.schema import write_jsonl
from tests.factories import make_task

ROOT = Path(__file__).resolve().parents[2]


def _git_project(root: Path) -> str:
    """``root`` as a committed git project holding params.yaml; its HEAD."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "params.yaml"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "project"], cwd=root, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return head.stdout.strip()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_transfer_refuses_a_bad_out_before_anything_else(tmp_path: Path, content: str):
    # it was read only after every seed had trained and played
    from components.stages.transfer import transfer

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    out = tmp_path / "transfer.json"
    out.write_text(content)
    with pytest.raises(InputError, match=f"--out {out}: not"):
        transfer(cfg, Paths(tmp_path / "target"), tmp_path / "no-source", "grpo", out)
    assert out.read_text() == content
    with pytest.raises(InputError, match="is a folder"):
        transfer(cfg, Paths(tmp_path / "target"), tmp_path / "no-source", "grpo", tmp_path)


def test_transfer_records_the_target_runs_provenance(tmp_path: Path, monkeypatch):
    import components.stages.parallel as parallel
    import components.tracking
    from components.stages import transfer as stage
    from components.stages.agent import eval_job
    from tests.reliability.project import NoTracking

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    target, source = tmp_path / "target", tmp_path / "source"
    head = _git_project(target)
    (target / "params.yaml").write_text(  # a `dvc exp run -S` override, not dirty code
        (ROOT / "params.yaml").read_text().replace("max_steps: 20", "max_steps: 21", 1)
    )
    write_jsonl(Paths(target).tasks_file, [make_task("tw-0", split="test")])
    write_jsonl(Paths(source).tasks_file, [make_task("tw-0")])
    for seed in cfg.seeds_of("dreamgym_grpo"):
        policy = source / "models" / "policy" / "dreamgym_grpo" / f"seed-{seed}"
        policy.mkdir(parents=True)
        (policy / "scorer.json").write_text("{}")

    def no_work(fn, jobs, workers):  # playing and training are other tests' business
        return [[] if fn is eval_job else {"no_update": "none", "real_steps": 0} for _ in jobs]

    monkeypatch.setattr(parallel, "run_jobs", no_work)
    monkeypatch.setattr(components.tracking, "stage_run", NoTracking)
    out = tmp_path / "transfer.json"
    result = stage.transfer(cfg, Paths(target), source, "grpo", out)
    prov = result["textworld->textworld"]["_provenance"]
    assert prov["git_commit"] == head and prov["dirty"] is False
    assert prov["params_overrides"] == {"env.max_steps": 21}
    assert (prov["profile"], prov["env"]) == ("ci", "textworld")
    code = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert prov["code_commit"] == code.stdout.strip() and "code_dirty" in prov
    assert json.loads(out.read_text())["textworld->textworld"]["_provenance"] == prov


def _one_run(tmp_path: Path) -> tuple[Config, Paths]:
    """A project whose only DreamGym PPO run is seed 1's (rl.ppo.seeds: [1])."""
    base = load_config(ROOT / "params.yaml")  # agent.seeds [0, 1, 2]
    rl = base.rl.model_copy(update={"ppo": base.rl.ppo.model_copy(update={"seeds": (1,)})})
    t1 = base.theorem1.model_copy(update={"algos": ["ppo"], "workers": 1})
    cfg = base.model_copy(update={"rl": rl, "theorem1": t1})
    paths = Paths(tmp_path)
    history = paths.metrics / "history" / "dreamgym_ppo.jsonl"
    history.parent.mkdir(parents=True)
    rows = [{"iteration": i, "seed": 1, "success_rate": 0.5} for i in range(3)]
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (paths.data / "synthetic").mkdir(parents=True)
    (paths.data / "synthetic" / "dreamgym_ppo.jsonl").write_text("")
    write_jsonl(paths.tasks_file, [make_task("tw-0")])
    return cfg, paths


def test_theorem1_measures_the_seed_the_method_trained(tmp_path: Path):
    # agent.seeds[0] (0) was read for every method: PPO trained seed 1 only
    from components.stages.theorem1 import measure_run

    cfg, paths = _one_run(tmp_path)
    assert cfg.seeds_of("dreamgym_ppo") == [1] and cfg.agent.seeds[0] == 0
    records, extras = measure_run(cfg, paths, "ppo", env=None, tasks={})
    assert extras["seed"] == 1 and extras["rounds"] == 3 and records == []


def test_theorem1_json_carries_its_runs_provenance(tmp_path: Path, monkeypatch):
    import components.tracking
    from components.stages.theorem1 import THEOREM1_METRICS, theorem1
    from tests.reliability.project import NoTracking

    monkeypatch.setattr(components.tracking, "stage_run", NoTracking)
    cfg, paths = _one_run(tmp_path)
    theorem1(cfg, paths)
    doc = json.loads((paths.metrics / THEOREM1_METRICS).read_text())
    assert set(doc["runs"]) == {"dreamgym_ppo"}
    prov = doc["_provenance"]
    assert (prov["profile"], prov["env"]) == (cfg.profile, cfg.env.name)
    assert {"git_commit", "dirty", "params_overrides"} <= set(prov)
