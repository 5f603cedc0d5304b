"""`plan`'s shared-base side (`resources.shared_base: {slots: N}`): what a LoRA campaign costs when its trials run as
adapters on one pool (the engines and one learner hold the base once) instead of each on GPUs of its own.

The cost model (the separate trial's terms, orchestrator/preflight/cost_model.py; assumptions, not measurements):
- generation batches across trials: the engine decodes every active trial's sequences in one batch, and a batch
  of k trials' sequences reaches k times the effective FLOP rate one trial's batch reaches
  (EFFICIENCY['generate']), up to a ceiling GENERATE_BATCHED (decode of one trial's batch is bound by reading the
  weights and its KV cache; more sequences share the weight reads until the engine is compute bound), and no
  more sequences run at once than the pool's KV cache holds (when the model's config is on this machine; every
  generation at max_tokens). Without that cap k trials generate in g x max(1, k x EFFICIENCY['generate'] /
  GENERATE_BATCHED), g one trial's generate time; when one trial's batch already fills the KV cache, in k x g;
- the learner trains one slot at a time: k trials' score + train take k x l, l one trial's;
- a pool cycle (every active trial one step) is their sum: lock-step, the engine idle while the learner trains
  (an upper bound; trials that drift apart overlap one's generation with another's training, down to the larger
  of the two, printed beside it);
- the pool starts once (engines' build + the base's load, the separate trial's start-up); a trial's own start-up
  is its driver and a slot open (TRIAL_START_S); checkpoints are each trial's own, as separate;
- the pool holds its GPUs (one trial's engines + one learner rank) for the whole campaign: GPU-hours = pool GPUs x
  makespan; at most `slots` trials run at once, the rest queue (longest first; lockstep rounds are not modelled
  on this side);
- a campaign that sweeps base models gets one pool per model (orchestrator/config/pool_key.py), side by side:
  their GPUs and trials at once add up, the step time and makespan are the slowest pool's, and every pool holds
  its GPUs until the campaign ends.
With --pilot the measured step time is split into generate and learn by the cost model's shares; with
--calibration (orchestrator/config/calibration.py) the measured decode throughput against sequences in flight
replaces GENERATE_BATCHED's growth, the measured learner rate the learner's, and each step adds its adapter's
export + load. Pools of several engines or learners: orchestrator/preflight/pool_shape.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from orchestrator.campaign.schema import Campaign
from orchestrator.config.errors import UserError
from orchestrator.config.pool_key import pool_gpus, pool_id, shared_gpu_hours, shared_gpus
from orchestrator.preflight.cost_model import EFFICIENCY, device_kind, overhead_seconds, step_seconds
from orchestrator.preflight.plan import Cluster, budget_line, fmt_hours, make_plan, makespan, paragraph

GENERATE_BATCHED = 0.20  # effective share of the dense peak a large multi-trial decode batch reaches (assumed)
TRIAL_START_S = 10.0  # a shared trial's own start-up: its driver process and a slot open, no engine, no model load
DEFAULT_SLOTS = 8  # slots planned for a LoRA campaign that does not set resources.shared_base


def generate_factor(k: float, batch: int = 1, kv_sequences: float = math.inf, rate=None) -> float:
    """k trials' generation in one engine, in units of one trial's generate time: the rate grows with the
    sequences decoded at once (k x `batch`, one trial's, at most `kv_sequences`, what the KV cache holds) relative
    to one trial's, up to GENERATE_BATCHED / EFFICIENCY['generate']; `rate` (a calibration's decode throughput
    against sequences in flight) in place of that assumed growth."""
    one, many = min(batch, kv_sequences), min(k * batch, kv_sequences)
    if rate is not None:
        return k * rate(one) / rate(many)
    return k / min(many / one, GENERATE_BATCHED / EFFICIENCY["generate"])


def cycle_seconds(gen_s: float, learn_s: float, k: int, batch: int = 1,
                  kv_sequences: float = math.inf, rate=None) -> tuple[float, float]:
    """(lock-step, overlapped) seconds for k active trials to take one step each on one pool."""
    g, lrn = gen_s * generate_factor(k, batch, kv_sequences, rate), k * learn_s
    return g + lrn, max(g, lrn)


def sequence_tokens(cfg, prompt_tokens: int = 256) -> int:
    """KV tokens one generation holds at its longest (every turn at max_tokens; the cost model's prompt length)."""
    turns = cfg.rollout.max_turns if cfg.task.agentic else 1
    return min(cfg.model.max_model_len, turns * (prompt_tokens + cfg.rollout.max_tokens))


def with_shared_base(campaign: Campaign, slots: int | None) -> Campaign:
    """The campaign with resources.shared_base {slots} (None: without it), as the user would get it by setting that
    key; UserError (the refusal of orchestrator/campaign/shared.py) when its trials cannot share."""
    from orchestrator.campaign.expand import expand
    from orchestrator.campaign.shared import check_shared_base
    from orchestrator.config.sections import SharedBaseConfig

    cfg, shared = campaign.config, None if slots is None else SharedBaseConfig(slots=slots)
    if cfg.resources is not None:
        cfg = cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"shared_base": shared})})
        trials = expand(cfg, campaign.source, campaign.directory)
    else:
        trials = []
        for t in campaign.trials:
            other = t.trial.model_copy(update={"resources": t.trial.resources.model_copy(
                update={"shared_base": shared})})
            trials.append(dataclasses.replace(t, trial=other, config=other.model_dump(mode="json")))
    check_shared_base(cfg, trials, campaign.source)
    return dataclasses.replace(campaign, config=cfg, trials=trials)


def planned_slots(campaign: Campaign, slots: int | None = None) -> int:
    """Slots to plan: `slots` (plan --slots), else the campaign's resources.shared_base, else
    min(trials, DEFAULT_SLOTS)."""
    if slots is not None and slots < 1:
        raise UserError(f"--slots: {slots}: a shared pool has at least 1 slot")
    own = campaign.trials[0].trial.resources.shared_base
    return slots or (own.slots if own is not None else min(len(campaign.trials), DEFAULT_SLOTS))


@dataclass(frozen=True)
class SharedPlan:
    slots: int  # per pool
    gpus: float  # every pool's together: each one trial's engines + one learner rank
    at_once: int  # trials running at once, every pool's (each <= slots; 0: the pools do not fit the cluster)
    step_s: float  # a trial's step time with its pool's trials active (lock-step cycle; the slowest pool's)
    step_overlapped_s: float
    makespan_h: float
    makespan_overlapped_h: float
    pools: int = 1  # one per base model
    pool_trials: tuple = ()  # one trial config per pool (orchestrator/config/pool_key.py)

    @property
    def gpu_hours(self) -> float:
        """Every pool holds its GPUs until the campaign ends: the lockstep budget's charge too (one function)."""
        return shared_gpu_hours(self.pool_trials, self.makespan_h * 3600.0)


def split_step(cfg, step_s: float | None, kind: str, cal=None) -> tuple[float, float] | None:
    """(generate, learn) seconds of one trial's step: the cost model's (`cal`: a calibration's rates), or `step_s`
    (a pilot's) split by its shares; None when the model's size is unknown. A calibration's adapter sync is left
    out: the pool's model counts it on its own."""
    parts = step_seconds(cfg, kind, cal)
    if not parts:
        return None
    gen, learn = parts["generate"], parts["score"] + parts["train"]
    if step_s is not None and gen + learn > 0:
        gen, learn = step_s * gen / (gen + learn), step_s * learn / (gen + learn)
    return gen, learn


def plan_pools(plan) -> dict[str, list]:
    """The plan's trials (orchestrator/preflight/plan.py:TrialPlan) by the pool they would share: one per base model
    (orchestrator/config/pool_key.py; the plan's trials are separate, so every trial is counted)."""
    groups: dict[str, list] = {}
    for t in plan.trials:
        groups.setdefault(pool_id(t.trial.trial), []).append(t)
    return groups


def plan_shared(plan, slots: int, kind: str, kv_tokens: dict[str, int] | None = None) -> SharedPlan:
    """The shared pools' plan of the campaign of `plan` (orchestrator/preflight/plan.py:Plan, its trials' step times
    and cluster), `slots` slots a pool, one pool per base model; the pools run side by side, every one holding its
    GPUs until the last trial ends. `kv_tokens`: pool id -> what its engines' KV caches hold (missing: not known
    here, not a limit)."""
    groups = plan_pools(plan)
    firsts = tuple(g[0].trial.trial for g in groups.values())
    gpus = shared_gpus(firsts)
    fits = plan.cluster.gpus >= gpus if gpus else True
    if not fits:
        return SharedPlan(slots, gpus, 0, math.nan, math.nan, math.inf, math.nan, len(groups), firsts)
    at_once, steps, spans = sum(min(slots, len(g)) for g in groups.values()), [], []
    for pid, group in groups.items():
        part = _pool_plan(group, slots, kind if gpus else "cpu", (kv_tokens or {}).get(pid), plan.calibration)
        if part is None:
            return SharedPlan(slots, gpus, at_once, math.nan, math.nan, math.nan, math.nan, len(groups), firsts)
        steps.append(part[:2])
        spans.append(part[2:])
    return SharedPlan(slots, gpus, at_once, max(s[0] for s in steps), max(s[1] for s in steps),
                      max(s[0] for s in spans), max(s[1] for s in spans), len(groups), firsts)


def _pool_plan(trials: list, slots: int, kind: str, kv_tokens: int | None, cal=None):
    """(step s, overlapped step s, makespan h, overlapped makespan h) of one pool, or None when a model's size is
    unknown; `cal`: a calibration's rates (the adapter's export + load and a step's other work added to each
    trial's learn)."""
    cfgs = [t.trial.trial for t in trials]
    k = min(slots, len(cfgs))
    splits = [split_step(c, t.step_s if t.source == "pilot" else None, kind, cal) for c, t in zip(cfgs, trials,
                                                                                                strict=True)]
    if any(s is None for s in splits):
        return None
    gen = max(s[0] for s in splits)  # the cycle of the pool's largest trials (upper bound for mixed ones)
    learn = max(s[1] for s in splits) + (cal.adapter_export_s + cal.adapter_load_s + cal.step_overhead_s
                                         if cal is not None else 0.0)
    first = cfgs[0]
    batch = first.rollout.prompts_per_step * first.rollout.n
    kv_seqs = max(kv_tokens / sequence_tokens(first), 1.0) if kv_tokens is not None else math.inf
    step, step_over = cycle_seconds(gen, learn, k, batch, kv_seqs, cal.decode_rate if cal is not None else None)
    per_trial = [sum(v for key, v in overhead_seconds(c, kind, cal).items() if key != "startup") + TRIAL_START_S
                 for c in cfgs]
    pool_start = overhead_seconds(first, kind, cal)["startup"]

    def span(step_s: float) -> float:
        return pool_start / 3600 + makespan([(c.steps * step_s + o) / 3600 for c, o in zip(cfgs, per_trial,
                                                                                            strict=True)], k)

    return step, step_over, span(step), span(step_over)


def compare_rows(plan, shared: SharedPlan | None, why: str | None, chosen: bool = False,
                 kv_tokens: dict[str, int] | None = None) -> list[str]:
    """The table `plan` prints for a LoRA campaign: separate (the plan's) and shared side by side; `chosen`: the
    campaign sets resources.shared_base."""
    rows = [("trials run", "GPUs", "trials at once", "step time", "GPU-hours", "makespan")]
    sep_step = max((t.step_s or math.nan) for t in plan.trials)
    per = max(t.gpus for t in plan.trials)
    rows.append(("separate" + ("" if chosen else " (chosen)"), f"{plan.at_once * per:g} ({per:g} a trial)",
                 str(plan.at_once), _fmt_s(sep_step), f"{plan.gpu_hours:.1f}", fmt_hours(plan.makespan_h)))
    if shared is not None:
        pools = "one pool" if shared.pools == 1 else f"{shared.pools} pools, one per model"
        slots = f"{shared.slots} slots" + ("" if shared.pools == 1 else " a pool")
        rows.append((f"shared base, {slots}" + (" (chosen)" if chosen else ""), f"{shared.gpus:g} ({pools})",
                     str(shared.at_once),
                     f"{_fmt_s(shared.step_s)} ({_fmt_s(shared.step_overlapped_s)} overlapped)",
                     f"{shared.gpu_hours:.1f}",
                     f"{fmt_hours(shared.makespan_h)} ({fmt_hours(shared.makespan_overlapped_h)} overlapped)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out = ["", "shared base vs separate (LoRA):", table[0], "  ".join("-" * w for w in widths), *table[1:]]
    if shared is None:
        out.append(f"  shared base does not apply: {why}")
    else:
        held = ", ".join(f"{n:,}" for n in (kv_tokens or {}).values())
        kv = (f"the pool's KV cache ({held} tokens) caps the sequences decoded at once" if kv_tokens and len(kv_tokens) == 1
              else f"each pool's KV cache ({held} tokens) caps the sequences it decodes at once" if kv_tokens
              else "KV cache not counted (no model config here)")
        out += [f"  shared: k trials' generation batched in one engine, the rate growing with the sequences decoded "
                f"at once from {EFFICIENCY['generate']:g} to at most {GENERATE_BATCHED:g} of peak; {kv};",
                "  the learner trains one slot at a time; step time = generate + learn in lock-step (overlapped: the "
                "larger of the two); the pool starts once and holds its GPUs for the whole campaign",
                *([f"  one pool per base model ({shared.pools}), side by side, each with {shared.slots} slots; step "
                   "time: the slowest pool's"] if shared.pools > 1 else []),
                "  (assumptions: orchestrator/preflight/shared_plan.py)"]
        if plan.calibration is not None:
            out.append(f"  calibrated ({plan.calibration.device}, {plan.calibration.model}): the measured decode "
                       "throughput against sequences in flight and learner rate replace the assumed ones; each step "
                       "adds the adapter's export + load")
    return out


def _fmt_s(s: float) -> str:
    return f"{s:.1f} s" if math.isfinite(s) else "unknown"


def shared_section(campaign: Campaign, plan, slots: int, kind: str, chosen: bool = False, resolve=None) -> list[str]:
    """The lines `plan` prints for a LoRA campaign (none for a full fine-tuning one): separate (`plan`, the
    campaign without resources.shared_base) vs shared with `slots`; the pool's KV cache from the model's config
    when it is on this machine (`resolve`: as in memory_check)."""
    from orchestrator.preflight.memory_check import pool_kv_tokens

    if not any(t.trial.learner.mode == "lora" for t in campaign.trials):
        return []
    try:
        with_shared_base(campaign, slots)
    except UserError as e:
        return compare_rows(plan, None, str(e).split(": ", 1)[-1])
    kv = {pid: n for pid, group in plan_pools(plan).items() if pool_gpus(cfg := group[0].trial.trial)
          and (n := pool_kv_tokens(cfg, slots, resolve)) is not None}
    shared = plan_shared(plan, slots, kind, kv)
    budget = campaign.config.budget
    charged = [budget_line(budget.gpu_hours, shared.gpu_hours, f": {shared.gpu_hours:.1f} on the shared base, its "
                           "pools' GPUs x makespan, as the lockstep budget charges them")] \
        if chosen and budget is not None and budget.gpu_hours is not None else []
    return compare_rows(plan, shared, None, chosen, kv) + charged


def run_paragraph(campaign: Campaign) -> str:
    """`run`'s plan, against the Ray cluster it is connected to (cost model step times)."""
    import ray

    total = ray.cluster_resources()
    cluster = Cluster(total.get("GPU", 0.0), total.get("CPU", 0.0), "the Ray cluster")
    shared = campaign.trials[0].trial.resources.shared_base
    if shared is None:
        return paragraph(make_plan(campaign, cluster=cluster))
    plan = make_plan(with_shared_base(campaign, None), cluster=cluster)  # the trials as separate ones
    pool = plan_shared(plan, shared.slots, device_kind(None))
    pools = "one pool" if pool.pools == 1 else f"{pool.pools} pools (one per base model, {shared.slots} slots each)"
    return (f"plan: {len(plan.trials)} trials on a shared base ({shared.slots} slots): {pools} of {pool.gpus:g} "
            f"GPU(s), about {pool.gpu_hours:.1f} GPU-hours, makespan about {fmt_hours(pool.makespan_h)} (cost model, "
            f"lock-step; `plan` for both sides). Separate instead: " + paragraph(plan).removeprefix("plan: "))

