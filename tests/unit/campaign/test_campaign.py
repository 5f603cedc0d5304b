"""Campaign files: expansion of the shipped campaigns, override semantics, and the malformed-file corpus."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.campaign.expand import expand, load_campaign, sweep_points
from orchestrator.campaign.schema import CampaignConfig
from orchestrator.config.placement import bundles
from orchestrator.config.trial import TrialConfig

ROOT = Path(__file__).resolve().parents[3]
BAD = sorted((Path(__file__).parent / "bad_campaigns").glob("*.yaml"))
LEAN = ["C1", "C3", "C4", "C5", "C8"]


@pytest.mark.parametrize(
    "file, conditions, seeds, steps",
    [
        ("sepa_pilot.yaml", [f"C{i}" for i in range(1, 9)], [0, 1], 20),
        ("sepa_lean.yaml", LEAN, [0, 1, 2, 3], 40),
        ("sepa_conclusive.yaml", LEAN, list(range(8)), 100),
        ("demo.yaml", LEAN, [0, 1], None),
    ],
)
def test_shipped_campaigns_expand(file, conditions, seeds, steps):
    c = load_campaign(ROOT / "campaigns" / file)
    assert [t.name for t in c.trials] == [f"{cond}_s{s}" for cond in conditions for s in seeds]
    for t in c.trials:
        cfg = TrialConfig.model_validate(t.config)
        assert cfg.wandb.group == c.config.name and cfg.wandb.job_type == t.condition
        assert cfg.labels == {"condition": t.condition, "seed": t.seed}
        assert cfg.output_dir == f"{c.directory}/trials/{t.name}"
        assert ("sepa" in cfg.credit.stages) == (t.condition in ("C4", "C8"))
        assert cfg.credit.advantage_mode == ("maxrl" if int(t.condition[1]) >= 5 else "grpo")
        if steps is not None:  # the paper's setup
            assert cfg.steps == steps and cfg.model.name == "Qwen/Qwen3-4B-Instruct-2507"
            assert (cfg.learner.lora.rank, cfg.rollout.prompts_per_step, cfg.rollout.n) == (64, 16, 16)
            assert (cfg.rollout.temperature, cfg.rollout.max_tokens, cfg.learner.optim.lr) == (0.7, 2048, 5e-5)
            assert (cfg.credit.gtpo_beta, cfg.credit.hicra_alpha) == (0.1, 0.2)
            s = cfg.credit.sepa
            assert (s.schedule, s.steps, s.delay_steps, s.correct_rate_gate) == ("linear", 100, 10, 0.1)
            assert cfg.task.name == "math" and cfg.task.dataset
            optim = cfg.learner.optim  # memory settings (issue 47); one optimizer step per batch, as the seed
            assert cfg.learner.gradient_checkpointing and optim.max_tokens_per_micro_batch == 16384
            assert optim.mini_batch_size is None and optim.ppo_epochs == 1
        else:  # the local demo: the tiny reasoner on the chain task, logging the surprisal/entropy split
            assert cfg.model.name == "tiny-reasoner" and cfg.task.name == "chain"
            assert cfg.credit.log_decomposition and cfg.rollout.max_tokens >= 48


def test_refill_is_a_sweepable_setting_of_the_seed_campaigns():
    """The seeds' campaigns say whether the seed refilled and keep its behaviour (no refill) as the default;
    `rollout.fill.groups` sweeps on top of a base without `fill`."""
    for path in [*sorted((ROOT / "campaigns").glob("*.yaml")), *sorted((ROOT / "campaigns" / "ragen").glob("*.yaml"))]:
        assert "# Refill: the seed's runs did not refill" in path.read_text(), path
        c = load_campaign(path)
        assert all(TrialConfig.model_validate(t.config).rollout.fill is None for t in c.trials), path
    c = expand(CampaignConfig.model_validate({
        "name": "t", "seeds": [0], "conditions": {"A": {}}, "base": {"model": {"name": "tiny"},
                                                                   "task": {"name": "arithmetic"}},
        "sweep": {"rollout.fill.groups": [4, 8]}}), directory="/x/t")
    fills = [TrialConfig.model_validate(t.config).rollout.fill for t in c]
    assert [(f.groups, f.max_rounds) for f in fills] == [(4, 4), (8, 4)]


def test_interventions_sweep_crosses_three_settings():
    c = load_campaign(ROOT / "campaigns" / "sweeps" / "demo_interventions.yaml")
    assert len(c.trials) == 8 and len({t.name for t in c.trials}) == 8
    seen = set()
    for t in c.trials:
        cfg = TrialConfig.model_validate(t.config)
        iv = cfg.interventions
        seen.add((iv.entropy_bonus.coeff, iv.kl.coef, iv.rv_filter.value))
        assert iv.kl.measure and iv.rv_filter.enabled and cfg.model.name == "tiny"
    assert seen == {(e, k, v) for e in (0.0, 0.01) for k in (0.0, 0.1) for v in (1.0, 0.5)}


def test_campaign_files_are_executable_entrypoints():
    for f in (ROOT / "campaigns").rglob("*.yaml"):
        assert f.read_text().startswith("#!/usr/bin/env -S python -m orchestrator run\n"), f
        assert f.stat().st_mode & 0o111, f"{f} lacks the run bit"


def _campaign(**kw) -> CampaignConfig:
    return CampaignConfig.model_validate({"name": "t", "seeds": [0, 1], "conditions": {"A": {}}, **kw})


def test_expansion_is_deterministic_and_crosses_sweep():
    cfg = _campaign(conditions={"A": {}, "B": {"credit": {"advantage_mode": "maxrl"}}},
                    sweep={"learner.optim.lr": [0.001, 0.01], "rollout.temperature": [0.7, 1.0]})
    a, b = expand(cfg, directory="/x/t"), expand(cfg, directory="/x/t")
    assert [t.row() for t in a] == [t.row() for t in b]
    assert len(a) == 2 * 2 * 2 * 2
    assert a[0].name == "A_s0_lr0.001_temperature0.7"
    names = {t.name for t in a}
    assert len(names) == len(a)
    for t in a:
        cfg_t = TrialConfig.model_validate(t.config)
        assert cfg_t.learner.optim.lr == t.sweep["learner.optim.lr"]
        assert cfg_t.rollout.temperature == t.sweep["rollout.temperature"]
        assert cfg_t.labels == {"condition": t.condition, "seed": t.seed, **t.sweep}  # top-level in W&B
    assert {t.config["credit"]["advantage_mode"] for t in a if t.condition == "B"} == {"maxrl"}


def test_table_and_list_overrides_survive_intact():
    cfg = _campaign(
        base={"task": {"ops": ["+"]}, "credit": {"gtpo_beta": 0.3}},
        conditions={"A": {"task": {"ops": ["+", "-", "*"]},
                          "credit": {"transform_mode": ["sepa", "gtpo", "hicra"],
                                     "sepa": {"schedule": "auto", "warmup": 3},
                                     "advantage_params": {"nested": {"k": [1, 2]}}}}},
        sweep={"credit.strategic_grams": [["wait let me check"], ["let me", "check"]]},
    )
    trials = expand(cfg)
    assert [t.name for t in trials] == ["A_s0_strategic_gramsv0", "A_s1_strategic_gramsv0",
                                        "A_s0_strategic_gramsv1", "A_s1_strategic_gramsv1"]
    c = trials[2].config
    assert c["task"]["ops"] == ["+", "-", "*"]
    assert c["credit"]["transform_mode"] == ["sepa", "gtpo", "hicra"]
    assert c["credit"]["sepa"]["schedule"] == "auto" and c["credit"]["sepa"]["warmup"] == 3
    assert c["credit"]["advantage_params"] == {"nested": {"k": [1, 2]}}
    assert c["credit"]["gtpo_beta"] == 0.3  # the base table merged, not replaced
    assert c["credit"]["strategic_grams"] == ["let me", "check"]


def test_resources_section_sets_every_trial():
    cfg = _campaign(resources={"rollout_workers": 3, "worker_gpus": 1, "learner_gpus": 1, "learner_ranks": 2,
                               "driver_cpus": 0.25})
    t = TrialConfig.model_validate(expand(cfg)[0].config)
    assert t.rollout.num_workers == 3
    assert (t.resources.worker_gpus, t.resources.learner_gpus, t.resources.driver_cpus) == (1, 1, 0.25)
    assert t.resources.learner_ranks == 2
    assert [b.get("GPU", 0) for b in bundles(t)] == [0, 1, 1, 1, 1, 1]  # driver, 3 workers, 2 learner ranks


def test_sweep_labels_are_short_and_distinct():
    points = sweep_points({"a.x.lr": [0.1, 1e-4], "b.lr": [True, False]})
    labels = [label for _, label in points]
    assert labels == ["x.lr0.1_b.lrtrue", "x.lr0.1_b.lrfalse", "x.lr0.0001_b.lrtrue", "x.lr0.0001_b.lrfalse"]


def test_relative_storage_resolves_against_the_campaign_file(tmp_path):
    d = tmp_path / "sub"
    d.mkdir()
    (d / "c.yaml").write_text(yaml.safe_dump({"name": "c", "seeds": [0], "conditions": {"A": {}},
                                              "storage": "../store"}))
    c = load_campaign(d / "c.yaml")
    assert c.directory == str(tmp_path / "store" / "c")


def test_expand_cli_prints_the_table(capsys):
    assert cli.main(["expand", str(ROOT / "campaigns" / "sepa_lean.yaml")]) == 0
    out = capsys.readouterr().out
    assert "20 trials" in out and "C8_s3" in out and "2 GPU" in out


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_campaign_is_one_line_exit_2(path, capsys, monkeypatch):
    monkeypatch.delenv("CAMPAIGN_TEST_UNSET_VAR", raising=False)
    needle = path.read_bytes().split(b"\n")[0].decode().removeprefix("# expect: ")  # some cases are not text
    assert cli.main(["expand", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"error: {path}:") and needle in lines[0], lines[0]
    assert captured.out == ""  # nothing printed as if it had worked


def test_corpus_is_large_enough():
    assert len(BAD) >= 20


def test_malformed_campaign_exit_code_from_the_real_cli():
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(BAD[0])], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def _fake_cluster(monkeypatch, cpus: float, gpus: float, nodes: int) -> None:
    """`nodes` live nodes sharing `cpus`/`gpus`, no autoscaler (the autoscaler's side: tests/unit/preflight/test_cluster.py)."""
    import orchestrator.preflight.cluster as cluster

    node = {"CPU": cpus / nodes, **({"GPU": gpus / nodes} if gpus else {})}
    monkeypatch.setattr(cluster, "capacity", lambda: cluster.Capacity([dict(node) for _ in range(nodes)]))
    monkeypatch.delenv("RAY_JOB_SUBMISSION_ID", raising=False)


def _small_campaign(tmp_path, **kw):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "seeds": [0], "conditions": {"A": {}},
                                    "storage": str(tmp_path / "s"), **kw}))
    return load_campaign(path)


def test_cluster_checks_refuse_impossible_asks(tmp_path, monkeypatch):
    from orchestrator.config.errors import UserError
    from orchestrator.preflight.checks import check_cluster

    gpu = _small_campaign(tmp_path, resources={"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1})
    _fake_cluster(monkeypatch, cpus=16, gpus=0, nodes=1)
    with pytest.raises(UserError, match=r"c.yaml: resources: trial A_s0's rollout worker bundle \(CPU:1 GPU:1\) fits "
                                         r"on no node of the cluster"):
        check_cluster(gpu)
    _fake_cluster(monkeypatch, cpus=16, gpus=8, nodes=1)
    check_cluster(gpu)  # fits
    _fake_cluster(monkeypatch, cpus=2, gpus=8, nodes=1)
    with pytest.raises(UserError, match=r"asks for 2.5 CPUs; the cluster can have at most 2 \(no autoscaler\)"):
        check_cluster(gpu)
    _fake_cluster(monkeypatch, cpus=64, gpus=8, nodes=3)
    with pytest.raises(UserError, match=r"storage: .* node-local path on a 3-node cluster"):
        check_cluster(gpu)
    check_cluster(_small_campaign(tmp_path, storage_shared=True,
                                  resources={"rollout_workers": 1, "worker_gpus": 1, "learner_gpus": 1}))


def test_logged_wandb_config_has_labels_on_top_and_no_secrets(tmp_path, monkeypatch):
    from orchestrator.tracking.run import logged_config

    monkeypatch.setenv("WANDB_API_KEY", "secret-key-value")
    c = _small_campaign(tmp_path, sweep={"interventions.kl.coef": [0.1]},
                        wandb={"mode": "online", "api_key_file": "/keys/wandb"})
    cfg = TrialConfig.model_validate(c.trials[0].config)
    logged = logged_config(cfg)
    assert (logged["condition"], logged["seed"], logged["interventions.kl.coef"]) == ("A", 0, 0.1)
    assert logged["interventions"]["kl"]["coef"] == 0.1 and logged["wandb"]["group"] == "c"
    text = str(logged)
    assert "secret-key-value" not in text and "/keys/wandb" not in text and "api_key" not in text


def test_resumed_campaign_must_match_its_first_expansion(tmp_path):
    from orchestrator.config.errors import UserError
    from orchestrator.tune.launch import check_same_campaign, write_campaign_file

    first = _small_campaign(tmp_path)
    write_campaign_file(first)
    check_same_campaign(_small_campaign(tmp_path, wandb={"mode": "disabled"}))  # W&B settings may change
    with pytest.raises(UserError, match=r"was started with different trials \(A_s0 differ; A_s0: steps: 40 -> 3\)"):
        check_same_campaign(_small_campaign(tmp_path, base={"steps": 3}))


def test_lone_trial_with_a_changed_config_is_refused_before_ray_starts(tmp_path, monkeypatch):
    from orchestrator.config.errors import UserError
    from orchestrator.tune import launch

    started = []  # this pytest worker may hold a Ray from an earlier test: ask whether the call reached Ray
    monkeypatch.setattr(launch, "ensure_ray", lambda *a, **k: started.append(a))
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "trial_config.json").write_text(TrialConfig(steps=3).model_dump_json())
    with pytest.raises(UserError, match=r"trial 'local' in .* was started with a different config"):
        launch.run_single_trial(TrialConfig(steps=4), tmp_path)
    assert not started


def test_fields_added_to_the_code_at_their_defaults_do_not_block_a_resume(tmp_path):
    """A campaign started before the schema grew a field (here: the critic and GAE settings) still resumes; a
    value that differs from the new field's default is still a changed campaign."""
    from orchestrator.config.errors import UserError
    from orchestrator.storage import CAMPAIGN_FILE
    from orchestrator.tune.launch import check_same_campaign, write_campaign_file

    first = _small_campaign(tmp_path)
    write_campaign_file(first)
    path = Path(first.directory) / CAMPAIGN_FILE
    data = json.loads(path.read_text())
    for t in data["trials"]:  # what an older version of the code wrote
        del t["config"]["learner"]["critic"], t["config"]["credit"]["gae"]
    path.write_text(json.dumps(data))
    check_same_campaign(_small_campaign(tmp_path))
    with pytest.raises(UserError, match="was started with different trials"):
        check_same_campaign(_small_campaign(tmp_path, base={"learner": {"critic": {"lr": 0.5}}}))


def test_a_campaign_started_by_the_previous_schema_resumes(tmp_path, monkeypatch):
    """old_schema/campaign.json was written by an earlier release's code (before eval.sets and three more fields):
    today's expansion of the same file resumes it; one changed value is refused, named by its key path."""
    from orchestrator.config.errors import UserError
    from orchestrator.storage import CAMPAIGN_FILE
    from orchestrator.tune.launch import check_same_campaign

    old = Path(__file__).parent / "old_schema"
    monkeypatch.setenv("STORAGE", str(tmp_path))
    (tmp_path / "old_schema").mkdir()
    (tmp_path / "old_schema" / CAMPAIGN_FILE).write_text((old / CAMPAIGN_FILE).read_text())
    assert "sets" not in json.loads((old / CAMPAIGN_FILE).read_text())["trials"][0]["config"]["eval"]
    check_same_campaign(load_campaign(old / "campaign.yaml"))
    changed = tmp_path / "campaign.yaml"
    changed.write_text((old / "campaign.yaml").read_text().replace("{lr: 0.0001}", "{lr: 0.0002}"))
    with pytest.raises(UserError, match=r"\(sokoban_s0 differ; sokoban_s0: learner.critic.lr: 0.0001 -> 0.0002\)"):
        check_same_campaign(load_campaign(changed))


def test_fields_a_task_kind_or_a_mix_member_gained_do_not_block_a_resume(tmp_path):
    """A field new to one task kind (not the default task's) or to the members of a list is at its default once
    the saved config is read by today's schema; a value that differs still refuses."""
    from orchestrator.tune.same_config import config_change

    mix = {"mix": [{"task": {"name": "chain"}, "groups": 2}, {"task": {"name": "sokoban"}, "groups": 1}]}
    now = TrialConfig.model_validate({"task": mix, "model": {"name": "tiny-agent"}}).model_dump(mode="json")
    before = json.loads(json.dumps(now))
    del before["task"]["mix"][1]["task"]["max_env_steps"], before["task"]["mix"][0]["label"]
    assert config_change(before, now) is None
    before["task"]["mix"][1]["label"] = "boxes"
    assert config_change(before, now) == "task.mix[1].label: 'boxes' -> None"
    before["task"]["mix"][1] = {**before["task"]["mix"][1], "label": None, "retired": 3}
    assert config_change(before, now) == "task.mix[1].retired: 3 -> (absent)"  # a field today's schema lacks


def test_a_torn_tune_snapshot_is_named_and_set_aside(tmp_path):
    from orchestrator.tune.launch import _torn_snapshot

    assert _torn_snapshot(str(tmp_path / "none")) is None  # no experiment yet
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
    (tmp_path / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"counter": 1}))  # Tune's
    assert _torn_snapshot(str(tmp_path)) is None
    newer = tmp_path / "experiment_state-2026-01-02_00-00-00.json"
    newer.write_text('{"trial_data": [["{\\"status\\": \\"RUN')  # cut mid-copy by a SIGKILL
    size = newer.stat().st_size
    assert _torn_snapshot(str(tmp_path)) == f"Tune's experiment snapshot {newer.name} is torn ({size} bytes, not whole)"
    assert not newer.exists() and (tmp_path / f"{newer.name}.torn").is_file()
    assert _torn_snapshot(str(tmp_path)) is None  # the older, whole one is newest again
    searcher = tmp_path / "basic-variant-state-2026-01-02_00-00-00.json"
    searcher.write_bytes(pickle.dumps({"counter": 2, "live": ["t0"]})[:-5])
    assert searcher.name in _torn_snapshot(str(tmp_path)) and not searcher.exists()
