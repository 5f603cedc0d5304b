"""Campaign reports: statistics (`stats`), figures (`figures`) and the report builder (`build`)."""

from orchestrator.report.build import Report, TrialIssue, build_report

__all__ = ["Report", "TrialIssue", "build_report"]
