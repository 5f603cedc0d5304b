"""The pool shape a campaign runs and `plan` prints, on the cost model of orchestrator/preflight/pool_shape.py:
`shape_report` (every shape of a campaign on its cluster and `shape: auto`'s pick), `shape_lines` / `why_line`
(`plan`'s table and the line saying why), `resolve_shape` (`shape: auto` at launch, pure), `check_shape` (the
one-line refusal of a written shape that cannot run), `run_paragraph` (the plan `run` prints)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from orchestrator.config.errors import UserError
from orchestrator.preflight.cost_model import device_kind
from orchestrator.preflight.plan import Cluster, fmt_hours
from orchestrator.preflight.pool_shape import (
    SLACK,
    Cycle,
    PoolWork,
    Shape,
    ShapePlan,
    choose,
    frontier,
    misfit,
    pool_gpus_of,
    pool_works,
    shape_plan,
    shapes,
)
from orchestrator.preflight.shared_plan import split_step


# ----------------------------------------------------------------------------------------------- `plan`'s lines
@dataclass(frozen=True)
class ShapeReport:
    pools: list[PoolWork]
    plans: list[ShapePlan]  # every shape that fits
    pick: ShapePlan | None
    near: list[ShapePlan]
    cap: int  # slots tried up to


def shape_report(plan, kind: str, cap: int, resolve=None) -> ShapeReport | None:
    """Every shape of the campaign of `plan` on its cluster and the auto pick; None when a model's size is
    unknown."""
    pools = pool_works(plan, kind, resolve)
    if pools is None:
        return None
    plans = shapes(pools, plan.cluster, cap)
    pick, near = choose(plans) if plans else (None, [])
    return ShapeReport(pools, plans, pick, near, cap)


def _row(name: str, gpus: float, at_once: int, cycle_s: float, gpu_h: float, span_h: float, learner: str,
         engine: float) -> tuple[str, ...]:
    return (name, f"{gpus:g}", str(at_once), f"{cycle_s:.1f} s" if math.isfinite(cycle_s) else "unknown",
            f"{gpu_h:.1f}", fmt_hours(span_h), learner, f"{engine:.2f}")


def _busy(c: Cycle) -> str:
    """A learner's mean busy share, and the busiest's when slots do not spread evenly."""
    mean, top = f"{c.learner_busy:.2f}", f"{c.busiest_learner:.2f}"
    return mean if mean == top else f"{mean} (max {top})"


def shape_lines(plan, report: ShapeReport | None, kind: str, chosen: Shape | None = None,
                written: Shape | None = None, auto: bool = False) -> list[str]:
    """`plan`'s pool-shape table: separate trials (the plan's), the written shape (`written`), the shapes no other
    beats on both GPU-hours and makespan, the auto pick; `auto`: the campaign sets shape: auto (the pick runs)."""
    head = f"pool shapes on {plan.cluster.gpus:g} GPUs" + (
        f", {plan.cluster.cpus:g} CPUs" if math.isfinite(plan.cluster.cpus) else "") + f" ({plan.cluster.source}):"
    if report is None:
        return ["", head, "  not planned: a model's size is unknown (its name does not say; --pilot DIR measures it)"]
    rows = [("trials run", "GPUs", "trials at once", "cycle", "GPU-hours", "makespan", "learner busy", "engine busy")]
    sep = [t for t in plan.trials if t.step_s]
    if sep:
        splits = [split_step(t.trial.trial, t.step_s if t.source == "pilot" else None,
                             kind if t.gpus else "cpu", plan.calibration) for t in sep]
        g = max(s[0] for s in splits if s)
        lrn = max(s[1] for s in splits if s)
        per = max(t.gpus for t in plan.trials)
        rows.append(_row(f"separate ({per:g} GPUs a trial)", plan.at_once * per, plan.at_once,
                         max(t.step_s for t in sep), plan.gpu_hours, plan.makespan_h, f"{lrn / (g + lrn):.2f}",
                         g / (g + lrn)))
    shown = frontier(report.plans)
    if len(shown) > 8:  # thinned: the cheapest, the fastest and evenly between
        idx = sorted({round(i * (len(shown) - 1) / 7) for i in range(8)})
        shown = [shown[i] for i in idx]
    extra = [p for p in report.plans if written is not None and p.shape == written]
    if written is not None and not extra and misfit(report.pools, written, plan.cluster) is None:
        extra = [shape_plan(report.pools, written, plan.cluster.cpus)]  # fits, but outside the shapes tried (e.g. more slots)
    if report.pick is not None and report.pick not in shown:
        shown.append(report.pick)
    for p in extra + [p for p in sorted(shown, key=lambda p: p.gpu_hours) if p not in extra]:
        mark = " (auto)" if p is report.pick else ""
        mark += " (as written)" if written is not None and p.shape == written else ""
        mark += " (chosen)" if chosen is not None and p.shape == chosen else ""
        rows.append(_row("pool: " + p.shape.describe() + mark, p.gpus, p.at_once, p.cycle.seconds, p.gpu_hours,
                         p.makespan_h, _busy(p.cycle), p.cycle.engine_busy))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out = ["", head, table[0], "  ".join("-" * w for w in widths), *table[1:]]
    if written is not None and not extra:
        why = misfit(report.pools, written, plan.cluster)
        out.append(f"  as written ({written.describe()}): does not fit: {why[1]}")
    out.append("  " + why_line(plan, report, auto))
    kv = "known" if all(p.kv_sequences is not None for p in report.pools) else "not counted (no model config here)"
    cal = plan.calibration
    rates = (f"rates measured ({cal.device}, {cal.model}: --calibration), a step's adapter export on its learner "
             "and load on every engine counted; " if cal is not None else "")
    out.append(f"  cycle: pipelined, max(engines' decoding, the busiest learner's training, one trial's own step); "
               f"{rates}KV cache and memory {kv}; slots tried up to {report.cap} (assumptions: "
               "orchestrator/preflight/pool_shape.py)")
    return out


def why_line(plan, report: ShapeReport, auto: bool) -> str:
    """The one line saying which shape `shape: auto` takes and why, against separate trials."""
    if report.pick is None:
        return "shape: auto has no shape to take: no pool fits this cluster (one engine and one learner at least)"
    p, lowest = report.pick, min(x.gpu_hours for x in report.plans)
    vs = ""
    if math.isfinite(plan.makespan_h) and plan.makespan_h > 0 and plan.gpu_hours > 0:
        vs = (f"; vs separate trials: makespan {p.makespan_h / plan.makespan_h:.2f}x, GPU-hours "
              f"{p.gpu_hours / plan.gpu_hours:.2f}x")
    return (f"shape: auto {'runs' if auto else 'would run'} {p.shape.describe()} ({p.gpus:g} GPUs): the shortest "
            f"makespan ({fmt_hours(p.makespan_h)}) of the {len(report.near)} shape(s) within {SLACK:.0%} of the "
            f"lowest GPU-hours ({lowest:.1f}) among the {len(report.plans)} that fit" + vs)


# ----------------------------------------------------------------------------------------------- at launch
def written_shape(cfg) -> Shape | None:
    """The shape a shared trial's config sets (None: no shared base, or shape: auto)."""
    sb = cfg.resources.shared_base
    if sb is None or sb.shape == "auto":
        return None
    return Shape(sb.engines or cfg.rollout.num_workers, sb.learners, sb.slots)


def with_shape(campaign, shape: Shape):
    """The campaign with every trial's resources.shared_base set to `shape` (learners, engines, slots concrete,
    shape None): the configs the pool and its trials run with."""
    def sb(r):
        return r.model_copy(update={"shared_base": r.shared_base.model_copy(update={
            "learners": shape.learners, "engines": shape.engines, "slots": shape.slots, "shape": None})})

    trials = []
    for t in campaign.trials:
        cfg = t.trial.model_copy(update={"resources": sb(t.trial.resources)}) \
            if t.trial.resources.shared_base is not None else t.trial
        trials.append(dataclasses.replace(t, trial=cfg, config=cfg.model_dump(mode="json")))
    c = campaign.config
    if c.resources is not None and c.resources.shared_base is not None:
        c = c.model_copy(update={"resources": sb(c.resources)})
    return dataclasses.replace(campaign, config=c, trials=trials)


def resolve_shape(campaign, cluster: Cluster, kind: str, resolve=None, started: dict | None = None):
    """`shape: auto` at launch, pure: the campaign with the shape `plan` picks for `cluster` (the auto rule over the
    cost model) set in every trial; `started`: trial name -> the config it started with (campaign.json of a
    resumed campaign), whose shape it keeps whatever the cluster now. Unchanged when no trial sets shape: auto.
    UserError (one line) when no shape fits the cluster."""
    from orchestrator.preflight.plan import make_plan
    from orchestrator.preflight.shared_plan import with_shared_base

    first = campaign.trials[0].trial.resources.shared_base
    if first is None or first.shape != "auto":
        return campaign
    for t in campaign.trials:
        before = ((started or {}).get(t.name) or {}).get("resources", {}).get("shared_base") or {}
        if before.get("learners") and before.get("engines") and before.get("shape") is None:
            return with_shape(campaign, Shape(before["engines"], before["learners"], before["slots"]))
    plan = make_plan(with_shared_base(campaign, None), cluster=cluster)
    report = shape_report(plan, kind, first.slots, resolve)
    if report is None:
        raise UserError(f"{campaign.source}: resources.shared_base.shape: auto needs the model's size (its name does "
                        "not say it); set learners and engines instead")
    if report.pick is None:
        raise UserError(f"{campaign.source}: resources.shared_base.shape: auto: no pool fits {cluster.gpus:g} GPUs, "
                        f"{cluster.cpus:g} CPUs ({cluster.source}): one engine and one learner need "
                        f"{sum(pool_gpus_of(p, 1, 1) for p in report.pools):g} GPUs a pool")
    return with_shape(campaign, report.pick.shape)


def check_shape(campaign, cluster: Cluster | None, resolve=None) -> None:
    """UserError (one line, exit 2) for a written shape that the cluster or a GPU's memory cannot hold, naming what
    fits: more learners than slots, more GPUs / CPUs than the cluster has, more slots a learner than its GPU holds.
    Nothing to check without a shared base or under shape: auto (resolved before launch); `cluster` None: the
    shape alone (learners against slots, a learner's memory), the cluster taken as large as it asks."""
    cfg = campaign.trials[0].trial
    shape = written_shape(cfg)
    if shape is None:
        return
    where = f"{campaign.source}: resources.shared_base"
    if cluster is None:  # no cluster named: what the shape itself needs (learners, memory), as large as it asks
        r = cfg.resources
        need = shape.engines * r.worker_gpus + shape.learners * r.learner_gpus * r.learner_ranks
        cluster = Cluster(need * len({pid for pid in plan_pools_of(campaign)}), math.inf, "the shape's own GPUs")
    from orchestrator.preflight.plan import make_plan
    from orchestrator.preflight.shared_plan import with_shared_base

    plan = make_plan(with_shared_base(campaign, None), cluster=cluster)
    pools = pool_works(plan, device_kind(cfg.resources.accelerator_type), resolve)
    if pools is None:
        pools = [_bare_pool(cfg, len(campaign.trials))]
    bad = misfit(pools, shape, cluster)
    if bad is None:
        return
    key, why = bad
    fits = shapes(pools, cluster, shape.slots, exact=True)
    if not fits:
        raise UserError(f"{where}.{key}: {shape.describe()}: {why}; no shape of {shape.slots} slots fits "
                        f"{cluster.gpus:g} GPUs ({cluster.source}): fewer slots, or a larger cluster")
    best = choose(fits)[0].shape
    same = [p.shape for p in fits if p.shape.learners == shape.learners and p.shape.engines < shape.engines]
    near = f"at most {max(s.engines for s in same)} engines with {shape.learners} learners, or " if same else ""
    raise UserError(f"{where}.{key}: {shape.describe()}: {why}; fits: {near}{best.describe()} (shape: auto's pick "
                    f"for {cluster.gpus:g} GPUs), or another that `plan` lists for this cluster")


def plan_pools_of(campaign) -> set[str]:
    from orchestrator.config.pool_key import pool_id

    return {pool_id(t.trial) for t in campaign.trials}


def run_paragraph(campaign) -> str:
    """`run`'s plan, against the Ray cluster it is connected to: a pool of several learners or engines by the shape
    model (the pipelined cycle), else orchestrator/preflight/shared_plan.py:run_paragraph's (separate trials, or
    the one-learner pool of rollout.num_workers engines in lock-step)."""
    import ray

    from orchestrator.preflight.plan import make_plan, paragraph
    from orchestrator.preflight.shared_plan import run_paragraph as plain
    from orchestrator.preflight.shared_plan import with_shared_base

    cfg = campaign.trials[0].trial
    shape = written_shape(cfg)
    if shape is None or (shape.learners == 1 and shape.engines == cfg.rollout.num_workers):
        return plain(campaign)
    total = ray.cluster_resources()
    cluster = Cluster(total.get("GPU", 0.0), total.get("CPU", 0.0), "the Ray cluster")
    plan = make_plan(with_shared_base(campaign, None), cluster=cluster)  # the trials as separate ones
    pools = pool_works(plan, device_kind(cfg.resources.accelerator_type))
    if pools is None:
        return plain(campaign)
    p = shape_plan(pools, shape, cluster.cpus)
    return (f"plan: {len(plan.trials)} trials on a shared base of {shape.describe()} a pool ({len(pools)} pool(s), "
            f"{p.gpus:g} GPU(s)): cycle about {p.cycle.seconds:.1f} s, about {p.gpu_hours:.1f} GPU-hours, makespan "
            f"about {fmt_hours(p.makespan_h)} (cost model, pipelined; `plan` for the shapes side by side). Separate "
            "instead: " + paragraph(plan).removeprefix("plan: "))


def _bare_pool(cfg, trials: int) -> PoolWork:
    """A pool without costs (the model's size unknown): enough for the cluster's and memory's limits."""
    r = cfg.resources
    return PoolWork("pool", 1.0, 1.0, 1, (1,) * trials, (0.0,) * trials, 0.0, r.worker_gpus,
                    r.learner_gpus * r.learner_ranks, r.worker_cpus, r.learner_cpus, r.driver_cpus)
