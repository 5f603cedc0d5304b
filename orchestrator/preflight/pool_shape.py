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
- a GPU-free pool (CPU engines and learners, the demo's) shares the cluster's cores: C is at least every
  engine's and learner's thread-seconds of the cycle over the cores, (E G te + k l tl) / cores (t: an actor's
  compute threads, its whole CPUs, at least 1; the drivers' grading and calls are left out: mostly waiting);
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
each step adds its adapter's export to its learner's work and its load to every engine's (k loads a cycle), and
the calibration's other work of a step (grading, collating, the calls) to the trial's own part o; a trial of the
model and task the calibration measured lengths for is planned at those lengths.

The shapes tried: slots k from the values that change how many waves the trials run in (ceil(n / w), n the
pool's trials), at most the written slots under `shape: auto` (--slots or, for a campaign without a shared base,
n); learners 1..k; engines 1.. whatever the cluster holds beside them. `shape: auto` picks, of the shapes that fit,
the shortest makespan among those within SLACK (10%) of the lowest GPU-hours (ties: fewer GPUs, then fewer
learners, fewer slots).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.preflight.cost_model import overhead_seconds
from orchestrator.preflight.plan import Cluster, makespan
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
    other_s: float = 0.0  # a calibration's per-step other work (grading, collating, the calls): the trial's own
    cores: float = math.inf  # a GPU-free pool: the CPU cores its engines and learners share (else not a limit)
    engine_threads: int = 1  # the compute threads of one engine / learner (Ray's OMP_NUM_THREADS: its CPUs, >= 1)
    learner_threads: int = 1


def cycle(step: Step, engines: int, learners: int, k: int) -> Cycle:
    """One cycle of a pool of `engines` and `learners` with `k` trials active, each taking `step` (module
    docstring)."""
    gen_s, learn_s, batch, kv_sequences = step.gen_s, step.learn_s, step.batch, step.kv_sequences
    rate, export_s, load_s, other_s = step.rate, step.export_s, step.load_s, step.other_s
    if engines < 1 or learners < 1 or k < 1:
        raise ValueError(f"a pool has at least 1 engine, 1 learner and 1 active slot (got {engines}, {learners}, {k})")
    g = gen_s * generate_factor(k / engines, batch, kv_sequences, rate) + k * load_s
    lrn = learn_s + export_s
    lw = -(-k // learners) * lrn
    own = gen_s * generate_factor(1 / engines, batch, kv_sequences, rate) + load_s + lrn + other_s
    # on CPU the engines and learners share the cores: a cycle's thread-seconds of both over the cores
    cores = (engines * g * step.engine_threads + k * lrn * step.learner_threads) / step.cores if step.cores > 0 \
        else math.inf
    c = max(g, lw, own, cores)
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
    other_s: float = 0.0  # a step's other work (the calibration's step_overhead_s)

    @property
    def trials(self) -> int:
        return len(self.steps)

    def step(self, kv: float, cores: float) -> Step:
        """One trial's step as `cycle` takes it; `cores`: the cluster's CPUs, a limit for a GPU-free pool only."""
        cpu_only = self.engine_gpus <= 0 and self.learner_gpus <= 0
        return Step(self.gen_s, self.learn_s, self.batch, kv, self.rate, self.export_s, self.load_s, self.other_s,
                    cores if cpu_only else math.inf, _threads(self.engine_cpus), _threads(self.learner_cpus))



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


def _threads(cpus: float) -> int:
    """An actor's compute threads: Ray sets OMP_NUM_THREADS to its whole CPUs, at least 1."""
    return max(1, int(cpus))


def shape_plan(pools: list[PoolWork], shape: Shape, cores: float = math.inf) -> ShapePlan:
    """The cost of `shape` in every pool (module docstring); the caller checks that it fits (`misfit`). `cores`: the
    cluster's CPUs, which a GPU-free pool's engines and learners share."""
    worst, span, at_once = None, 0.0, 0
    for p in pools:
        k = min(shape.slots, p.trials)
        kv = p.kv_sequences(shape.slots) if p.kv_sequences is not None else math.inf
        c = cycle(p.step(kv, cores), shape.engines, shape.learners, k)
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
                    out.append(shape_plan(pools, s, cluster.cpus))
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
                                        if cal is not None and first.learner.mode == "lora" else ()),
            other_s=cal.step_overhead_s if cal is not None else 0.0))
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
