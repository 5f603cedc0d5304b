"""Campaign reports: the report builder (`build`), which reads a campaign (`load`), computes its tables
(`tables`), decides what it claims (`claims/`), adds its later sections (`sections/`) and renders it as text and
figures (`render/`); `publish` logs it to W&B, the `samples` command (cli/results.py) reads `sections/examples.py`."""

from orchestrator.report.build import Report, ReportOptions, TrialIssue, build_report

__all__ = ["Report", "ReportOptions", "TrialIssue", "build_report"]
