"""workers/startup.py: a process that imports the packages collects rarely until it says its imports are done,
then freezes them and collects at the thresholds it had before."""

from __future__ import annotations

import subprocess
import sys


def test_a_fresh_process_collects_rarely_while_importing_then_restores_its_thresholds():
    code = ("import gc\nbefore = gc.get_threshold()\nimport orchestrator.config.trial\n"
            "during = gc.get_threshold()\nfrom orchestrator import imports_done\nimports_done()\n"
            "after = gc.get_threshold()\nimports_done()\n"
            "print(before, during, after, gc.get_threshold(), gc.get_freeze_count() > 1000)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    assert out == "(700, 10, 10) (100000, 50, 100) (700, 10, 10) (700, 10, 10) True", out

