"""The one list of the metric names a trial logs, and which trial config logs which.

The producers are spread over the step (orchestrator/trial/step/sequence.py, collect/sources.py, collect/episodes.py) and the
learner (workers/learner/metrics.py, objectives.py, filters.py, credit/); this module names what they write so
that the tracker can flag a key nobody listed and the dashboard (orchestrator/tracking/dashboard.py) never draws a panel
over a metric no trial logs. `logged_metrics(cfg)` is the exact set of history keys a trial of `cfg` writes
(learner keys appear on the steps where the learner stepped); summary-only keys (`SUMMARY`) are written by the
tracker when the run finishes.
"""

from __future__ import annotations

from orchestrator.config.members import is_mix, member_trials
from orchestrator.config.trial import TrialConfig

EVAL_METRIC, ENV_METRIC, TRAIN_METRIC = "eval/pass@1", "eval/success", "train/correct_rate"
AUC_PREFIX = "auc/"  # run summary: normalized AUC of a metric over the whole run (orchestrator/tracking/run.py)

EPISODE = ("success", "return_mean", "turns_mean", "actions_mean", "invalid_action_rate", "format_penalty_rate",
           "truncated_rate")  # orchestrator/trial/collect/episodes.py: episode_metrics, as env/* (training) and eval/* (held out)
DECOMP_PARTS = ("n", "surprisal_mean", "entropy_mean", "surprisal_var", "entropy_var", "noise_var", "cov",
                "entropy_part", "noise_part", "noise_share")  # workers/credit/decomposition.py: PARTS
DECOMP_REMOVAL = ("surprisal_var_after", "removed", "removed_entropy", "removed_noise", "removed_noise_share")
RV_FILTER = ("kept_ratio", "groups_kept", "groups_total", "zero_std_groups", "std_all_mean", "std_kept_mean",
             "loss_scale")
CRITIC = ("critic/vf_clip_frac", "critic/grad_norm", "critic/value_mean", "critic/return_mean",
          "critic/explained_variance", "critic/optimizer_steps", "loss/value")
OFFLOAD = ("memory/offloaded_bytes", "time/offload_s", "time/reload_s")  # learner.offload_between_steps
TIS = ("tis/weight_mean", "tis/ratio_max", "tis/ratio_min", "tis/truncated_frac")
DECOUPLED = ("decoupled/weight_mean", "decoupled/ratio_max", "decoupled/ratio_min", "decoupled/masked_frac")
MISMATCH = ("mismatch/k1", "mismatch/k2", "mismatch/k3")  # KL(pi_behav || pi_prox) estimates, token means
ASYNC = ("async/staleness_mean", "async/staleness_max", "async/completion_len_trained", "async/groups_offered", "async/groups_dropped",
         "async/groups_delayed", "async/version_oldest", "async/version_newest")
FLOOR_CLASSES = ("planning", "execution", "all")
EVAL_SET = ("pass@1", "pass@k", "k", "problems")  # eval/<set>/<name> (orchestrator/trial/collect/eval_sets.py)
OFFLINE_EVAL = ("pass@1", "pass@k")  # the measures `eval` writes and the report compares (trials/<t>/eval/<set>.csv)
EFFECTIVE_BATCH = ("train/groups_sampled", "train/groups_informative", "train/tokens_trained", "train/overlong_share",
                   "train/fill_rounds")  # trial/step/sequence.py: prepare; trial/collect/fill.py: gather (the report's effective batch)


def report_metric(cfg: TrialConfig) -> str:
    """The statistical report's default metric for trials like `cfg` (orchestrator/report/tables.py)."""
    if cfg.task.agentic and cfg.eval.every and not is_mix(cfg):  # a mix's eval/success is per member
        return ENV_METRIC
    return EVAL_METRIC if cfg.eval.every else TRAIN_METRIC


def _step(cfg: TrialConfig) -> set[str]:
    """Every step's row (orchestrator/trial/step/sequence.py: prepare, TrainingStep.run; filters.nonfinite_groups)."""
    names = {"train/correct_rate", "train/reward_mean", "train/groups_kept", "train/groups_skipped_all_correct",
             "train/groups_skipped_all_wrong", "train/completion_len", "rollout/tokens_per_s",
             "rollout/adapter_version", "credit/sepa_lambda", "credit/sepa_gate_open", "train/nonfinite_groups",
             "train/nonfinite_reward_groups", "train/nonfinite_logprob_groups", "time/generate_s", "time/train_s",
             "time/sync_s", *EFFECTIVE_BATCH}
    if cfg.rollout.overlong.mode == "mask":  # orchestrator/trial/collect/fill.py: apply_overlong
        names.add("train/overlong_masked")
    parts = [p.task.agentic for _, p in member_trials(cfg)]
    if any(parts):
        names |= {f"env/{k}" for k in EPISODE} | {"env/turns_max"}
    if not all(parts):
        names |= {"train/grader_errors", "train/grader_timeouts", "time/score_s"}
        if cfg.interventions.probability_floor.is_active:
            names.add("floor/sampler_min_valid_prob")
    if cfg.interventions.rv_filter.enabled:
        names |= {f"rv_filter/{k}" for k in RV_FILTER}
    if cfg.resources.placement == "colocated":  # orchestrator/trial/actors/phases.py, on the steps the learner trains
        names |= {"time/sleep_s", "time/wake_s", "time/wake_kv_s"}
    ro = cfg.rollout
    if ro.staleness_bound > 0:  # sampling ahead: orchestrator/trial/step/sequence.py
        names |= {"rollout/staleness", "time/prefetch_s", "time/learner_wait_s"}
    if ro.correction != "none":  # workers/objectives/offpolicy.py
        names |= set(TIS) if ro.correction == "tis" else set(DECOUPLED)
    if ro.mode == "async":  # orchestrator/trial/step/staleness.py: staleness_metrics, composition
        names |= {"rollout/staleness", *ASYNC, *(f"async/staleness_tokens_{j}" for j in range(ro.staleness_bound + 1))}
        names |= {f"async/{w}_by_difficulty/{b}" for w in ("offered", "trained") for b in ("hard", "easy")}
        if is_mix(cfg):
            names |= {f"async/{w}_by_source/{label}" for w in ("offered", "trained") for label in cfg.task.labels}
    if ro.mode == "async" or ro.rejection is not None or ro.correction_metrics_only:
        names |= set(MISMATCH) | ({"mismatch/rejected_frac"} if ro.rejection is not None else set())
    if cfg.eval.every:
        names |= {"eval/pass@1", "eval/pass@k", "eval/k", "eval/problems", "time/eval_s"}
        if cfg.task.agentic and not is_mix(cfg):
            names |= {f"eval/{k}" for k in EPISODE}
        names |= eval_set_metrics(cfg)
    names |= per_task(cfg)
    samples = cfg.logging.samples  # wandb.Tables of the samples files (orchestrator/trial/artifacts/samples.py)
    if samples.every and samples.per_step:
        names.add("samples/train")
    if samples.eval and cfg.eval.every:
        names.add("samples/eval")
    return names


def per_task(cfg: TrialConfig) -> set[str]:
    """A mixed task's per-member metrics (orchestrator/trial/collect/mixed.py), none for one task:
    `train/<label>/correct_rate`, `train/<label>/fill_short` (under rollout.fill), `env/<label>/success`
    (multi-turn members), `eval/<label>/pass@1` and a multi-turn member's `eval/<label>/<episode metric>`."""
    if not is_mix(cfg):
        return set()
    names = set()
    for label, part in member_trials(cfg):
        names.add(f"train/{label}/correct_rate")
        if cfg.rollout.fill is not None:
            names.add(f"train/{label}/fill_short")
        if part.task.agentic:
            names.add(f"env/{label}/success")
        if cfg.eval.every:
            names.add(f"eval/{label}/pass@1")
            if part.task.agentic:
                names |= {f"eval/{label}/{k}" for k in EPISODE}
    return names


def eval_set_metric(name: str, metric: str) -> str:
    """`eval/<set>/<metric>`: an `eval.sets` entry's held-out metric (`metric` as the task's own set names it,
    without `eval/`)."""
    return f"eval/{name}/{metric}"


def eval_set_time(name: str) -> str:
    return f"time/eval_{name}_s"


def eval_set_metrics(cfg: TrialConfig) -> set[str]:
    """What `eval.sets` log at each held-out evaluation (an agentic set its episode metrics too)."""
    names = set()
    for s in cfg.eval.sets:
        agentic = (s.task or cfg.task).agentic
        names |= {eval_set_metric(s.name, k) for k in (*EVAL_SET, *(EPISODE if agentic else ()))}
        names.add(eval_set_time(s.name))
    return names


def _learner(cfg: TrialConfig) -> set[str]:
    """The learner's metrics (workers/learner/learner.py: train_step, learner_metrics.py, objectives.py)."""
    iv, credit = cfg.interventions, cfg.credit
    names = {"loss/total", "loss/policy", "train/grad_norm", "train/clip_frac", "train/optimizer_steps",
             "train/lr", "train/logprob_gap_mean", "train/logprob_gap_max", "train/tokens", "train/loss_scale",
             "policy/entropy_mean"}
    if iv.entropy_bonus.is_active:
        names.add("loss/entropy_bonus")
    if iv.kl.is_active or iv.kl.measure:
        names |= {"kl/ref", "kl/ref_k3"}
    if iv.kl.is_active:
        names.add("loss/kl")
    if iv.entropy_floor.is_active:
        floors = iv.entropy_floor
        classes = [c for c in FLOOR_CLASSES if getattr(floors, c) is not None]
        names |= {"entropy/floor_penalty"} | {f"entropy/{c}_{k}" for c in classes
                                              for k in ("mean", "floor_penalty", "tokens")}
    if iv.probability_floor.is_active and not cfg.task.agentic:
        names |= {"floor/action_logprob_min", "floor/learner_min_valid_prob"}
    if credit.advantage_mode == "gae":
        names |= set(CRITIC)
    if cfg.learner.offload_between_steps:  # workers/learner/offload.py
        names |= set(OFFLOAD)
    kind = credit.uncertainty_kind  # workers/credit/pipeline.py: batch_stats
    names |= {f"credit/{k}" for k in ("groups", "groups_skipped", "groups_skipped_all_correct",
                                        "groups_skipped_all_wrong", "planning_token_frac", "adv_token_mean",
                                        "adv_token_abs_mean", "sepa_lambda")}
    names |= {f"credit/{cls}_{kind}_{m}{when}" for cls in ("exec", "plan") for m in ("mean", "var")
              for when in ("", "_after")}
    if credit.log_decomposition or kind != "surprisal":  # workers/learner/learner.py: _decomposes
        names |= {f"credit/decomp_{cls}_{p}" for cls in ("exec", "plan") for p in DECOMP_PARTS}
        if "sepa" in credit.stages:  # while lambda > 0
            names |= {f"credit/decomp_exec_{p}" for p in DECOMP_REMOVAL}
    return names


def logged_metrics(cfg: TrialConfig) -> set[str]:
    """The history keys a trial of `cfg` logs."""
    return _step(cfg) | _learner(cfg)


def summary_metrics(cfg: TrialConfig) -> set[str]:
    """Summary-only keys the tracker writes at the end of a run: the AUC of the report's metric and the train
    correct rate over the whole run (orchestrator/stats/paired.py: normalized_auc)."""
    return {AUC_PREFIX + m for m in {report_metric(cfg), TRAIN_METRIC}}


def family(name: str) -> str:
    """A metric's family: its first path segment (`kl/ref` -> `kl`)."""
    return name.split("/", 1)[0]
