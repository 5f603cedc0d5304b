"""Report sections added after the mechanistic diagnostic: the effective batch each condition trained on
(`effective_batch`), each task of a mix or source of a dataset (`per_task`), the paired design (common random
numbers) with each condition's distance from the baseline per step (`trajectories`), surprisal vs entropy
(`decomposition`), what staleness did to the batch (`staleness`, async arms), and for sweeps and agentic campaigns the metric against the swept value (`sweeps`).

`extra_sections` computes their tables, writes their CSVs and figures and returns the markdown lines; `build`
calls it once and passes the lines to `render.markdown.render`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from orchestrator.report.claims.primary import PrimaryTrend
from orchestrator.report.load import Group
from orchestrator.report.sections import (
    decomposition,
    effective_batch,
    per_task,
    staleness,
    sweeps,
    trajectories,
)

TRAIN_METRIC = "train/correct_rate"


def extra_sections(groups: Sequence[Group], base: Group | None, metric: str, out_dir: Path,
                   figures: bool = True, *, step: int | None = None,
                   interpolate: bool = False,
                   primary_trend: PrimaryTrend | None = None) -> tuple[dict[str, pd.DataFrame], list[str],
                                                                              list[Path]]:
    """(tables by CSV stem, markdown lines, PNGs written). `step`: the report's step k (the sweeps' "final");
    `interpolate`: AUCs bridge a missing interior step; `primary_trend`: the sweep's primary test, if any."""
    metrics = [metric] + ([TRAIN_METRIC] if metric != TRAIN_METRIC else [])
    distance = trajectories.distance_table(groups, base, metrics)
    steps, summary = decomposition.decomposition_tables(groups)
    batch = effective_batch.table(groups)
    tables = {"effective_batch": batch, "trajectory_distance": distance, "decomposition_steps": steps,
              "decomposition": summary, "per_task": per_task.table(groups)}
    if staleness.applies(groups):  # some arm sampled ahead of its learner (rollout.mode async)
        tables["staleness"] = staleness.table(groups)
    if sweeps.applies(groups):
        tables["sweeps"] = sweeps.sweep_table(groups, metric, step, interpolate)
        tables["sweep_trend"], tables["sweep_deltas"] = sweeps.trend_tables(groups, metric, step, interpolate,
                                                                                   primary_trend)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_csv(out_dir / f"{name}.csv", index=False)
    written: list[Path] = []
    if figures:
        for path in (effective_batch.figure(groups, out_dir / "informative_groups.png"),
                     trajectories.figure(distance, out_dir / "trajectory_distance.png", metrics),
                     decomposition.figure(steps, out_dir / "decomposition.png"),
                     sweeps.figure(tables["sweeps"], out_dir / "sweeps.png", metric) if "sweeps" in tables else None):
            if path is not None:
                written.append(path)
    md = (effective_batch.markdown(batch) + per_task.markdown(tables["per_task"])
          + trajectories.markdown(distance, groups, base, metrics)
          + decomposition.markdown(summary) + staleness.markdown(tables.get("staleness", pd.DataFrame())))
    if "sweeps" in tables:
        md += sweeps.markdown(tables["sweeps"], tables["sweep_trend"], tables["sweep_deltas"], metric)
    if written:
        md += ["", *[f"![{p.stem}]({p.name})" for p in written]]
    md += ["", "Tables: " + ", ".join(f"`{t}.csv`" for t in tables) + "."]
    return tables, md, written
