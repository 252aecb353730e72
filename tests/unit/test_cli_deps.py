"""Every module a DVC stage runs is among its deps (dvc.yaml), so editing it makes the stage
stale. The stage's code is found statically, function by function: from the stage function
(``STAGES``' ``module:function``), the imports of every function it can reach (lazy ones in
function bodies included) and the top level of every module on the way. A module-level
closure would put most of the project in every stage (components/stages/data.py alone
hosts four stages' functions). The same walk finds the params.yaml sections a stage's code
reads, which must be among its params (below).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "components"
TOP, ALL = "<top>", "<all>"  # a module's import-time code; the whole module

# Plumbing that shapes no stage's results (how a stage logs, locks, writes and reports;
# params reach a stage through dvc.yaml's params, not through components/config). A module
# here is no stage's dep, so editing it reruns nothing.
INFRASTRUCTURE = (
    "components/__init__.py",
    "components/stages/__init__.py",
    "components/artifacts.py",  # output locations: dvc.yaml names them itself
    "components/cli_process.py",
    "components/config",
    "components/io.py",
    "components/pool.py",
    "components/progress.py",
    "components/registry_models.py",
    "components/stages/common.py",
    "components/tracking.py",
    "components/model_registry.py",
    "components/evaluation/promotion.py",  # registry names and the promote command's rules
)
# Calls the static walk finds but the stage never makes: a branch on its own kind of run
NOT_REACHED: dict[str, set[tuple[str, str]]] = {
    # rl_seed dreams for DreamGym and S2R (reground) only; re-grounding is S2R's
    "train_rl_real": {
        ("components.stages.dreamgym", "DreamGymRun"),
        ("components.stages.regrounding", "reground"),
    },
    "train_dreamgym": {("components.stages.regrounding", "reground")},
}


@dataclass
class _Module:
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level def/class/assignment
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # imported name -> target


def _file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def _parse(module: str) -> _Module:
    path = _file(module)
    assert path is not None, module
    parsed = _Module(ast.parse(path.read_text(encoding="utf-8")))
    for stmt in parsed.tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            parsed.defs[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):  # e.g. a table of factories
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, ast.Name) and stmt.value is not None:
                    parsed.defs[target.id] = stmt.value
        # the names it imports, TYPE_CHECKING blocks included (a package's lazy
        # __getattr__ names its submodules there), to follow a use of them
        for node in [stmt] if not _is_type_checking(stmt) else list(ast.walk(stmt)):
            for (target, name), alias in _targets(node):
                parsed.names[alias] = (target, name)
    return parsed


def _is_type_checking(stmt: ast.AST) -> bool:
    test = stmt.test if isinstance(stmt, ast.If) else None
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _targets(node: ast.AST) -> list[tuple[tuple[str, str], str]]:
    """((module, name), bound name) of each package import of an import statement; name
    ALL for a module object."""
    out: list[tuple[tuple[str, str], str]] = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.split(".")[0] == PACKAGE:
                out.append(((a.name, ALL), a.asname or a.name.split(".")[0]))
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        for a in node.names if node.module.split(".")[0] == PACKAGE else ():
            sub = f"{node.module}.{a.name}"
            target = (sub, ALL) if _file(sub) else (node.module, a.name)
            out.append((target, a.asname or a.name))
    return out


def _walk(node: ast.AST, import_time: bool) -> list[ast.AST]:
    """Every node under ``node``; ``import_time``: only what runs when the module is
    imported (no function bodies, no TYPE_CHECKING block)."""
    out: list[ast.AST] = []
    todo = [node]
    while todo:
        node = todo.pop()
        if import_time and _is_type_checking(node):
            continue
        out.append(node)
        if import_time and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defaults = [*node.args.defaults, *node.args.kw_defaults]
            todo += [*node.decorator_list, *(d for d in defaults if d is not None)]
            continue
        todo += list(ast.iter_child_nodes(node))
    return out


def _edges(module: str, name: str) -> set[tuple[str, str]]:
    """What running ``name`` of ``module`` reaches: a function, class or table; TOP, the
    module's import; ALL, every part of it."""
    parsed = _parse(module)
    out = {(module, TOP)}
    parts = module.split(".")
    out |= {(".".join(parts[:i]), TOP) for i in range(1, len(parts))}  # parent packages
    if name == ALL:
        return out | {(module, d) for d in parsed.defs}
    if name != TOP and name not in parsed.defs:
        # re-exported (or lazily exported) from another module, else a plain constant
        return out | ({parsed.names[name]} if name in parsed.names else set())
    import_time = name == TOP
    for node in _walk(parsed.tree if import_time else parsed.defs[name], import_time):
        for (target, imported), _ in _targets(node):
            # importing runs a module's top level; a lazy import is there to be used
            out.add((target, TOP) if import_time else (target, imported))
        if not isinstance(node, ast.Name):
            continue
        if import_time and not _called(node, parsed.tree):
            continue  # a reference at import time (a table of functions) runs nothing
        if node.id in parsed.defs:
            out.add((module, node.id))  # a function of the same module, called or passed on
        elif node.id in parsed.names:
            out.add(parsed.names[node.id])
    return out


def _called(name: ast.Name, tree: ast.Module) -> bool:
    """Whether ``name`` is called (or applied as a decorator) at import time."""
    return any(
        (isinstance(n, ast.Call) and n.func is name)
        or (isinstance(n, ast.FunctionDef | ast.ClassDef) and name in n.decorator_list)
        for n in _parents(tree).get(id(name), ())
    )


def _parents(tree: ast.Module) -> dict[int, list[ast.AST]]:
    cached = _PARENTS.get(id(tree))
    if cached is None:
        cached = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                cached.setdefault(id(child), []).append(parent)
        _PARENTS[id(tree)] = cached
    return cached


_PARENTS: dict[int, dict[int, list[ast.AST]]] = {}


def _code_free(path: Path) -> bool:
    """A module of a docstring (and ``from __future__``) alone: nothing in it can change."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(
        (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        or (isinstance(s, ast.ImportFrom) and s.module == "__future__")
        for s in body
    )


def _reach(
    entry: str, not_reached: set[tuple[str, str]] = frozenset()
) -> Iterator[tuple[tuple[str, str], bool]]:
    """Each ``(module, function)`` that ``module:function`` reaches, once, and whether it is
    infrastructure (reached, but its own imports are not the stage's)."""
    seen: set[tuple[str, str]] = set()
    todo = [tuple(entry.split(":"))]
    while todo:
        node = todo.pop()
        if node in seen or node in not_reached or _file(node[0]) is None:
            continue
        seen.add(node)
        path = _file(node[0]).relative_to(ROOT).as_posix()  # type: ignore[union-attr]
        infrastructure = _covered(path, list(INFRASTRUCTURE))
        if not infrastructure:
            todo += _edges(*node)
        yield node, infrastructure


def stage_files(entry: str, not_reached: set[tuple[str, str]] = frozenset()) -> set[str]:
    """Files (relative to the root) of the package's modules that ``module:function`` runs,
    code-free ones left out."""
    files = {_file(m) for (m, _), _ in _reach(entry, not_reached)}
    return {f.relative_to(ROOT).as_posix() for f in files if f and not _code_free(f)}


def _covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def test_every_module_a_stage_runs_is_among_its_deps():
    """collect ran components/envs/episodic.py and components/episodes.py, train_dreamgym
    components/envs/vector.py, none of them its deps: edits there left the outputs fresh."""
    from components.cli import STAGES

    runs = {s.name: s.run for s in STAGES}
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    missing = {}
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        deps = [str(d).split()[0] for d in stage.get("deps", [])]
        entry = f"components.stages.{runs[stage['cmd'].split()[1]]}"
        files = stage_files(entry, NOT_REACHED.get(name, set()))
        lost = sorted(f for f in files if not _covered(f, [*deps, *INFRASTRUCTURE]))
        if lost:
            missing[name] = lost
    assert not missing, f"stages run code that is not among their deps: {missing}"


def test_the_analysis_follows_lazy_imports_and_only_the_stage_function():
    # collect's engine is imported inside functions (components/data/collect.py); ingest,
    # in the same module components/stages/data.py, never plays a game
    collect = stage_files("components.stages.data:collect")
    assert {"components/envs/episodic.py", "components/episodes.py"} <= collect
    assert "components/envs/textworld_env.py" in collect
    ingest = stage_files("components.stages.data:ingest")
    assert "components/data/ingest.py" in ingest
    assert not any(f.startswith("components/envs/") for f in ingest)
    assert "components/envs/vector.py" in stage_files("components.stages.rl:train_dreamgym")


# ---- params: every params.yaml section (or key) a stage's code reads is in its params
#
# The same walk as above, collecting what each function reads of the root ``Config``: the
# attribute chains ``cfg.<section>.<key>...`` on a name annotated ``Config`` (a parameter, its
# closures, a local alias, ``self.<attr>`` a method stored it in), ``getattr(cfg, "x")``, and
# the sections Config's own methods read (``cfg.seeds_of(m)``: rl and agent). A sub-config is
# never the root: ``cfg.seed`` of an ``RLAlgoConfig`` or ``DriftConfig`` parameter is its own
# section's seed. A chain is covered by a params entry that is a prefix of it (``rl.grpo``
# covers ``cfg.rl.grpo.seeds``); a whole section handed on (``f(cfg.buffer)``) by any entry
# of that section (the helper reads the keys listed: an approximation); ``x.model_dump()``
# and ``x.model_copy()`` read all of ``x``. Reads the walk finds but that shape no DVC output
# of the stage, or that its run never makes, are listed below with the reason.

# (function, key), in every stage: reads that shape MLflow bookkeeping only, and a fallback
IGNORED_READS = {
    # the registered model's name (policy / policy-ablation) and its env tag
    ("components.stages.agent:register", "ablation"),
    ("components.stages.agent:register", "env.name"),
    # whether the MLflow alias policy@<method> gets the evaluation's tags
    ("components.stages.agent:evaluate_policy", "ablation"),
    # the dpi of a PNG logged to MLflow only (reports/theorem1.png is the report stage's)
    ("components.stages.theorem1:theorem1", "report"),
    # the prompt of a model whose meta has none: every experience model saves its prompt
    # (components/stages/experience.py), and llm_dream_env reads meta["prompt"] first
    ("components.experience.synthetic_answers:prompt_settings", "experience"),
    ("components.experience.synthetic_answers:prompt_settings", "ablation"),
}
_RL, _SEED = "components.stages.rl", "components.stages.rl_seed"
# only S2R reads these: `kind == S2R and cfg.rl.s2r_mode ...`, its own round settings
_S2R_READS = {
    (f"{_SEED}:rl_seed", "rl.s2r_mode"),
    (f"{_RL}:_rl_stage", "rl.s2r_mode"),
    *((f"{_SEED}:rl_seed", f"rl.s2r_{k}") for k in ("explore", "dream_iterations", "task_prior")),
    *((f"{_SEED}:algo_config", f"rl.s2r_{k}") for k in ("tasks_per_iteration", "aggregation")),
}
# stage -> (function, key): reads in a branch on another kind of run (rl_seed, algo_config
# and _rl_stage serve the three RL stages) or another method (evaluate_policy, random)
NOT_READ: dict[str, set[tuple[str, str]]] = {
    "train_rl_real": {
        *_S2R_READS,
        # `if dreams:` and `kind == DREAMGYM and cfg.theorem1.snapshots`
        *((f"{_SEED}:rl_seed", k) for k in ("synthetic", "curriculum", "ablation", "theorem1")),
        *(
            (f"{_SEED}:algo_config", f"rl.dreamgym_{k}")
            for k in ("iterations", "tasks_per_iteration")
        ),
    },
    "train_dreamgym": _S2R_READS,
    "train_s2r": {(f"{_SEED}:rl_seed", "theorem1")},
    # the random baseline: no policy to serve, seeds_of(random) is agent.seeds
    "evaluate_random": {
        ("components.stages.agent:eval_job", "serving"),
        ("components.stages.agent:evaluate_policy", "rl"),
    },
}
# calls the walk above follows into functions no stage of that kind makes
NOT_REACHED_PARAMS: dict[str, set[tuple[str, str]]] = {
    "train_dpo": {("components.stages.agent", "sft_seed")},  # a new scorer: SFT's only
    "train_rl_real": {(_SEED, "s2r_cap")},
    "train_dreamgym": {(_SEED, "s2r_cap")},
}
WHOLE = "*"  # a path's last part when it reads all of the object before it
_WHOLE_METHODS = {"model_dump", "model_dump_json", "model_copy"}
_CONFIG_MODULES = {"components.config", "components.config.loading"}


def _is_config(annotation: ast.AST | None, module: str) -> bool:
    """``annotation`` (in ``module``) names the root Config of components.config."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):  # | None
        return _is_config(annotation.left, module) or _is_config(annotation.right, module)
    names = _parse(module).names
    if isinstance(annotation, ast.Name):
        target = names.get(annotation.id)
    elif isinstance(annotation, ast.Attribute) and isinstance(annotation.value, ast.Name):
        module_of = names.get(annotation.value.id, ("", ""))[0]
        target = (module_of, annotation.attr)
    else:
        return False
    return target is not None and target[0] in _CONFIG_MODULES and target[1] == "Config"


@cache
def _config_class() -> tuple[frozenset[str], dict[str, set[tuple[str, ...]]]]:
    """Config's fields, and what each of its methods reads of them (``self.<field>``)."""
    tree = ast.parse((ROOT / "components/config/loading.py").read_text(encoding="utf-8"))
    cls = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Config")
    fields = frozenset(
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    )
    methods = {
        f.name: {
            (n.attr,)
            for n in ast.walk(f)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            if n.value.id == "self" and n.attr in fields
        }
        for f in cls.body
        if isinstance(f, ast.FunctionDef)
    }
    return fields, methods


def _arguments(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]


class _ConfigReads:
    """What one definition of ``module`` reads of the root Config: attribute paths."""

    def __init__(self, module: str, self_attrs: frozenset[str] = frozenset()) -> None:
        self.module, self.self_attrs = module, self_attrs  # self.<attr> holding the Config
        self.paths: set[tuple[str, ...]] = set()

    def _path(self, node: ast.AST, roots: set[str]) -> tuple[str, ...] | None:
        """The attribute path of ``node`` below the root Config, or None if not on it."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            value = node.value
            own = isinstance(value, ast.Name) and value.id == "self" and "self" not in roots
            if own and node.attr in self.self_attrs:
                return tuple(reversed(parts))
            parts.append(node.attr)
            node = value
        return tuple(reversed(parts)) if isinstance(node, ast.Name) and node.id in roots else None

    def function(self, fn: ast.AST, roots: set[str]) -> None:
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        own = _arguments(fn)
        inner = (roots - {a.arg for a in own}) | {
            a.arg for a in own if _is_config(a.annotation, self.module)
        }
        for n in [] if isinstance(fn, ast.Lambda) else ast.walk(fn):  # cfg = self.cfg
            if isinstance(n, ast.Assign) and self._path(n.value, inner) == ():
                inner |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        for outer in [*fn.args.defaults, *fn.args.kw_defaults, *getattr(fn, "decorator_list", [])]:
            if outer is not None:
                self.visit(outer, roots)
        for stmt in fn.body if isinstance(fn.body, list) else [fn.body]:
            self.visit(stmt, inner)

    def visit(self, node: ast.AST, roots: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return self.function(node, roots)
        if isinstance(node, ast.Call) and self._call(node, roots):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg, roots)
            return None
        path = self._path(node, roots) if isinstance(node, ast.Attribute) else None
        if path is not None:
            if path and path[-1] in _WHOLE_METHODS:
                path = (*path[:-1], WHOLE)
            if path:
                self.paths.add(path)
            return None
        for child in ast.iter_child_nodes(node):
            self.visit(child, roots)
        return None

    def _call(self, call: ast.Call, roots: set[str]) -> bool:
        """Record ``getattr(cfg..., name)`` and ``cfg.<Config method>(...)``; whether done."""
        f, args = call.func, call.args
        if isinstance(f, ast.Name) and f.id == "getattr" and len(args) > 1:
            base = self._path(args[0], roots)
            if base is None:
                return False
            name = args[1]  # known at run time only: one of base's members (getattr(cfg.rl,
            known = isinstance(name, ast.Constant) and isinstance(name.value, str)  # algo))
            self.paths.add((*base, name.value) if known else (base or (WHOLE,)))
            return True
        path = self._path(f, roots)
        fields, methods = _config_class()
        if path is None or len(path) != 1 or path[0] in fields:
            return False
        if path[0] == "section" and args and isinstance(args[0], ast.Constant):
            self.paths.add((args[0].value, WHOLE))  # one section as plain data
        else:  # seeds_of: the sections it reads; model_dump or another method: everything
            self.paths |= methods.get(path[0], {(WHOLE,)}) if path[0] != "section" else {(WHOLE,)}
        return True


def _definition_reads(module: str, name: str) -> set[tuple[str, ...]]:
    node = _parse(module).defs.get(name)
    if not isinstance(node, ast.ClassDef):
        reads = _ConfigReads(module)
        if node is not None:
            reads.visit(node, set())
        return reads.paths
    # a class: the attributes its methods store the Config in (self.cfg = cfg), or a field
    attrs = {
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        if _is_config(s.annotation, module)
    }
    for method in node.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        roots = {a.arg for a in _arguments(method) if _is_config(a.annotation, module)}
        for n in ast.walk(method):
            for target in n.targets if isinstance(n, ast.Assign) else ():
                value = n.value
                pairs = (
                    zip(target.elts, value.elts, strict=False)
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                    else [(target, value)]
                )
                attrs |= {
                    t.attr
                    for t, v in pairs
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    if t.value.id == "self" and isinstance(v, ast.Name) and v.id in roots
                }
    reads = _ConfigReads(module, frozenset(attrs))
    for stmt in node.body:
        reads.visit(stmt, set())
    return reads.paths


def config_reads(entry: str, not_reached: set[tuple[str, str]] = frozenset()) -> dict:
    """{path: {"module:function", ...}}: what the functions ``entry`` reaches read of the
    root Config (``("env", "name")`` for ``cfg.env.name``)."""
    out: dict[tuple[str, ...], set[str]] = {}
    for node, infrastructure in _reach(entry, not_reached):
        if infrastructure:  # e.g. tracking logs every section
            continue
        for read in _definition_reads(*node):
            out.setdefault(read, set()).add(":".join(node))
    return out


def _listed(read: tuple[str, ...], params: list[tuple[str, ...]]) -> bool:
    if any(read[: len(p)] == p for p in params):  # the entry or a section above it
        return True
    if len(read) == 1:  # a whole section handed on: the keys of it listed
        return any(p[0] == read[0] for p in params)
    return any(p[: len(read)] == read for p in params)  # e.g. cfg.rl.grpo, rl.grpo.seeds


def _excused(read: tuple[str, ...], where: str, excused: set[tuple[str, str]]) -> bool:
    return any(w == where and read[: len(k.split("."))] == tuple(k.split(".")) for w, k in excused)


def missing_params(name: str, stage: dict) -> dict[str, list[str]]:
    """{key read: [functions]} of a stage (dvc.yaml) whose params do not list the key."""
    from components.cli import STAGES

    runs = {s.name: s.run for s in STAGES}
    params = [tuple(str(p).split(".")) for p in stage.get("params", []) if "${" not in str(p)]
    entry = f"components.stages.{runs[stage['cmd'].split()[1]]}"
    not_reached = NOT_REACHED.get(name, set()) | NOT_REACHED_PARAMS.get(name, set())
    excused = IGNORED_READS | NOT_READ.get(name, set())
    missing: dict[str, list[str]] = {}
    for read, functions in config_reads(entry, not_reached).items():
        where = sorted(f for f in functions if not _excused(read, f, excused))
        if where and not _listed(read, params):
            missing[".".join(read)] = where
    return missing


def test_every_config_section_a_stage_reads_is_in_its_params():
    """evaluate_policy served an LM policy as serving.policy_backend said, without
    `serving` among its params: a new backend left its evaluation fresh. Likewise the
    seeds it evaluates (rl.<algo>.seeds), and train_sft's scorer shape (env.name)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    missing = {}
    for name, stage in stages.items():
        lost = missing_params(name, stage.get("do", stage))
        if lost:
            missing[name] = lost
    assert not missing, f"stages read params that are not among their params: {missing}"


def test_the_params_analysis_tells_the_root_config_from_its_sections():
    # build_buffer reads the top-level seed (cfg: Config); train_rl_real reads only
    # sub-configs' seeds (agent/train.py's cfg: RLAlgoConfig, curriculum's self.cfg)
    assert ("seed",) in config_reads("components.stages.buffer:build_buffer")
    rl_real = config_reads("components.stages.rl:train_rl_real", NOT_REACHED["train_rl_real"])
    assert ("seed",) not in rl_real
    # DreamGymRun keeps the Config in self.cfg: its methods' reads count
    dream = config_reads("components.stages.rl:train_dreamgym", NOT_REACHED["train_dreamgym"])
    assert "components.stages.dreamgym:DreamGymRun" in dream[("serving", "backend")]
    # cfg.seeds_of(method) reads rl.<algo>.seeds (Config's own method)
    assert ("rl",) in config_reads("components.stages.agent:evaluate_policy")
    # a params entry covers the keys below it, not a sibling key of its section
    assert _listed(("rl", "grpo", "seeds"), [("rl", "grpo")])
    assert not _listed(("env", "name"), [("env", "max_steps")])
    assert not _listed(("buffer", WHOLE), [("buffer", "k")])


def test_the_params_check_fails_on_a_missing_section():
    stage = {"cmd": "dreamgym evaluate-policy sft", "params": ["profile", "env", "agent"]}
    assert {"serving", "rl"} <= set(missing_params("evaluate_policy", stage))


def test_every_params_entry_is_a_key_of_params_yaml():
    """DVC stops on an entry params.yaml lacks (rl.grpo.seeds: unset, agent.seeds)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    none, absent = object(), []
    for name, stage in stages.items():
        for entry in map(str, stage.get("do", stage).get("params", [])):
            node = params
            for key in [] if "${" in entry else entry.split("."):
                node = node.get(key, none) if isinstance(node, dict) else none
            if node is none:
                absent.append(f"{name}: {entry}")
    assert not absent, f"params entries that params.yaml lacks: {absent}"
