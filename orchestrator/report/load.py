"""Reading a campaign directory: the trials as runs (`Run`) grouped by condition and sweep values (`Group`),
their metrics.jsonl columns, the npz token samples of SEPA conditions, and the trials missing or short
(`TrialIssue`).

Layout read (see `load` and `load_tokens`):
    <campaign_dir>/campaign.json
    <campaign_dir>/trials/<trial>/metrics.jsonl
    <campaign_dir>/trials/<trial>/uncertainty/step_<k>.npz    (optional; SEPA conditions)

`campaign_dir` is a local path or a URI of any filesystem pyarrow opens (`s3://`, `gs://`, `hdfs://`,
`abfs://`, `file://`, ...): files are read through `pyarrow.fs` directly, without a local copy.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from orchestrator import storage as store
from orchestrator.campaign.sections import planned_steps


def _filesystem_from_uri(uri: str):
    """`(pyarrow filesystem, path)` for a URI (a seam for tests: an in-memory filesystem)."""
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(uri)


class CampaignFiles:
    """Read-only access to a campaign directory given as a local path or a pyarrow-readable URI."""

    def __init__(self, location: str | Path):
        self.location = str(location).rstrip("/") if "://" in str(location) else str(location)
        self.fs, self.root = (_filesystem_from_uri(self.location) if "://" in self.location
                              else (None, self.location))

    def __str__(self) -> str:
        return self.location

    def _path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def _kind(self, rel: str):
        if self.fs is None:
            p = Path(self._path(rel))
            return "dir" if p.is_dir() else "file" if p.is_file() else None
        import pyarrow.fs

        t = self.fs.get_file_info(self._path(rel)).type
        return {pyarrow.fs.FileType.Directory: "dir", pyarrow.fs.FileType.File: "file"}.get(t)

    def is_dir(self, rel: str) -> bool:
        return self._kind(rel) == "dir"

    def is_file(self, rel: str) -> bool:
        return self._kind(rel) == "file"

    def read_bytes(self, rel: str) -> bytes:
        if self.fs is None:
            return Path(self._path(rel)).read_bytes()
        with self.fs.open_input_stream(self._path(rel)) as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def files(self, rel_dir: str, prefix: str, suffix: str) -> list[str]:
        """Names of the files directly in `rel_dir` matching `prefix*suffix`, sorted."""
        if self.fs is None:
            d = Path(self._path(rel_dir))
            names = [p.name for p in d.iterdir() if p.is_file()] if d.is_dir() else []
        else:
            import pyarrow.fs

            infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self._path(rel_dir), allow_not_found=True))
            names = [i.base_name for i in infos if i.type == pyarrow.fs.FileType.File]
        return sorted(n for n in names if n.startswith(prefix) and n.endswith(suffix))


def _files(campaign_dir: str | Path | CampaignFiles) -> CampaignFiles:
    return campaign_dir if isinstance(campaign_dir, CampaignFiles) else CampaignFiles(campaign_dir)


class TrialIssue(NamedTuple):
    """A trial that is missing (not started, no metrics) or short (fewer rows than its planned steps)."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


@dataclass
class Run:
    name: str
    condition: str
    seed: int
    sweep: dict[str, Any]
    config: dict[str, Any]
    group: str = ""
    data: dict[str, np.ndarray] | None = None  # column -> float array over the rows (sorted by "step")
    isolation: dict[str, Any] | None = None  # a pool trial's isolation probe (trials/<t>/isolation.json)
    _cache: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def started(self) -> bool:
        return self.data is not None and self.data["step"].size > 0

    @property
    def n_rows(self) -> int:
        return int(self.data["step"].size) if self.data is not None else 0

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the rows where `key` is present and finite."""
        if not self.started or key not in self.data:
            return np.zeros(0), np.zeros(0)
        if key not in self._cache:
            col = self.data[key]
            ok = np.isfinite(col)
            self._cache[key] = (self.data["step"][ok], col[ok])
        return self._cache[key]

    def value_at(self, key: str, step: int) -> float:
        s, v = self.series(key)
        hit = np.flatnonzero(s == step)
        return float(v[hit[-1]]) if hit.size else math.nan

    @property
    def last_step(self) -> int | None:
        return int(self.data["step"][-1]) if self.started else None

    def planned_steps(self, key: str) -> np.ndarray | None:
        """The steps the trial's config logs `key` at (`campaign.sections.planned_steps`)."""
        return planned_steps(self.config, key)

    @property
    def generations_per_step(self) -> float:
        try:
            r = self.config["rollout"]
            return float(r["prompts_per_step"]) * float(r["n"])
        except (KeyError, TypeError, ValueError):
            return math.nan


@dataclass
class Group:
    label: str
    condition: str
    sweep: dict[str, Any]
    uses_sepa: bool
    runs: list[Run] = field(default_factory=list)

    @property
    def sweep_text(self) -> str:
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in self.sweep.items())


def _short_key(key: str) -> str:
    return ".".join(key.split(".")[-2:])


def fmt_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _uses_sepa(config: dict[str, Any]) -> bool:
    mode = (config.get("credit") or {}).get("transform_mode", "none")
    if isinstance(mode, str):
        return "sepa" in mode
    return any("sepa" in str(stage) for stage in (mode or []))


def _as_float(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


def _read_metrics(path: Path) -> tuple[dict[str, np.ndarray] | None, int]:
    """`_parse_metrics` of a local file."""
    return _parse_metrics(Path(path).read_text())


def _parse_metrics(text: str) -> tuple[dict[str, np.ndarray] | None, int]:
    """Numeric columns of a metrics.jsonl (rows sorted by step, the last row wins on a repeated step; NaN
    where a row lacks the key or holds a non-number) and the count of lines that could not be parsed (e.g. a
    partly written last line of a running trial)."""
    rows: dict[int, dict] = {}
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            rows[int(row["step"])] = row
        else:
            bad += 1
    if not rows:
        return None, bad
    steps = sorted(rows)
    keys = {k for row in rows.values() for k in row}
    data = {k: np.array([_as_float(rows[s].get(k)) for s in steps]) for k in keys}
    data["step"] = np.array(steps, dtype=float)
    return data, bad


def load(campaign_dir: str | Path | CampaignFiles) -> tuple[dict[str, Any], list[Group], list[TrialIssue]]:
    files = _files(campaign_dir)
    meta = json.loads(files.read_text(store.CAMPAIGN_FILE))
    trials = meta.get("trials") or []
    any_sweep = any(t.get("sweep") for t in trials)
    groups: dict[tuple, Group] = {}
    issues: list[TrialIssue] = []
    for t in trials:
        cond, sweep = str(t["condition"]), dict(t.get("sweep") or {})
        config = dict(t.get("config") or {})
        key = (cond, tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in sweep.items())))
        if key not in groups:
            label = cond
            if any_sweep and sweep:
                # the last two key segments keep labels short (the full paths are in the `sweep` column)
                label = f"{cond} [{', '.join(f'{_short_key(k)}={fmt_value(v)}' for k, v in sweep.items())}]"
            groups[key] = Group(label, cond, sweep, _uses_sepa(config))
        run = Run(str(t["name"]), cond, int(t.get("seed", 0)), sweep, config, groups[key].label)
        groups[key].runs.append(run)
        tdir = f"trials/{run.name}"
        planned = config.get("steps")
        if not files.is_dir(tdir):
            issues.append(TrialIssue(run.name, "not started (no trial directory)"))
            continue
        mpath = f"{tdir}/{store.METRICS_FILE}"
        if not files.is_file(mpath):
            issues.append(TrialIssue(run.name, "no metrics.jsonl"))
            continue
        run.data, bad = _parse_metrics(files.read_text(mpath))
        if files.is_file(ipath := f"{tdir}/{store.ISOLATION_FILE}"):
            run.isolation = json.loads(files.read_text(ipath))
        note = f"; {bad} unreadable line(s) skipped" if bad else ""
        if run.data is None:
            issues.append(TrialIssue(run.name, f"metrics.jsonl has no rows{note}"))
        elif isinstance(planned, int) and run.n_rows < planned:
            issues.append(TrialIssue(run.name, f"short: {run.n_rows} of {planned} planned steps "
                                               f"(last step {run.last_step}){note}"))
        elif bad:
            issues.append(TrialIssue(run.name, f"{bad} unreadable line(s) skipped"))
    return meta, list(groups.values()), issues


def load_tokens(campaign_dir: str | Path | CampaignFiles,
                 group: Group) -> tuple[dict[str, np.ndarray], int, list[str]]:
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("exec_before", "exec_after", "plan_before", "plan_after")}
    n_files, problems = 0, []
    files = _files(campaign_dir)
    for r in group.runs:
        udir = f"trials/{r.name}/uncertainty"
        for name in files.files(udir, "step_", ".npz"):
            try:
                with np.load(io.BytesIO(files.read_bytes(f"{udir}/{name}")), allow_pickle=False) as z:
                    arrays = {k: np.asarray(z[k], dtype=float).ravel() for k in parts if k in z.files}
            except Exception as exc:  # a file being written, or corrupt: skip it, say so
                problems.append(f"{r.name}/{name}: unreadable ({type(exc).__name__})")
                continue
            n_files += 1
            for k, a in arrays.items():
                parts[k].append(a[np.isfinite(a)])
    return ({k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}, n_files, problems)
