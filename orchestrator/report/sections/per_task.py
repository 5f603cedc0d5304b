"""The report's per-task section: how each member of a mixed task (and each labelled source of a dataset) did.

A mixed task (`task: {mix: [...]}`) logs each member's `train/<label>/correct_rate`, `eval/<label>/pass@1` and,
for a multi-turn member, `env/<label>/success` beside the totals; a dataset task logs its sources the same way.
Per group and label the table gives, over seeds, the mean of each run's mean over the steps that logged the
measure, and of each run's last logged value: where a total hides one task improving while another falls.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from orchestrator.report.load import Group

KEY = re.compile(r"^(train|eval|env)/([^/]+)/(correct_rate|pass@1|success)$")
COLUMNS = ["group", "condition", "task", "measure", "n_seeds", "mean", "last"]


def table(groups: Sequence[Group]) -> pd.DataFrame:
    """One row per group, label and measure any run logged (measure: the total's name, e.g. eval/pass@1)."""
    rows = []
    for g in groups:
        keys = sorted({k for r in g.runs if r.started for k in r.data if KEY.match(k)},
                      key=lambda k: (KEY.match(k)[2], k))
        for key in keys:
            family, label, metric = KEY.match(key).groups()
            series = [r.series(key)[1] for r in g.runs if r.started and r.series(key)[1].size]
            if not series:
                continue
            rows.append({"group": g.label, "condition": g.condition, "task": label, "measure": f"{family}/{metric}",
                         "n_seeds": len(series), "mean": float(np.mean([v.mean() for v in series])),
                         "last": float(np.mean([v[-1] for v in series]))})
    return pd.DataFrame(rows, columns=COLUMNS)


def markdown(df: pd.DataFrame) -> list[str]:
    if not len(df):
        return []
    md = ["", "## Per task", "",
          "Each task of a mix (`task.mix[i].label`) or source of a dataset (`data_source`): the mean over seeds of "
          "each run's mean over the steps that logged the measure, and of its last value.", "",
          "| group | task | measure | seeds | mean | last |", "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        md.append(f"| {r.group} | {r.task} | {r.measure} | {r.n_seeds} | {r['mean']:.3f} | {r['last']:.3f} |")
    return md
