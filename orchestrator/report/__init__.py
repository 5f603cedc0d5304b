"""Campaign reports: the report builder (`build`), which reads a campaign (`load`), computes its tables
(`tables`) and renders them as text (`render`), with statistics (`stats`) and figures (`figures`)."""

from orchestrator.report.build import Report, ReportOptions, TrialIssue, build_report

__all__ = ["Report", "ReportOptions", "TrialIssue", "build_report"]
