"""`python -m orchestrator plan CAMPAIGN [--pilot DIR] [--effect X]`: what a campaign will cost before it launches.

Per trial: steps, generations and tokens (upper bounds: every generation at max_tokens), a step time and its
source: a pilot campaign's measured step wall time (Tune's `time_this_iter_s`, the median after the first step,
with the `time/*` parts beside it) for the same condition (else the pilot's median), or the cost model of
orchestrator/preflight/cost_model.py. Then GPU-hours, how many trials the cluster holds at once (the campaign's resources
against --gpus/--cpus, else the Ray cluster at RAY_ADDRESS, else this machine) and the makespan (longest-first
list scheduling of the trials, by rounds under lockstep). With --effect (in the metric's units) and a pilot: the
seeds per condition that detect it at 80% power with the pilot's paired sd, at the level the report's Holm
correction gives its first comparison (alpha / m over the m comparisons of the family: conservative).
"""

from __future__ import annotations

import heapq
import math
import os
import statistics
from dataclasses import dataclass, field

from orchestrator.campaign.schema import Campaign, ExpandedTrial
from orchestrator.campaign.sections import CONTRAST, MEASURE
from orchestrator.config.errors import UserError
from orchestrator.config.placement import bundles, with_placement
from orchestrator.preflight.cost_model import device_kind, overhead_seconds, step_tokens, step_wall
from orchestrator.preflight.pilot import pilot_overhead_s, pilot_runs, pilot_step_s

POWER, ALPHA = 0.8, 0.05


@dataclass
class Cluster:
    gpus: float
    cpus: float
    source: str


@dataclass
class TrialPlan:
    trial: ExpandedTrial
    step_s: float | None
    source: str  # "pilot" | "cost model" | "unknown"
    gpus: float
    cpus: float
    overhead_s: float = 0.0  # outside the steps: start-up, evaluations' bookkeeping, checkpoints, syncs
    overhead_source: str = "none"  # "pilot" (measured walls) | "modelled"

    @property
    def hours(self) -> float:
        return (self.trial.trial.steps * (self.step_s or math.nan) + self.overhead_s) / 3600.0


@dataclass
class Plan:
    campaign: Campaign
    trials: list[TrialPlan]
    cluster: Cluster
    at_once: int
    makespan_h: float
    power: list[str] = field(default_factory=list)
    calibration: object = None  # orchestrator/config/calibration.py:Calibration, when `--calibration` gave one

    @property
    def gpu_hours(self) -> float:
        return sum(t.hours * t.gpus for t in self.trials)


# ----------------------------------------------------------------------------------------------- cluster
def cluster_size(gpus: float | None, cpus: float | None) -> Cluster:
    if gpus is not None or cpus is not None:
        return Cluster(gpus or 0.0, cpus if cpus is not None else math.inf, "--gpus/--cpus")
    if os.environ.get("RAY_ADDRESS"):
        import ray

        ray.init(log_to_driver=False)
        total = ray.cluster_resources()
        return Cluster(total.get("GPU", 0.0), total.get("CPU", 0.0), f"Ray cluster {os.environ['RAY_ADDRESS']}")
    return Cluster(float(local_gpus()), float(os.cpu_count() or 1), "this machine (no --gpus, no RAY_ADDRESS)")


def local_gpus() -> int:
    """This machine's NVIDIA GPUs as `nvidia-smi -L` lists them (CUDA_VISIBLE_DEVICES narrows them), without
    importing torch: `plan` stays a quick, light command."""
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def trials_at_once(trials: list[TrialPlan], cluster: Cluster, limit: int | None) -> int:
    """How many of the campaign's (largest) trials fit the cluster together."""
    gpus, cpus = max(t.gpus for t in trials), max(t.cpus for t in trials)
    n = len(trials)
    if gpus:
        n = min(n, int(cluster.gpus // gpus))
    if cpus and math.isfinite(cluster.cpus):
        n = min(n, int(cluster.cpus // cpus))
    return min(n, limit) if limit else n


def makespan(durations: list[float], slots: int) -> float:
    """Longest-processing-time-first list scheduling on `slots` machines (hours in, hours out)."""
    if slots <= 0:
        return math.inf
    ends = [0.0] * slots
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(ends, ends[0] + d)
    return max(ends)


# ----------------------------------------------------------------------------------------------- power
def _measure_of(campaign: Campaign, measure: str | None) -> str:
    if measure:
        return measure
    if campaign.config.adaptive:
        return campaign.config.adaptive.measure
    steps = min(t.trial.steps for t in campaign.trials)
    return "auc_0_15" if steps > 15 else "final"


def power_lines(campaign: Campaign, runs: list[dict], effect: float, measure: str, metric: str | None) -> list[str]:
    """Seeds per condition to detect `effect` at 80% power, from the pilot's paired sd of each comparison."""
    from orchestrator.campaign.sections import measure_value
    from orchestrator.stats.power import seeds_for_power

    conds = list(campaign.config.conditions)
    adaptive = campaign.config.adaptive
    pairs = [(c, conds[0]) for c in conds[1:]]
    if adaptive:
        pairs = [tuple(CONTRAST.match(adaptive.contrast).groups())]
    m = max(len(pairs), 1)
    alpha = ALPHA / m
    value = {(r["condition"], r["seed"]): measure_value(r["rows"], measure, metric) for r in runs}
    out = [f"seeds to detect {effect:g} ({measure} of {metric or 'the report metric'}) at {POWER:.0%} power: "
           f"Holm over {m} comparison{'s' * (m > 1)} vs {pairs[0][1] if pairs else '-'}, planned at "
           f"alpha {ALPHA:g}/{m} = {alpha:.3g} (Holm's first step; conservative)"]
    sds, counts = [], []
    for other, base in pairs:
        seeds = sorted({s for c, s in value if c == base} & {s for c, s in value if c == other})
        d = [value[other, s] - value[base, s] for s in seeds]
        d = [x for x in d if math.isfinite(x)]
        if len(d) < 2:
            out.append(f"  {other}-{base}: the pilot has {len(d)} complete pair(s); needs 2 for a paired sd")
            continue
        sd = statistics.stdev(d)
        if sd == 0:
            out.append(f"  {other}-{base}: the pilot's {len(d)} paired differences are all equal (sd 0): it cannot "
                       "size this comparison")
            continue
        sds.append(sd)
        counts.append(len(d))
        n = seeds_for_power(effect, sd, alpha, POWER)
        out.append(f"  {other}-{base}: pilot paired sd {sd:.4g} over {len(d)} pairs -> {n} seeds per condition")
    if sds:
        pooled = math.sqrt(sum(s * s for s in sds) / len(sds))
        n = seeds_for_power(effect, pooled, alpha, POWER)
        note = " (a paired sd from 2 pairs is itself very uncertain)" if min(counts) < 3 else ""
        out.append(f"  pooled paired sd {pooled:.4g} -> {n} seeds per condition{note}")
        if adaptive:
            out.append(f"  adaptive seeds run {adaptive.start}..{adaptive.max} (looks at {adaptive.looks()}); "
                       f"alpha spending keeps the procedure at {adaptive.alpha:g}")
    return out


# ----------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class PlanRequest:
    """What `python -m orchestrator plan` is asked: a pilot campaign's directory for measured step times and
    paired sds, the effect to power for, the cluster's size (else found), the GPU kind for the cost model, and the
    measure / metric the power lines use."""

    pilot: str | None = None
    effect: float | None = None
    gpus: float | None = None
    cpus: float | None = None
    device: str | None = None
    measure: str | None = None
    metric: str | None = None
    calibration: str | None = None  # a calibration file (benchmarks/calibrate.py): measured rates, not assumed


def make_plan(campaign: Campaign, request: PlanRequest = PlanRequest(), cluster: Cluster | None = None) -> Plan:
    pilot, effect, measure, metric = request.pilot, request.effect, request.measure, request.metric
    if measure is not None and not MEASURE.match(measure):
        raise UserError(f"--measure: {measure!r}: must be auc_LO_HI (e.g. auc_0_15) or final")
    runs = pilot_runs(pilot) if pilot else []
    kind = device_kind(request.device)
    cal = None
    if request.calibration:
        from orchestrator.config.calibration import load_calibration

        cal = load_calibration(request.calibration)
    trials = []
    for t in campaign.trials:
        b = bundles(t.trial)
        g, c = sum(x.get("GPU", 0) for x in b), sum(x.get("CPU", 0) for x in b)
        step_s, source = (pilot_step_s(runs, t.condition), "pilot") if runs else (None, "")
        if step_s is None:
            wall = step_wall(t.trial, kind if g else "cpu", cal)  # generation overlapped with the learner when k > 0
            step_s, source = (wall, "calibration" if cal else "cost model") if wall is not None else (None, "unknown")
        outside = pilot_overhead_s(runs, t.condition, step_s) if runs and step_s is not None else None
        over = (outside, "pilot") if outside is not None else (
            sum(overhead_seconds(t.trial, kind if g else "cpu", cal).values()), "calibration" if cal else "modelled")
        trials.append(TrialPlan(t, step_s, source, g, c, *over))
    cluster = cluster or cluster_size(request.gpus, request.cpus)
    cfg = campaign.config
    at_once = trials_at_once(trials, cluster, cfg.max_concurrent_trials)
    if cfg.schedule.mode == "lockstep":
        k = cfg.schedule.round_steps
        rounds = max(-(-t.trial.trial.steps // k) for t in trials)
        span = sum(makespan([min(k, max(t.trial.trial.steps - r * k, 0)) * (t.step_s or math.nan) / 3600
                             for t in trials], at_once) for r in range(rounds))
        span += makespan([t.overhead_s / 3600 for t in trials], at_once)  # start-ups etc., at least once each
    else:
        span = makespan([t.hours for t in trials], at_once)
    plan = Plan(campaign, trials, cluster, at_once, span, calibration=cal)
    if effect is not None:
        plan.power = (power_lines(campaign, runs, effect, _measure_of(campaign, measure), metric) if runs else
                      [f"seeds to detect {effect:g}: needs --pilot DIR (the pilot's paired sd)"])
    return plan


def other_placement(campaign: Campaign) -> Campaign | None:
    """The campaign with `resources.placement` flipped (colocated <-> separate), as the user would get it by
    changing that one key: the campaign's `resources:` when it has one (its rollout_workers and worker_gpus then
    apply to separate), else each trial's (orchestrator/config/placement.py:with_placement). None when some trial
    cannot take the other placement (no learner GPU to share, or one_step_off under colocated)."""
    import dataclasses

    from orchestrator.campaign.expand import expand

    first = campaign.trials[0].trial.resources.placement
    target = "separate" if first == "colocated" else "colocated"
    cfg = campaign.config
    if cfg.resources is not None:
        flipped = cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"placement": target})})
        try:
            trials = expand(flipped, campaign.source, campaign.directory)
        except UserError:
            return None
        if target == "colocated" and any(t.trial.resources.learner_gpus <= 0 for t in trials):
            return None
        return dataclasses.replace(campaign, config=flipped, trials=trials)
    trials = []
    for t in campaign.trials:
        other = with_placement(t.trial, target)
        if other is None:
            return None
        trials.append(dataclasses.replace(t, trial=other, config=other.model_dump(mode="json")))
    return dataclasses.replace(campaign, trials=trials)


def placement_of(plan: Plan) -> str:
    kinds = sorted({t.trial.trial.resources.placement for t in plan.trials})
    return "/".join(kinds)


def compare_lines(plan: Plan, other: Plan | None) -> list[str]:
    """`--compare-placement`: the chosen placement and the other side by side."""
    if other is None:
        return ["", "compare placement: the other placement does not apply (no learner GPU to share, or "
                "rollout.mode one_step_off or async, which colocated refuses)"]
    rows = [("placement", "GPUs per trial", "trials at once", "GPU-hours", "makespan")]
    for p, mark in ((plan, " (chosen)"), (other, "")):
        rows.append((placement_of(p) + mark, f"{max(t.gpus for t in p.trials):g}", str(p.at_once),
                     f"{p.gpu_hours:.1f}", fmt_hours(p.makespan_h)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return ["", "compare placement:", table[0], "  ".join("-" * w for w in widths), *table[1:]]


def fmt_hours(h: float) -> str:
    if not math.isfinite(h):
        return "unknown"
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.1f} h"


def _size(c: Cluster) -> str:
    return f"{c.gpus:g} GPUs, " + (f"{c.cpus:g} CPUs" if math.isfinite(c.cpus) else "CPUs not counted")


def _lengths_note(plan: Plan) -> str:
    """Which trials the calibration's measured lengths apply to (its model and task), for the plan's source line."""
    cal = plan.calibration
    using = [t for t in plan.trials if cal.lengths(t.trial.trial.model.name, t.trial.trial.task.name)]
    if not using:
        return "; token counts: the upper bounds" if cal.prompt_tokens is None else (
            f"; its lengths ({cal.model} on {cal.task}) fit no trial here: token counts are the upper bounds")
    return (f"; {len(using)} of {len(plan.trials)} trial(s) at its measured lengths, {cal.prompt_tokens:.0f}-token "
            f"prompts and {cal.completion_tokens:.0f}-token completions ({cal.model} on {cal.task})")


def render(plan: Plan, shared: bool = False) -> str:
    """`plan`'s table; `shared`: the campaign runs on a shared base, whose own lines judge its GPU-hour budget
    (orchestrator/preflight/shared_plan.py:budget_line), not these separate trials'."""
    cfg = plan.campaign.config
    rows = [("trial", "steps", "gens/step", "gen tokens/step", "train tokens/step", "step time", "source",
             "GPUs", "GPU-hours")]
    for t in plan.trials:
        tok = step_tokens(t.trial.trial)
        rows.append((t.trial.name, str(t.trial.trial.steps), str(tok.generations), f"<={tok.generated:,}",
                     f"<={tok.trained:,}", f"{t.step_s:.1f} s" if t.step_s else "unknown", t.source,
                     f"{t.gpus:g}", f"{t.hours * t.gpus:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    table.insert(1, "  ".join("-" * w for w in widths))
    tokens = [step_tokens(t.trial.trial) for t in plan.trials]
    total_gens = sum(tok.generations * t.trial.trial.steps for tok, t in zip(tokens, plan.trials, strict=True))
    total_tok = sum(tok.generated * t.trial.trial.steps for tok, t in zip(tokens, plan.trials, strict=True))
    sources = sorted({t.source for t in plan.trials})
    lines = [f"plan for campaign {cfg.name}: {len(plan.trials)} trials"
             + (f" (adaptive seeds: {cfg.adaptive.start} of {cfg.adaptive.max} seeds at the first look; "
                "the table holds every trial that may run)" if cfg.adaptive else ""),
             *table, "",
             f"total: {sum(t.trial.trial.steps for t in plan.trials):,} steps, {total_gens:,} generations, "
             f"<= {total_tok:,} generated tokens, {plan.gpu_hours:.1f} GPU-hours",
             f"step time from: {', '.join(sources)}"
             + ("" if sources != ["cost model"] else " (FLOPs x assumed device efficiency, orchestrator/"
                "cost_model.py; give --pilot DIR for measured times)")
             + (f" (measured on {plan.calibration.device} with {plan.calibration.model}: decode throughput against "
                f"sequences in flight, {plan.calibration.learner_tokens_per_s:,.0f} learner tokens/s, adapter export "
                f"{plan.calibration.adapter_export_s:.2f} s + load {plan.calibration.adapter_load_s:.2f} s a step, "
                f"start-up {plan.calibration.startup_s:.1f} s, {plan.calibration.step_overhead_s:.2f} s a step's "
                f"other work{_lengths_note(plan)})" if plan.calibration is not None else ""),
             _outside_line(plan),
             f"placement: {placement_of(plan)}, {max(t.gpus for t in plan.trials):g} GPU(s) per trial",
             f"cluster: {_size(plan.cluster)} ({plan.cluster.source}): "
             f"{plan.at_once} trial(s) at once; makespan {fmt_hours(plan.makespan_h)}"
             + (f" in lockstep rounds of {cfg.schedule.round_steps} steps (plus a restart per trial per round "
                "when trials take turns)" if cfg.schedule.mode == "lockstep" else "")]
    if plan.at_once == 0:
        lines.append("  no trial fits this cluster: give the cluster's size with --gpus N --cpus N")
    if cfg.budget is not None:
        b = cfg.budget
        if b.gpu_hours is not None and not shared:
            lines.append(budget_line(b.gpu_hours, plan.gpu_hours))
        if b.deadline is not None:
            lines.append(f"budget: deadline {b.deadline:%Y-%m-%d %H:%M %Z}")
    return "\n".join(lines + plan.power)


def _outside_line(plan: Plan) -> str:
    """Where the time outside the steps comes from, and how much per trial."""
    per = [t.overhead_s for t in plan.trials]
    src = sorted({t.overhead_source for t in plan.trials})
    how = ("each trial's measured wall (events.jsonl) less its steps" if src == ["pilot"] else
           "modelled start-up, checkpoints, full-weight syncs and colocated sleep / wake (assumed rates, "
           "orchestrator/preflight/cost_model.py:overhead_seconds)" if src == ["modelled"] else
           "the calibration's start-up, modelled checkpoints" if src == ["calibration"] else ", ".join(src))
    return f"time outside the steps: {statistics.median(per) / 60:.1f} min a trial (median), from {how}"


def budget_line(budget: float, planned: float, what: str = "") -> str:
    """Whether a lockstep GPU-hour budget covers `planned` (`what`: the side it is the plan of)."""
    fits = "covers the plan" if budget >= planned else "ends the campaign early, at a round boundary"
    return f"budget: {budget:g} GPU-hours ({fits}{what})"


def paragraph(plan: Plan) -> str:
    """The one-paragraph version `run` prints before launching."""
    cfg = plan.campaign.config
    steps = sum(t.trial.trial.steps for t in plan.trials)
    source = ", ".join(sorted({t.source for t in plan.trials}))
    hours = (f"about {plan.gpu_hours:.1f} GPU-hours (step times from {source})" if math.isfinite(plan.gpu_hours)
             else "GPU-hours unknown (the model's size is not in its name: `plan --pilot DIR` measures it)")
    text = (f"plan: {len(plan.trials)} trials, {steps:,} steps, {hours}; {plan.at_once} trial(s) at once on "
            f"{_size(plan.cluster)}, makespan about {fmt_hours(plan.makespan_h)}")
    if cfg.schedule.mode == "lockstep":
        text += f"; lockstep rounds of {cfg.schedule.round_steps} steps"
    if cfg.budget is not None:
        b = cfg.budget
        parts = ([f"{b.gpu_hours:g} GPU-hours"] if b.gpu_hours else []) + \
            ([f"deadline {b.deadline:%Y-%m-%d %H:%M %Z}"] if b.deadline else [])
        text += "; budget " + ", ".join(parts)
    return text + "."
