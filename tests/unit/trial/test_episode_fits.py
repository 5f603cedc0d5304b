"""The agentic first-turn check (orchestrator/trial/collect/episodes.py: check_episode_fits) on the real tiny-agent
tokenizer, and the CLI refusing a trial whose first turn cannot fit before anything starts. (This file sorts
late in the unit run: the tiny-agent model it reads is built in the background meanwhile, see the Makefile.)"""

from __future__ import annotations

import subprocess
import sys

from orchestrator.config.trial import TrialConfig


def _trial_file(tmp_path, text: str):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "orchestrator", "trial", str(path), "--storage", str(tmp_path)],
                          capture_output=True, text=True, timeout=600), path


def test_first_turn_that_does_not_fit_is_refused_before_launch(tmp_path):
    """The first prompt + rollout.max_tokens must fit model.max_model_len: one line, exit 2, nothing started."""
    proc, path = _trial_file(tmp_path, "model: {name: tiny-agent, max_model_len: 128}\ntask: {name: sokoban}\n")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "model.max_model_len: 128 is too small" in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "local").exists()


def test_check_episode_fits_measures_the_longest_first_prompt():
    from orchestrator.actors.models import resolve_model
    from orchestrator.trial.collect.episodes import check_episode_fits
    from workers.envs.tokens import first_prompt_ids
    from workers.models.loading import load_tokenizer
    from workers.tasks import make_task

    cfg = TrialConfig(model={"name": "tiny-agent"}, task={"name": "frozen_lake"})
    tok = load_tokenizer(resolve_model(cfg.model))
    task = make_task(cfg.task, cfg.seed)
    longest = max(len(first_prompt_ids(tok, ep.prompt(), system=ep.system(), prefill=ep.prefill))
                  for ep in (task.episode(s, 0, cfg.rollout) for s in task.eval_levels(32)))
    assert check_episode_fits(cfg, tok) is None
    tight = cfg.model_copy(update={"model": cfg.model.model_copy(update={"max_model_len": longest + 63})})
    assert "too small" in check_episode_fits(tight, tok)
