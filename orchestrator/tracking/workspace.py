"""A campaign's W&B workspace (saved view), built with `wandb-workspaces` from the campaign itself.

The view is named after the campaign, filtered to its runs (the campaign's W&B group, its conditions' job types)
and grouped by condition and each swept key, so every line panel is a mean over seeds with a standard-error band.
Panels are chosen from the metric names the campaign's trials log (orchestrator/tracking/names.py): a KL panel only
when some trial uses KL, env panels only for agentic tasks. Saving goes through the library (`Workspace.save`)
under a view name derived from the campaign's name, so saving again updates the same view.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces import expr

from orchestrator.campaign.schema import Campaign
from orchestrator.config.trial import sepa_settings
from orchestrator.tracking.names import AUC_PREFIX, TRAIN_METRIC, logged_metrics, per_task, report_metric

BAND = {"groupby_aggfunc": "mean", "groupby_rangefunc": "stderr"}  # mean over seeds, band = standard error


VIEW_FILE = "wandb_workspace.json"


@dataclass
class CampaignMetrics:
    """What the campaign's trials log, and the facts that pick panels."""

    logged: set[str]
    metric: str  # the report's metric
    swept: list[str]
    numeric: set[str]  # swept keys whose values are all numbers (a scatter against the value)
    scalar: set[str]  # swept keys whose values are numbers, strings or booleans (not tables: an axis)
    agentic: bool
    sepa: bool  # some trial runs SEPA (lambda moves)
    token_stages: bool  # some trial changes the uncertainty signal (before != after)
    rv_filter: bool  # some trial's RV filter drops groups (enabled at top-p 1 with zeros it logs, keeps all)
    kinds: list[str]  # the uncertainty signals (credit.uncertainty_kind) the trials use
    tasks: set[str] = dataclasses.field(default_factory=set)  # mixed tasks' per-member metrics (names.per_task)


def _keys_whose_values(campaign: Campaign, types: tuple) -> set[str]:
    def ok(v) -> bool:
        return isinstance(v, types) and (bool in types or not isinstance(v, bool))

    return {k for k, values in campaign.config.sweep.items() if all(ok(v) for v in values)}


def campaign_metrics(campaign: Campaign) -> CampaignMetrics:
    trials = [t.trial for t in campaign.trials]
    metrics = {report_metric(c) for c in trials}
    if len(metrics) > 1:  # eval on in some conditions only: curves of the one every trial logs
        metrics = {TRAIN_METRIC}
    return CampaignMetrics(
        logged=set().union(*(logged_metrics(c) for c in trials)), metric=metrics.pop(),
        swept=list(campaign.config.sweep), numeric=_keys_whose_values(campaign, (int, float)),
        scalar=_keys_whose_values(campaign, (int, float, str, bool)), agentic=any(c.task.agentic for c in trials),
        sepa=any(sepa_settings(c).steps > 0 for c in trials),
        token_stages=any(c.credit.stages for c in trials),
        rv_filter=any(c.interventions.rv_filter.is_active for c in trials),
        kinds=sorted({c.credit.uncertainty_kind for c in trials}), tasks=set().union(*(per_task(c) for c in trials)))


def _line(m: CampaignMetrics, title: str, *names: str) -> wr.LinePlot | None:
    """A line plot of the names some trial logs (None when no trial logs any)."""
    y = [n for n in names if n in m.logged]
    return wr.LinePlot(title=title, y=y, **BAND) if y else None


def _section(name: str, panels: list, is_open: bool = False) -> ws.Section | None:
    panels = [p for p in panels if p is not None]
    return ws.Section(name=name, panels=panels, is_open=is_open) if panels else None


def _outcome(m: CampaignMetrics) -> ws.Section:
    final = wr.BarPlot(title=f"final {m.metric} per group", metrics=[wr.SummaryMetric(m.metric)],
                       **BAND)
    return _section("Outcome", [
        _line(m, f"{m.metric} (report metric)", m.metric), _line(m, "train correct rate", TRAIN_METRIC),
        _line(m, "train reward", "train/reward_mean"), _line(m, "held-out pass@k", "eval/pass@k"), final,
    ], is_open=True)


def _eval_sets(m: CampaignMetrics) -> ws.Section | None:
    """One panel per `eval.sets` entry (names.py: `eval/<set>/pass@1`)."""
    sets = sorted({k.split("/")[1] for k in m.logged if k.count("/") == 2 and k.startswith("eval/")
                   and k.endswith("/pass@1")})
    return _section("Held-out sets", [_line(m, f"{s}: pass@1 / pass@k", f"eval/{s}/pass@1", f"eval/{s}/pass@k")
                                      for s in sets], is_open=True)


def _sweep_sections(m: CampaignMetrics) -> list[ws.Section]:
    """One section per swept key: the final value and the AUC of the report's metric against the swept value
    (one point per group: condition x swept values), then the parallel coordinates over every swept key."""
    out = []
    final, auc = wr.SummaryMetric(m.metric), wr.SummaryMetric(AUC_PREFIX + m.metric)
    for key in m.swept:
        if key in m.numeric:
            panels = [wr.ScatterPlot(title=f"final {m.metric} vs {key}", x=wr.Config(key), y=final),
                      wr.ScatterPlot(title=f"AUC of {m.metric} vs {key}", x=wr.Config(key), y=auc)]
        else:  # categories or tables: a bar per value (tables by their position in the sweep list)
            panels = [wr.BarPlot(title=f"final and AUC of {m.metric} per {key}", metrics=[final, auc],
                                 groupby=wr.Config(key), **BAND)]
        out.append(_section(f"Sweep: {key}", panels, is_open=True))
    if m.swept:
        columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in m.swept if k in m.scalar]
        columns += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(m.metric), display_name="final"),
                    wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(AUC_PREFIX + m.metric),
                                                     display_name="AUC")]
        out.append(_section("Sweep: all keys", [
            wr.ParallelCoordinatesPlot(title="swept keys -> final and AUC", columns=columns)], is_open=True))
    return out


def _credit(m: CampaignMetrics) -> ws.Section | None:
    variance = [_line(m, f"execution {kind} variance (before / after the token stages)", f"credit/exec_{kind}_var",
                      *((f"credit/exec_{kind}_var_after",) if m.token_stages else ())) for kind in m.kinds]
    return _section("Credit diagnostics", [
        _line(m, "SEPA lambda", "credit/sepa_lambda", "credit/sepa_gate_open") if m.sepa else None, *variance,
        _line(m, "planning token fraction", "credit/planning_token_frac"),
        _line(m, "token advantage |mean|", "credit/adv_token_abs_mean", "credit/adv_token_mean"),
        _line(m, "decomposition: noise share of surprisal variance", "credit/decomp_exec_noise_share",
              "credit/decomp_plan_noise_share"),
        _line(m, "decomposition: SEPA's removed variance (noise share)", "credit/decomp_exec_removed_noise_share"),
    ])


def _interventions(m: CampaignMetrics) -> ws.Section | None:
    floors = sorted(n for n in m.logged if n.startswith("entropy/") and n.endswith("_mean"))
    rv = m.rv_filter
    return _section("Interventions", [
        _line(m, "entropy bonus term", "loss/entropy_bonus"),
        _line(m, "KL to the reference", "kl/ref", "kl/ref_k3"), _line(m, "KL loss term", "loss/kl"),
        _line(m, "RV filter: kept ratio", "rv_filter/kept_ratio") if rv else None,
        _line(m, "RV filter: return std (all vs kept groups)", "rv_filter/std_all_mean",
              "rv_filter/std_kept_mean") if rv else None,
        _line(m, "RV filter: zero-std groups", "rv_filter/zero_std_groups") if rv else None,
        _line(m, "entropy floors: class mean entropy", *floors),
        _line(m, "entropy floors: penalty", "entropy/floor_penalty"),
        _line(m, "probability floor: smallest valid action prob", "floor/learner_min_valid_prob",
              "floor/sampler_min_valid_prob"),
        _line(m, "probability floor: action log-prob min", "floor/action_logprob_min"),
    ])


def _ppo(m: CampaignMetrics) -> ws.Section:
    return _section("PPO and critic", [
        _line(m, "policy entropy", "policy/entropy_mean"),
        _line(m, "clip fraction", "train/clip_frac", "critic/vf_clip_frac"),
        _line(m, "losses", "loss/total", "loss/policy"), _line(m, "value loss", "loss/value"),
        _line(m, "critic explained variance", "critic/explained_variance"),
        _line(m, "critic value vs return", "critic/value_mean", "critic/return_mean"),
        _line(m, "grad norm", "train/grad_norm", "critic/grad_norm"),
        _line(m, "rollout vs learner log-prob gap", "train/logprob_gap_mean", "train/logprob_gap_max"),
        _line(m, "truncated importance weights", "tis/weight_mean", "tis/truncated_frac"),
        _line(m, "learning rate", "train/lr"),
    ])


def _env(m: CampaignMetrics) -> ws.Section | None:
    if not m.agentic:
        return None
    return _section("Environment", [
        _line(m, "success (train / held-out)", "env/success", "eval/success"),
        _line(m, "episode return", "env/return_mean", "eval/return_mean"),
        _line(m, "turns per episode", "env/turns_mean", "env/turns_max"),
        _line(m, "actions per episode", "env/actions_mean"),
        _line(m, "invalid actions / format penalties", "env/invalid_action_rate", "env/format_penalty_rate"),
        _line(m, "truncated episodes", "env/truncated_rate"),
    ])


def _tasks(m: CampaignMetrics) -> ws.Section | None:
    """A mixed task's members side by side: one panel per measure, a line per member (`<family>/<label>/...`)."""
    def each(family: str, metric: str) -> list[str]:
        return sorted(n for n in m.tasks if n.startswith(f"{family}/") and n.endswith(f"/{metric}")
                      and n.count("/") == 2)

    return _section("Tasks (mix members)", [
        _line(m, "train correct rate per task", *each("train", "correct_rate")),
        _line(m, "held-out pass@1 per task", *each("eval", "pass@1")),
        _line(m, "env success per task (train / held-out)", *each("env", "success"), *each("eval", "success")),
    ], is_open=True)


def _effective_batch(m: CampaignMetrics) -> ws.Section | None:
    """The report's effective-batch section as panels: did the conditions train on comparable batches?"""
    return _section("Effective batch", [
        _line(m, "groups sampled / informative / trained", "train/groups_sampled", "train/groups_informative",
              "train/groups_kept"),
        _line(m, "tokens trained", "train/tokens_trained"),
        _line(m, "overlong share / masked", "train/overlong_share", "train/overlong_masked"),
        _line(m, "refill rounds", "train/fill_rounds"),
    ], is_open=True)


def _rollout_and_timing(m: CampaignMetrics) -> ws.Section:
    return _section("Rollout and timing", [
        _line(m, "seconds per phase", "time/generate_s", "time/score_s", "time/train_s", "time/sync_s",
              "time/eval_s", "time/prefetch_s", "time/learner_wait_s"),
        _line(m, "rollout tokens/s", "rollout/tokens_per_s"),
        _line(m, "completion length (tokens)", "train/completion_len"),
        _line(m, "groups kept / skipped", "train/groups_kept", "train/groups_skipped_all_correct",
              "train/groups_skipped_all_wrong", "train/nonfinite_groups"),
        _line(m, "adapter version / staleness", "rollout/adapter_version", "rollout/staleness"),
        # rollout.mode async (docs/guides/staleness.md): a panel only when some trial logs them
        _line(m, "staleness of trained tokens (mean / max)", "async/staleness_mean", "async/staleness_max"),
        _line(m, "groups offered / dropped / delayed", "async/groups_offered", "async/groups_dropped",
              "async/groups_delayed"),
        _line(m, "mismatch KL(behaviour || proximal)", "mismatch/k1", "mismatch/k2", "mismatch/k3"),
        _line(m, "decoupled weights", "decoupled/weight_mean", "decoupled/masked_frac"),
        _line(m, "grader errors / timeouts", "train/grader_errors", "train/grader_timeouts"),
    ])


def view_name(campaign: str) -> str:
    """The view's internal name (`nw-<11 hex>-v`, the form the library generates): one per campaign in a
    project (views belong to a project), the same in a dry run as when saved."""
    digest = hashlib.sha1(campaign.encode()).hexdigest()[:11]
    return f"nw-{digest}-v"


def build_workspace(campaign: Campaign, entity: str, project: str) -> ws.Workspace:
    """The campaign's saved view (not yet saved)."""
    m = campaign_metrics(campaign)
    cfg = campaign.config
    sections = [_outcome(m), _tasks(m), _eval_sets(m), *_sweep_sections(m), _effective_batch(m), _credit(m),
                _interventions(m), _ppo(m),
                _env(m), _rollout_and_timing(m)]
    view = ws.Workspace(
        entity=entity, project=project, name=cfg.name, sections=[s for s in sections if s is not None],
        settings=ws.WorkspaceSettings(max_runs=max(10, len(campaign.trials))),
        runset_settings=ws.RunsetSettings(
            filters=expr.And(expr.Metric("Group") == cfg.name, expr.Metric("JobType").isin(list(cfg.conditions))),
            groupby=[expr.Config("condition"), *(expr.Config(k) for k in m.swept)]),
    )
    view._internal_name = view_name(cfg.name)
    return view


def payload(view: ws.Workspace) -> dict:
    """The view as the library sends it (`upsertView`'s variables; `spec` parsed)."""
    model = view._to_model()
    spec = json.loads(model.spec.model_dump_json(by_alias=True, exclude_none=True))
    return {"entity": model.entity, "project": model.project, "name": model.name, "displayName": model.display_name,
            "type": "project-view", "spec": spec}


def describe(view: ws.Workspace) -> str:
    """Sections and panels as text, one panel a line."""
    lines = [f"view '{view.name}' in {view.entity or '(your default entity)'}/{view.project}",
             f"  runs: {view.runset_settings.filters}; grouped by {', '.join(str(g) for g in view.runset_settings.groupby)}"]
    for s in view.sections:
        lines.append(f"  [{s.name}]")
        for p in s.panels:
            lines.append(f"    {type(p).__name__}: {p.title or ''} <- {', '.join(panel_keys(p))}")
    return "\n".join(lines)


def _key(metric) -> str:
    if isinstance(metric, wr.Config):
        return f"config:{metric.name}"
    if isinstance(metric, wr.SummaryMetric):
        return f"summary:{metric.name}"
    return str(metric)


def panel_keys(panel) -> list[str]:
    """The keys a panel reads: history names as is, `summary:<name>`, `config:<key path>`."""
    if isinstance(panel, wr.LinePlot):
        return [_key(y) for y in panel.y]
    if isinstance(panel, wr.ScatterPlot):
        return [_key(panel.x), _key(panel.y)]
    if isinstance(panel, wr.BarPlot):
        return [_key(x) for x in panel.metrics] + ([_key(panel.groupby)] if panel.groupby else [])
    if isinstance(panel, wr.ParallelCoordinatesPlot):
        return [_key(c.metric) for c in panel.columns]
    return []
