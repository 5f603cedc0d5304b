"""Reading what the models wrote: the trials' samples files (orchestrator/trial/samples.py) as text.

`python -m orchestrator samples` prints them (`show`), and with a problem (by default the first held-out
problem) the same problem's completions across conditions and seeds at one step (`compare`): every condition
sees the same held-out problems at every evaluation, so the texts are paired like the metrics. The report's
"examples" section (`markdown`) is one held-out problem per condition at the last evaluation step every trial
wrote. Planning spans are marked `[[...]]`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from orchestrator import storage as store
from orchestrator.report.load import CampaignFiles

OPEN, CLOSE = "[[", "]]"
_FILE = re.compile(r"^(eval_)?step_(\d+)\.jsonl\.gz$")


class SamplesError(ValueError):
    """A request the samples on disk cannot answer (unknown trial, step, problem); the message says what exists."""


@dataclass(frozen=True)
class Trial:
    name: str
    condition: str
    seed: int


Where = str | CampaignFiles  # a campaign directory: a path, a URI, or the report's reader of one


def _reader(campaign: Where) -> CampaignFiles:
    return campaign if isinstance(campaign, CampaignFiles) else CampaignFiles(campaign)


def _samples_dir(trial: str) -> str:
    return f"{store.TRIALS_DIR}/{trial}/{store.SAMPLES_DIR}"


def campaign_trials(campaign: Where) -> list[Trial]:
    """The campaign's trials in table order (campaign.json)."""
    meta = json.loads(_reader(campaign).read_text(store.CAMPAIGN_FILE))
    return [Trial(str(t["name"]), str(t["condition"]), int(t.get("seed", 0))) for t in meta.get("trials") or []]


def steps_with_samples(campaign: Where, trial: str, split: str) -> list[int]:
    """Steps whose samples file of `split` ("train" or "eval") the trial wrote, ascending."""
    found = (_FILE.match(n) for n in _reader(campaign).files(_samples_dir(trial), "", ".jsonl.gz"))
    return sorted(int(m.group(2)) for m in found if m and bool(m.group(1)) == (split == "eval"))


def read_rows(campaign: Where, trial: str, step: int, split: str) -> list[dict]:
    files, rel = _reader(campaign), f"{_samples_dir(trial)}/{store.samples_file(step, split)}"
    return store.parse_gzip_jsonl(files.read_bytes(rel)) if files.is_file(rel) else []


def mark(text: str, spans: list[list[int]]) -> str:
    """`text` with each planning span wrapped in `[[` `]]` (overlapping spans merged)."""
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out, pos = [], 0
    for s, e in merged:
        out += [text[pos:s], OPEN, text[s:e], CLOSE]
        pos = e
    return "".join(out + [text[pos:]])


def _num(v) -> str:
    return "-" if v is None else f"{v:+.3f}"


def describe(row: dict) -> str:
    """One completion: its scores on a header line, then its text (planning spans marked), indented."""
    flags = " truncated" if row["truncated"] else ""
    head = (f"  [{row['sample']}] reward {row['reward']:g} {'correct' if row['correct'] else 'wrong'} "
            f"adv {_num(row['episode_advantage'])} (token mean {_num(row['token_advantage'])}) "
            f"{row['length']} tokens{flags}")
    body = mark(row["completion"], row["planning_spans"])
    return head + "\n" + "\n".join("      " + ln for ln in body.splitlines() or [""])


def _groups(rows: list[dict]) -> dict[tuple[int, str], list[dict]]:
    out: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["group"], r["problem"]), []).append(r)
    return out


def show(campaign: Where, trial: str, step: int | None, split: str) -> str:
    """Every group of one trial's samples file at `step` (default: its last)."""
    step = pick_step([trial], {trial: steps_with_samples(campaign, trial, split)}, step, split)
    rows = read_rows(campaign, trial, step, split)
    lines = [f"{trial} step {step} ({split}, adapter version {rows[0]['adapter_version']})"]
    for (_, problem), grp in _groups(rows).items():
        lines += ["", f"problem {problem}: {grp[0]['prompt']}"]
        lines += [describe(r) for r in grp]
    return "\n".join(lines)


def pick_step(names: list[str], steps: dict[str, list[int]], step: int | None, split: str) -> int:
    """`step`, or the last step every trial in `names` wrote; SamplesError naming the steps that exist."""
    common = sorted(set.intersection(*(set(steps[n]) for n in names))) if names else []
    if step is None:
        if not common:
            raise SamplesError(f"no step has {split} samples in every trial of {', '.join(names)}")
        return common[-1]
    if step not in common:
        have = ", ".join(map(str, common)) or "none"
        raise SamplesError(f"--step {step}: no {split} samples there in every trial; steps with them: {have}")
    return step


def compare(campaign: Where, trials: list[Trial], step: int | None, problem: str | None, split: str) -> str:
    """One problem's completions across conditions and seeds at one step (default: the last common step; the
    first problem of the file when `problem` is None)."""
    steps = {t.name: steps_with_samples(campaign, t.name, split) for t in trials}
    step = pick_step([t.name for t in trials], steps, step, split)
    rows = {t.name: read_rows(campaign, t.name, step, split) for t in trials}
    first = next(iter(rows.values()))
    problem = problem if problem is not None else first[0]["problem"]
    if not any(r["problem"] == problem for r in first):
        known = list(dict.fromkeys(r["problem"] for r in first))
        raise SamplesError(f"--problem {problem}: not in the {split} samples of step {step}; problems there: "
                           + ", ".join(known[:10]) + (" ..." if len(known) > 10 else ""))
    prompt = next(r["prompt"] for r in first if r["problem"] == problem)
    lines = [f"problem {problem} at step {step} ({split}): {prompt}"]
    for cond in dict.fromkeys(t.condition for t in trials):
        lines += ["", f"== {cond}"]
        for t in (t for t in trials if t.condition == cond):
            mine = [r for r in rows[t.name] if r["problem"] == problem]
            correct = sum(r["correct"] for r in mine)
            lines.append(f"-- {t.name} (seed {t.seed}): {correct}/{len(mine)} correct")
            lines += [describe(r) for r in mine] if mine else ["  (problem not in this trial's samples)"]
    return "\n".join(lines)


def markdown(campaign: Where, trials: list[Trial]) -> list[str]:
    """The report's "examples" section: the first held-out problem at the last evaluation step every trial
    wrote, one trial (the first seed) per condition, its first completion; [] when no trial wrote eval samples."""
    firsts = list({t.condition: t for t in reversed(trials)}.values())[::-1]
    steps = {t.name: steps_with_samples(campaign, t.name, "eval") for t in firsts}
    try:
        step = pick_step([t.name for t in firsts], steps, None, "eval")
    except SamplesError:
        return []
    lines = ["", "## Examples", "",
             f"One held-out problem at step {step} (the last evaluation the trials shown all wrote), the first completion of "
             f"one seed per condition; planning spans in {OPEN}{CLOSE}. All of them: `python -m orchestrator "
             "samples <campaign> --eval`.", ""]
    rows = {t.name: read_rows(campaign, t.name, step, "eval") for t in firsts}
    problem = next(iter(rows.values()))[0]
    lines += [f"Problem `{problem['problem']}`:", "", "```", problem["prompt"], "```"]
    for t in firsts:
        mine = [r for r in rows[t.name] if r["problem"] == problem["problem"]]
        if not mine:
            continue
        correct = sum(r["correct"] for r in mine)
        lines += ["", f"**{t.condition}** ({t.name}, {correct}/{len(mine)} correct; reward {mine[0]['reward']:g}):",
                  "", "```", mark(mine[0]["completion"], mine[0]["planning_spans"]), "```"]
    return lines
