"""workers/startup.py: a process that imports the packages collects rarely until it says its imports are done,
then freezes them and collects at the thresholds it had before."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_fresh_process_collects_rarely_while_importing_then_restores_its_thresholds():
    code = ("import gc\nbefore = gc.get_threshold()\nimport orchestrator.config.trial\n"
            "during = gc.get_threshold()\nfrom orchestrator import imports_done\nimports_done()\n"
            "after = gc.get_threshold()\nimports_done()\n"
            "print(before, during, after, gc.get_threshold(), gc.get_freeze_count() > 1000)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    assert out == "(700, 10, 10) (100000, 50, 100) (700, 10, 10) (700, 10, 10) True", out


def test_frozen_imports_are_freed_at_exit_without_leak_reports():
    """Left frozen at exit, extension modules that count their objects at shutdown (triton's nanobind bindings,
    imported with torch) print "leaked ..." lines after a script's last line; imports_done hands them back."""
    pytest.importorskip("triton")
    code = "import triton\nfrom orchestrator import imports_done\nimports_done()\nprint('last line')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "last line" and "leaked" not in proc.stderr, proc.stderr[-500:]
