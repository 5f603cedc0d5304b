"""The data a rollout source hands on: a step's groups of samples (`Rollouts`), a held-out evaluation (`HeldOut`)
and its generations (`SampleGroup`). Plain dataclasses of lists, no behaviour beyond selecting and concatenating
groups: the step (orchestrator/trial/step/), the artifacts (orchestrator/trial/artifacts/) and the sources all
read them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SampleGroup:
    """One prompt's (or level's) G completions as token ids, with their scores. `loss_mask[g]`: True on the
    sampled ids (None: the whole response was sampled, the single-turn case)."""

    problem: str
    prompt: str
    response_ids: list[list[int]]
    rewards: list[float]
    correct: list[bool]
    truncated: list[bool]
    loss_mask: list[list[bool]] | None = None


def group_info(problem: str, prompt: str, truncated: list[bool]) -> dict:
    """A rollout source's per-group metadata (`Rollouts.groups_info`): what the ids do not say."""
    return {"problem": problem, "prompt": prompt, "truncated": list(truncated)}


@dataclass
class Rollouts:
    """One step's samples in groups (group i shares a prompt or a level). Lists are `[N][G][*]` / `[N][G]`;
    response ids, loss mask and log-probs are aligned (single-turn: the completion, all in the loss mask).

    Every list field of length N is per group (`select` / `concat` carry it without naming it); an empty list
    means "not recorded". `truncated` / `lengths` ([N][G]): the sample hit its length limit (single-turn: the
    completion stopped at rollout.max_tokens; multi-turn: a turn did, or the episode ran out of context) and
    the length rollout.overlong measures against max_tokens. `train` ([N]): the refill's choice of the groups
    the learner trains on (orchestrator/trial/collect/fill.py); empty: every usable group. `policy_versions`
    ([N] of [oldest, newest]): the policy versions that sampled each group's tokens, stamped by the step
    (orchestrator/trial/step/staleness.py)."""

    prompt_ids: list[list[list[int]]]
    response_ids: list[list[list[int]]]
    loss_mask: list[list[list[bool]]]
    logprobs: list[list[list[float]]]
    rewards: list[list[float]]
    correct: list[list[bool]]
    num_tokens: int
    versions: set
    metrics: dict
    extra: dict = field(default_factory=dict)  # per-sequence extras for the learner ([N][G][*] lists)
    groups_info: list[dict] = field(default_factory=list)  # [N] per-group metadata (samples.py: group_info)
    truncated: list[list[bool]] = field(default_factory=list)
    lengths: list[list[int]] = field(default_factory=list)
    train: list[bool] = field(default_factory=list)
    policy_versions: list[list[int]] = field(default_factory=list)  # [N] [oldest, newest] (step/staleness.py)

    def __len__(self) -> int:
        return len(self.rewards)

    def _group_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), list) and len(getattr(self, f.name)) == len(self)]

    def select(self, indices: list[int]) -> Rollouts:
        """The groups at `indices`, in that order, with every per-group field and extra; `num_tokens` becomes the
        selected groups' sampled (loss-mask) tokens, `metrics` is kept as is."""
        picked = {name: [getattr(self, name)[i] for i in indices] for name in self._group_fields()}
        extra = {k: [v[i] for i in indices] for k, v in self.extra.items()}
        tokens = sum(sum(m) for i in indices for m in self.loss_mask[i])
        return dataclasses.replace(self, **picked, extra=extra, num_tokens=tokens, metrics=dict(self.metrics))

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """The groups of `parts` one after another (refill rounds): per-group fields and extras concatenated,
        tokens summed, versions united, metrics merged by `merge_metrics`. A per-group field recorded in some
        parts and not in others is an error."""
        if len(parts) == 1:
            return parts[0]
        first, values = parts[0], {}
        for f in dataclasses.fields(first):
            if not isinstance(getattr(first, f.name), list):
                continue
            have = [len(getattr(p, f.name)) == len(p) and len(p) > 0 for p in parts]
            if any(have) and not all(have):
                raise ValueError(f"Rollouts.concat: per-group field {f.name!r} is missing in some parts")
            values[f.name] = [x for p in parts for x in getattr(p, f.name)] if all(have) else []
        keys = set(first.extra)
        if any(set(p.extra) != keys for p in parts):
            raise ValueError("Rollouts.concat: the parts carry different extras")
        return dataclasses.replace(
            first, **values, extra={k: [x for p in parts for x in p.extra[k]] for k in first.extra},
            num_tokens=sum(p.num_tokens for p in parts), versions=set().union(*(p.versions for p in parts)),
            metrics=merge_metrics([p.metrics for p in parts], [len(p) for p in parts]))


@dataclass
class HeldOut:
    """A source's held-out evaluation: its metrics (`eval/pass@1`, `eval/pass@k`, `eval/k`, `eval/problems`,
    `time/eval_s`, ...; empty when the task has no held-out set) and its generations (for the samples files)."""

    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[SampleGroup] = field(default_factory=list)


def merge_metrics(rows: list[dict], weights: list[int]) -> dict:
    """Refill rounds' metrics as one step's: `time/*` and counts (`*_errors`, `*_timeouts`, `*_masked`) summed,
    `*min*` / `*max*` keys by min / max, everything else (rates, means) averaged weighted by groups."""
    out: dict = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        vals = [(r[key], w) for r, w in zip(rows, weights, strict=True) if key in r]
        xs = [v for v, _ in vals]
        if key.startswith("time/") or key.endswith(("_errors", "_timeouts", "_masked")):
            out[key] = sum(xs)
        elif "min" in key.rsplit("/", 1)[-1]:
            out[key] = min(xs)
        elif "max" in key.rsplit("/", 1)[-1]:
            out[key] = max(xs)
        else:
            total = sum(w for _, w in vals)
            out[key] = sum(v * w for v, w in vals) / total if total else xs[0]
    return out
