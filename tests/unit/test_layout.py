"""The architecture as the folder tree promises it (docs/architecture.md): imports read with `ast`, never run.

- no import cycle between modules, nor between folders (subpackages);
- workers/ never imports orchestrator/ (the data plane knows nothing of the control plane);
- each orchestrator folder imports only the folders below it in the flow
  cli -> jobs -> tune -> preflight / report -> trial -> tracking -> campaign -> config -> stats / storage,
  and only trial/, preflight/ (pure config readers), campaign/ and config/ (the workers' config schemas) reach into
  workers/;
- `python -m orchestrator plan` imports neither torch nor vLLM (nor Ray or transformers): a subprocess, so the
  modules this test process already holds do not count;
- typed data at the boundaries of one training step (`BOUNDARIES`): no bare `dict` returned there;
- no module imports a private name (`_x`) of another project module;
- no folder holds more than `MAX_MODULES` modules directly (a newcomer finds things by folder name);
- no class name is defined twice in orchestrator/ and workers/ (a name says which class it is);
- the shared pool (orchestrator/pool/) imports nothing of the trial (orchestrator/trial/);
- the trial's loop and step never ask whether it shares a pool: `resources.shared_base` is read in orchestrator/trial/
  only by `actors/backend.py:open_backend`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers")

# folder -> the folders it may import (besides itself); a module directly under orchestrator/ is its own folder
ALLOWED = {
    "orchestrator.__main__": {"orchestrator.cli"},
    "orchestrator.cli": {"*"},
    "orchestrator.jobs": {"orchestrator.tune", "orchestrator.preflight", "orchestrator.tracking",
                          "orchestrator.campaign", "orchestrator.config", "orchestrator.stats",
                          "orchestrator.storage"},
    "orchestrator.tune": {"orchestrator.preflight", "orchestrator.pool", "orchestrator.trial", "orchestrator.tracking",
                          "orchestrator.campaign", "orchestrator.config", "orchestrator.stats",
                          "orchestrator.storage"},
    "orchestrator.evaluate": {"orchestrator.preflight", "orchestrator.trial", "orchestrator.actors", "orchestrator.tracking",
                              "orchestrator.campaign", "orchestrator.config", "orchestrator.stats",
                              "orchestrator.storage", "workers.*"},
    "orchestrator.preflight": {"orchestrator.trial", "orchestrator.actors", "orchestrator.campaign", "orchestrator.config",
                               "orchestrator.stats", "orchestrator.storage", "workers.*"},
    "orchestrator.report": {"orchestrator.tracking", "orchestrator.campaign", "orchestrator.config",
                            "orchestrator.stats", "orchestrator.storage"},
    # the shared pool: started by tune/, built on the actor floor; trials reach it by their client only
    "orchestrator.pool": {"orchestrator.actors", "orchestrator.config", "workers.*"},
    "orchestrator.trial": {"orchestrator.actors", "orchestrator.tracking", "orchestrator.campaign",
                           "orchestrator.config", "orchestrator.stats", "orchestrator.storage", "workers.*"},
    # the actor floor: the model an actor loads, its engine settings, where it runs (trial, pool, evaluate use it)
    "orchestrator.actors": {"orchestrator.config", "workers.*"},
    "orchestrator.tracking": {"orchestrator.campaign", "orchestrator.config", "orchestrator.stats",
                              "orchestrator.storage"},
    "orchestrator.campaign": {"orchestrator.config", "orchestrator.stats", "orchestrator.storage",
                              "workers.credit"},
    "orchestrator.config": {"orchestrator.stats", "orchestrator.storage", "workers.credit", "workers.objectives",
                            "workers.tasks", "workers.learner"},
    "orchestrator.stats": set(),
    "orchestrator.storage": set(),
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (function-level imports too): `from a.b import c` counts a.b.c when
    that is a module, else a.b."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path, or None (iterative DFS, colours)."""
    colour: dict[str, int] = defaultdict(int)
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_itself_back():
    assert _cycle(_graph()) is None


def test_no_folder_imports_itself_back():
    folders: dict[str, set[str]] = defaultdict(set)
    for mod, deps in _graph().items():
        folders[_folder(mod)].update(_folder(d) for d in deps if _folder(d) != _folder(mod))
    assert _cycle(dict(folders)) is None


def test_workers_never_import_orchestrator():
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if m.startswith("workers")
                 for d in deps if d.startswith("orchestrator"))
    assert not bad


def test_each_orchestrator_folder_imports_only_what_lies_below_it():
    bad = []
    for mod, deps in _graph().items():
        src = _folder(mod)
        if not src.startswith("orchestrator") or src == "orchestrator":
            continue
        allowed = ALLOWED[src]  # a new folder must say where it sits
        for d in deps:
            dst = _folder(d)
            if dst == src or dst == "orchestrator" or "*" in allowed or dst in allowed:
                continue
            if dst.startswith("workers") and "workers.*" in allowed:
                continue
            bad.append(f"{mod} -> {d}")
    assert not sorted(bad)


def test_plan_imports_neither_torch_nor_vllm():
    code = ("import sys\nfrom orchestrator import cli\n"
            "code = cli.main(['plan', 'campaigns/sepa_lean.yaml', '--gpus', '8'])\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'ray', 'transformers'})\n"
            "print('HEAVY', ','.join(heavy), 'EXIT', code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "HEAVY  EXIT 0", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "plan for campaign sepa_lean" in proc.stdout


def test_no_function_takes_more_than_eight_parameters():
    """A longer list is a group of values that travel together: a small dataclass says so (self counts)."""
    bad = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                if count > 8:
                    bad.append(f"{name}.{node.name}: {count}")
    assert not sorted(bad)


# The boundaries of one training step (docs/architecture.md): the step loop <-> the rollout sources <-> the engines,
# and the step loop <-> the learner. module -> the classes and functions there whose methods / returns cross one.
BOUNDARIES = {
    "orchestrator.trial.actors.ports": ["EnginesPort", "LearnerPort"],  # the step -> engines, learner
    "orchestrator.trial.actors.engines": ["RolloutEngines"],
    "orchestrator.trial.actors.learner_group": [f"LearnerGroup.{m}" for m in (
        "submit_train_step", "result", "train_step", "export_policy", "release_cache", "write_checkpoint", "restore")],
    "orchestrator.trial.collect.rollouts": ["Rollouts"],
    "orchestrator.trial.collect.sources": ["RolloutSource", "SingleTurnSource", "EpisodeSource", "rollout_source"],
    "orchestrator.trial.collect.fill": ["Refill", "gather", "usable_groups"],
    "orchestrator.trial.collect.mixed": ["MixedSource", "task_source"],
    "orchestrator.trial.collect.episodes": ["play_episodes"],
    "orchestrator.trial.collect.sampling": ["sample"],
    "orchestrator.trial.artifacts.replay": ["ReplaySource", "replay_source"],
    "orchestrator.trial.step.sequence": ["TrainingStep", "prepare", "absorb", "push_policy"],
    "orchestrator.trial.step.trial_source": ["trial_source"],
    "workers.rollout.worker": ["RolloutWorker.generate", "RolloutWorker.apply_policy"],  # the engine's own side
    "orchestrator.evaluate.engine": ["EvalEngine.generate"],  # the offline evaluation's engine
    "workers.learner.learner": ["Learner.train_step", "Learner.export_policy"],  # the learner's own side
}
MAX_MODULES = 15


def _bare_dict(annotation: ast.expr | None) -> bool:
    """`dict` unparameterised anywhere in a return annotation (`dict`, `list[dict]`, `tuple[x, dict]`, `dict | None`)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        annotation = ast.parse(annotation.value, mode="eval").body
    subscripted = {id(n.value) for n in ast.walk(annotation) if isinstance(n, ast.Subscript)}
    return any(isinstance(n, ast.Name) and n.id == "dict" and id(n) not in subscripted for n in ast.walk(annotation))


def test_the_bare_dict_finder_finds_them():
    def ann(text):
        return ast.parse(f"def f() -> {text}: ...").body[0].returns

    assert all(_bare_dict(ann(t)) for t in ("dict", "list[dict]", "tuple[int, dict]", "dict | None", "'dict'"))
    assert not any(_bare_dict(ann(t)) for t in ("dict[str, float]", "list[dict[str, int]]", "Rollouts", "None"))


def test_no_bare_dict_crosses_a_boundary_of_the_step():
    mods, bad = _modules(), []
    for mod, names in BOUNDARIES.items():
        tree = ast.parse(mods[mod].read_text())
        top = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
        for name in names:
            cls, _, method = name.partition(".")
            node = top[cls]  # a boundary that moved must be listed again where it went
            if isinstance(node, ast.ClassDef):
                funcs = [f for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
                         and (not method or f.name == method)]
                assert funcs, f"{mod}.{name}: no such method"
            else:
                funcs = [node]
            bad += [f"{mod}.{cls}.{f.name}" if f is not node else f"{mod}.{name}" for f in funcs
                    if _bare_dict(f.returns)]
    assert not sorted(bad)


def test_no_module_imports_a_private_name_of_another():
    mods, bad = _modules(), []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            bad += [f"{name}: {base}.{a.name}" for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not sorted(bad)


def test_no_folder_holds_more_than_fifteen_modules():
    counts: dict[str, int] = defaultdict(int)
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            if p.name != "__init__.py":
                counts[p.parent.relative_to(ROOT).as_posix()] += 1
    assert not sorted(f"{d}: {n}" for d, n in counts.items() if n > MAX_MODULES)


def _handlers(tree: ast.AST) -> list[str]:
    """The functions of a module that take an `argparse.Namespace` (a command's handler)."""
    return [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(a.annotation is not None and "Namespace" in ast.unparse(a.annotation) for a in f.args.args)]


def test_the_handler_finder_finds_one():
    assert _handlers(ast.parse("import argparse\ndef go(args: argparse.Namespace) -> int:\n    return 0\n")) == ["go"]


def test_every_command_handler_lives_in_the_cli_folder():
    """One place for the commands: a newcomer finds every handler in orchestrator/cli/."""
    bad = [f"{name}.{h}" for name, path in _modules().items() if not name.startswith("orchestrator.cli")
           for h in _handlers(ast.parse(path.read_text(), str(path)))]
    assert not sorted(bad)


def _class_names(tree: ast.AST) -> list[str]:
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def test_the_class_finder_finds_nested_ones():
    assert _class_names(ast.parse("class A:\n    class B: ...\ndef f():\n    class C: ...\n")) == ["A", "B", "C"]


def test_no_class_name_is_defined_twice():
    """`Learner` the workers' class and `Learner` the trial's port, `PoolLearner` the pool's actor and the trial's
    client of it: a reader (and a grep, and a Ray process title) cannot tell which is meant."""
    where: dict[str, list[str]] = defaultdict(list)
    for name, path in _modules().items():
        for cls in _class_names(ast.parse(path.read_text(), str(path))):
            where[cls].append(name)
    assert not sorted(f"{cls}: {', '.join(sorted(mods))}" for cls, mods in where.items() if len(mods) > 1)


def test_the_pool_imports_nothing_of_the_trial():
    """The pool serves trials without knowing them: its actors are built on the actor floor (orchestrator/actors/),
    and the trials reach the pool by their client (orchestrator/trial/actors/shared.py)."""
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if m.startswith("orchestrator.pool")
                 for d in deps if d.startswith("orchestrator.trial"))
    assert not bad


def test_the_loop_and_the_step_never_ask_whether_the_trial_shares():
    """One backend per trial (orchestrator/trial/actors/backend.py): the loop and the step call its ports only."""
    trial = ROOT / "orchestrator" / "trial"
    paths = [trial / "loop.py", *sorted((trial / "step").rglob("*.py"))]
    assert not [p.relative_to(ROOT).as_posix() for p in paths if "shared_base" in p.read_text()]


def test_only_open_backend_reads_shared_base_in_the_trial():
    readers = sorted(
        name for name, path in _modules().items() if name.startswith("orchestrator.trial.")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "shared_base")
    assert readers == ["orchestrator.trial.actors.backend"]
