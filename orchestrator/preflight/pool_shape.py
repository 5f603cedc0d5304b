"""The shape of a shared-base pool (`resources.shared_base: {slots, learners, engines, shape}`): what a pool of E
engines and L learners costs with k trials active, which shapes the cluster at hand holds, and the one
`shape: auto` picks (`plan` prints them beside separate trials; `run` resolves `auto` before launch).

The cost model, from one separate trial's step (orchestrator/preflight/shared_plan.py:split_step: generate g
seconds on one engine, score + train l seconds on one learner GPU, by the cost model of
orchestrator/preflight/cost_model.py, or a pilot's step split by its shares), with EFFICIENCY, GENERATE_BATCHED
and the learner's rate as they are (assumptions, not measurements):
- engines: each serves every slot's adapter and the k trials' sequences are spread evenly over the E engines, so
  each engine decodes k / E trials' batches at once; by shared_plan.generate_factor (the rate grows with the
  sequences in flight, capped by GENERATE_BATCHED and by what ONE engine's KV cache holds, `kv_sequences`) the
  engines' work per cycle is G = g x generate_factor(k / E). Fewer than one trial's batch per engine decodes at
  the rate of the sequences it holds (decode is bound by reading the weights), so more engines never make G
  longer, and past the point where one trial's batch fits one engine they stop making it shorter;
- learners: slot s trains on learner s mod L, each learner its slots in turn, one at a time; the busiest holds
  ceil(k / L) slots and trains for Lw = ceil(k / L) x l per cycle;
- pipelined: a slot's generation overlaps other slots' training (every trial stays synchronous: its own step is
  generate then train), so a cycle (every active trial one step) lasts C = max(G, Lw, o), o = one trial's own
  generation alone on the E engines + its training: what cannot overlap, since a trial's training waits for its
  own generation. This is the ideal pipeline (a lower bound of the real one: trials whose phases collide wait);
  the lock-step cycle, engines idle while learners train, is G + Lw. A trial's step time is C: the trials on
  lighter learners are taken as slow as the busiest's (an upper bound for them);
- busy shares per cycle: each engine G / C; a learner on average k l / L / C (the busiest ceil(k / L) l / C);
- the pool starts once (the separate trial's start-up), each trial its own start-up (TRIAL_START_S) and
  checkpoints; at most k trials run at once, the rest queue, longest first; the pool holds its GPUs
  (E x worker_gpus + L x learner_gpus) for the whole campaign: GPU-hours = GPUs x makespan;
- a campaign that sweeps base models gets one pool per model, every one of the same shape (resources are
  campaign-wide), side by side: GPUs add up, the cycle and the makespan are the slowest pool's. One pool per model
  is all: a pool that cannot use the cluster's GPUs usefully leaves them to other work, and GPU-hours count the
  pool's GPUs only;
- memory (when the model's config is on this machine and the GPU is named): a learner holds the base once and,
  per slot, its adapter, gradients and Adam moments (orchestrator/preflight/learner_memory.py); an engine the base,
  every slot's adapter and a KV cache in which each slot's share holds one model.max_model_len sequence
  (orchestrator/preflight/engine_memory.py).

With `plan --calibration FILE` (orchestrator/config/calibration.py) g and l come from the measured decode
throughput and learner rate, generate_factor follows the measured throughput against sequences in flight, and
each step adds its adapter's export to its learner's work and its load to every engine's (k loads a cycle).

The shapes tried: slots k from the values that change how many waves the trials run in (ceil(n / w), n the
pool's trials), at most the written slots under `shape: auto` (--slots or, for a campaign without a shared base,
n); learners 1..k; engines 1.. whatever the cluster holds beside them. `shape: auto` picks, of the shapes that fit,
the shortest makespan among those within SLACK (10%) of the lowest GPU-hours (ties: fewer GPUs, then fewer
learners, fewer slots).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.config.errors import UserError
from orchestrator.preflight.cost_model import device_kind, overhead_seconds
from orchestrator.preflight.plan import Cluster, fmt_hours, makespan
from orchestrator.preflight.shared_plan import (
    TRIAL_START_S,
    generate_factor,
    plan_pools,
    sequence_tokens,
    split_step,
)

SLACK = 0.10  # `shape: auto`: the shapes within this share of the lowest GPU-hours compete on makespan


@dataclass(frozen=True)
class Shape:
    engines: int
    learners: int
    slots: int

    def describe(self) -> str:
        return (f"{self.engines} engine{'s' * (self.engines != 1)} + {self.learners} "
                f"learner{'s' * (self.learners != 1)}, {self.slots} slot{'s' * (self.slots != 1)}")


@dataclass(frozen=True)
class Cycle:
    seconds: float  # C = max(G, Lw, own)
    generate_s: float  # G: each engine's decoding per cycle
    learn_s: float  # Lw: the busiest learner's training per cycle
    own_s: float  # one trial's generation alone + its training
    engine_busy: float  # G / C
    learner_busy: float  # mean over the learners: k l / L / C

    @property
    def busiest_learner(self) -> float:
        """The busiest learner's share of the cycle: ceil(k / L) l / C."""
        return self.learn_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def lockstep_s(self) -> float:
        return self.generate_s + self.learn_s


@dataclass(frozen=True)
class Step:
    """One trial's step as a pool's actors see it: `gen_s`, `learn_s` its generate seconds on one engine and train
    seconds on one learner; `batch` its sequences; `kv_sequences` what one engine's KV cache holds; with a
    calibration, `rate` the decode throughput against sequences in flight and the adapter's `export_s` (on its
    learner) and `load_s` (on every engine)."""

    gen_s: float
    learn_s: float
    batch: int = 1
    kv_sequences: float = math.inf
    rate: Callable[[float], float] | None = None
    export_s: float = 0.0
    load_s: float = 0.0


def cycle(step: Step, engines: int, learners: int, k: int) -> Cycle:
    """One cycle of a pool of `engines` and `learners` with `k` trials active, each taking `step` (module
    docstring)."""
    gen_s, learn_s, batch, kv_sequences = step.gen_s, step.learn_s, step.batch, step.kv_sequences
    rate, export_s, load_s = step.rate, step.export_s, step.load_s
    if engines < 1 or learners < 1 or k < 1:
        raise ValueError(f"a pool has at least 1 engine, 1 learner and 1 active slot (got {engines}, {learners}, {k})")
    g = gen_s * generate_factor(k / engines, batch, kv_sequences, rate) + k * load_s
    lrn = learn_s + export_s
    lw = -(-k // learners) * lrn
    own = gen_s * generate_factor(1 / engines, batch, kv_sequences, rate) + load_s + lrn
    c = max(g, lw, own)
    if c <= 0:
        return Cycle(0.0, g, lw, own, 0.0, 0.0)
    return Cycle(c, g, lw, own, g / c, k * lrn / learners / c)


@dataclass(frozen=True)
class PoolWork:
    """One pool's trials as the shape model sees them."""

    name: str  # the pool id
    gen_s: float  # the pool's largest trial's generate seconds on one engine (upper bound for mixed trials)
    learn_s: float
    batch: int  # sequences one trial decodes a step
    steps: tuple[int, ...]  # each trial's steps
    own_s: tuple[float, ...]  # each trial's own time outside its steps (start-up of a slot, checkpoints)
    start_s: float  # the pool's start-up, once
    engine_gpus: float
    learner_gpus: float
    engine_cpus: float
    learner_cpus: float
    driver_cpus: float
    # memory, when the model's config is here and the GPU named (else None: not a limit)
    most_per_learner: int | None = None  # slots one learner GPU holds
    kv_sequences: Callable[[int], float] | None = None  # k -> sequences one engine's KV cache holds
    most_engine_slots: int | None = None  # slots one engine holds with a max_model_len sequence each
    # a calibration (orchestrator/config/calibration.py): decode throughput against sequences in flight, a step's
    # adapter export (learner) and load (each engine)
    rate: Callable[[float], float] | None = None
    export_s: float = 0.0
    load_s: float = 0.0

    @property
    def trials(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class ShapePlan:
    shape: Shape
    gpus: float  # every pool's
    cpus: float
    at_once: int
    cycle: Cycle  # the slowest pool's
    makespan_h: float

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.makespan_h


def pool_gpus_of(pool: PoolWork, engines: int, learners: int) -> float:
    return engines * pool.engine_gpus + learners * pool.learner_gpus


def pool_cpus_of(pool: PoolWork, shape: Shape) -> float:
    return (shape.engines * pool.engine_cpus + shape.learners * pool.learner_cpus
            + min(shape.slots, pool.trials) * pool.driver_cpus)


def misfit(pools: list[PoolWork], shape: Shape, cluster: Cluster) -> tuple[str, str] | None:
    """(the key to change, why) when the cluster or a GPU's memory cannot hold `shape` in every pool; None when it
    fits."""
    if shape.learners > shape.slots:
        return "learners", (f"{shape.learners} learners for {shape.slots} slots: each learner holds at least one "
                            f"slot, at most {shape.slots} learners")
    gpus = sum(pool_gpus_of(p, shape.engines, shape.learners) for p in pools)
    if gpus > cluster.gpus + 1e-9:
        return "engines", (f"{len(pools) * shape.engines} engine(s) and {len(pools) * shape.learners} learner(s) "
                           f"hold {gpus:g} GPUs, the cluster has {cluster.gpus:g}")
    cpus = sum(pool_cpus_of(p, shape) for p in pools)
    if math.isfinite(cluster.cpus) and cpus > cluster.cpus + 1e-9:
        return "engines", (f"the engines, learners and trial drivers need {cpus:g} CPUs, the cluster has "
                           f"{cluster.cpus:g}")
    for p in pools:
        per = -(-shape.slots // shape.learners)
        if p.most_per_learner is not None and per > p.most_per_learner:
            return "learners", (f"{shape.slots} slots on {shape.learners} learner(s) put {per} on a learner GPU, "
                                f"which holds the base and at most {p.most_per_learner} slots' adapters and "
                                "optimizers")
        if p.most_engine_slots is not None and shape.slots > p.most_engine_slots:
            return "slots", (f"an engine serves every slot and holds at most {p.most_engine_slots} slots' adapters "
                             "with a model.max_model_len sequence each")
    return None


def shape_plan(pools: list[PoolWork], shape: Shape) -> ShapePlan:
    """The cost of `shape` in every pool (module docstring); the caller checks that it fits (`misfit`)."""
    worst, span, at_once = None, 0.0, 0
    for p in pools:
        k = min(shape.slots, p.trials)
        kv = p.kv_sequences(shape.slots) if p.kv_sequences is not None else math.inf
        c = cycle(Step(p.gen_s, p.learn_s, p.batch, kv, p.rate, p.export_s, p.load_s), shape.engines, shape.learners,
                  k)
        hours = p.start_s / 3600 + makespan([(n * c.seconds + o) / 3600 for n, o in zip(p.steps, p.own_s,
                                                                                         strict=True)], k)
        if worst is None or c.seconds > worst.seconds:
            worst = c
        span, at_once = max(span, hours), at_once + k
    gpus = sum(pool_gpus_of(p, shape.engines, shape.learners) for p in pools)
    return ShapePlan(shape, gpus, sum(pool_cpus_of(p, shape) for p in pools), at_once, worst, span)


def slot_choices(trials: int, cap: int) -> list[int]:
    """The slot counts worth trying for `trials` trials: ceil(trials / w), the fewest slots that run them in w
    waves, at most `cap`."""
    return sorted({min(-(-trials // w), cap) for w in range(1, trials + 1)})


def shapes(pools: list[PoolWork], cluster: Cluster, cap: int, exact: bool = False) -> list[ShapePlan]:
    """Every shape of at most `cap` slots (`exact`: of `cap` slots) that the cluster and the GPUs' memory hold,
    costed."""
    n = max(p.trials for p in pools)
    per_engine = sum(p.engine_gpus for p in pools) or 0.0
    per_learner = sum(p.learner_gpus for p in pools) or 0.0
    out = []
    for k in [cap] if exact else slot_choices(n, max(cap, 1)):
        for learners in range(1, k + 1):
            left = cluster.gpus - learners * per_learner
            if left < per_engine - 1e-9:
                break
            most = int((left + 1e-9) // per_engine) if per_engine else _most_engines_by_cpu(pools, cluster,
                                                                                             learners, k)
            for engines in range(1, max(most, 0) + 1):
                s = Shape(engines, learners, k)
                if misfit(pools, s, cluster) is None:
                    out.append(shape_plan(pools, s))
    return out


def _most_engines_by_cpu(pools: list[PoolWork], cluster: Cluster, learners: int, k: int) -> int:
    """Engines of a GPU-free pool: as many as the cluster's CPUs hold (at most 64)."""
    if not math.isfinite(cluster.cpus):
        return 64
    fixed = sum(learners * p.learner_cpus + min(k, p.trials) * p.driver_cpus for p in pools)
    per = sum(p.engine_cpus for p in pools)
    return min(int((cluster.cpus - fixed) // per) if per else 64, 64)


def choose(plans: list[ShapePlan]) -> tuple[ShapePlan, list[ShapePlan]]:
    """`shape: auto`'s rule: of the shapes within SLACK of the lowest GPU-hours, the shortest makespan (ties: fewer
    GPUs, fewer learners, fewer slots, fewer engines). Returns the pick and the shapes it was chosen among."""
    if not plans:
        raise ValueError("no shape to choose from")
    lowest = min(p.gpu_hours for p in plans)
    near = [p for p in plans if p.gpu_hours <= lowest * (1 + SLACK) + 1e-12]
    pick = min(near, key=lambda p: (p.makespan_h, p.gpus, p.shape.learners, p.shape.slots, p.shape.engines))
    return pick, near


def frontier(plans: list[ShapePlan]) -> list[ShapePlan]:
    """The shapes no other beats on both GPU-hours and makespan, cheapest first."""
    out: list[ShapePlan] = []
    for p in sorted(plans, key=lambda p: (p.gpu_hours, p.makespan_h, p.gpus)):
        if not out or p.makespan_h < out[-1].makespan_h - 1e-12:
            out.append(p)
    return out


# ----------------------------------------------------------------------------------------------- from a plan
def pool_works(plan, kind: str, resolve=None) -> list[PoolWork] | None:
    """The pools of the campaign of `plan` (orchestrator/preflight/plan.py:Plan, its trials planned separate), one
    per base model, with their memory limits when the model's config is on this machine (`resolve`: as in
    memory_check); None when a model's size is unknown. A calibration on the plan (`plan --calibration`) gives the
    rates."""
    cal = plan.calibration
    out = []
    for pid, group in plan_pools(plan).items():
        cfgs = [t.trial.trial for t in group]
        gpu = any(t.gpus for t in group)
        splits = [split_step(c, t.step_s if t.source == "pilot" else None, kind if gpu else "cpu", cal)
                  for c, t in zip(cfgs, group, strict=True)]
        if any(s is None for s in splits):
            return None
        first = cfgs[0]
        r = first.resources
        own = tuple(sum(v for key, v in overhead_seconds(c, kind if gpu else "cpu", cal).items() if key != "startup")
                    + TRIAL_START_S for c in cfgs)
        out.append(PoolWork(
            pid, max(s[0] for s in splits), max(s[1] for s in splits), first.rollout.prompts_per_step * first.rollout.n,
            tuple(c.steps for c in cfgs), own, overhead_seconds(first, kind if gpu else "cpu", cal)["startup"],
            r.worker_gpus, r.learner_gpus * r.learner_ranks, r.worker_cpus, r.learner_cpus, r.driver_cpus,
            *_memory(first, resolve), *((cal.decode_rate, cal.adapter_export_s, cal.adapter_load_s)
                                        if cal is not None and first.learner.mode == "lora" else ())))
    return out


def _memory(cfg, resolve) -> tuple:
    """(most slots a learner GPU holds, k -> sequences one engine's KV cache holds, most slots an engine holds), or
    Nones when the model's config is not on this machine or the GPU is not named."""
    from orchestrator.preflight.engine_memory import pool_engine, slots_fitting_engine
    from orchestrator.preflight.learner_memory import (
        GIB,
        RESERVE,
        gpu_memory_gib,
        learner_memory,
        model_counts,
        slots_fitting_learner,
    )

    have = gpu_memory_gib(cfg)
    if not have or cfg.resources.learner_gpus <= 0 or cfg.resources.worker_gpus <= 0:
        return None, None, None
    from orchestrator.actors.models import resolve_model_quietly

    counts = model_counts((resolve or resolve_model_quietly)(cfg.model), cfg, local_only=True)
    if counts is None:
        return None, None, None
    most_l = slots_fitting_learner(learner_memory(cfg, counts, 1), have * (1 - RESERVE) * GIB)
    one = pool_engine(cfg, counts, have, 1)
    tp = cfg.rollout.engine.tensor_parallel_size
    most_e = slots_fitting_engine(one.share, one.weights, one.adapters, counts.kv_per_token / tp,
                                  cfg.model.max_model_len)
    seq = sequence_tokens(cfg)
    return most_l, (lambda k: max(pool_engine(cfg, counts, have, k).kv_tokens / seq, 1.0)), most_e


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
        extra = [shape_plan(report.pools, written)]  # fits, but outside the shapes tried (e.g. more slots)
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
    p = shape_plan(pools, shape)
    return (f"plan: {len(plan.trials)} trials on a shared base of {shape.describe()} a pool ({len(pools)} pool(s), "
            f"{p.gpus:g} GPU(s)): cycle about {p.cycle.seconds:.1f} s, about {p.gpu_hours:.1f} GPU-hours, makespan "
            f"about {fmt_hours(p.makespan_h)} (cost model, pipelined; `plan` for the shapes side by side). Separate "
            "instead: " + paragraph(plan).removeprefix("plan: "))


def _bare_pool(cfg, trials: int) -> PoolWork:
    """A pool without costs (the model's size unknown): enough for the cluster's and memory's limits."""
    r = cfg.resources
    return PoolWork("pool", 1.0, 1.0, 1, (1,) * trials, (0.0,) * trials, 0.0, r.worker_gpus,
                    r.learner_gpus * r.learner_ranks, r.worker_cpus, r.learner_cpus, r.driver_cpus)
