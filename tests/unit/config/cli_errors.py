"""Run `python -m orchestrator trial` on a bad trial file, as a user would, and read its error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def trial_error(tmp_path: Path, text: str) -> tuple[Path, list[str]]:
    """Write `text` as a trial file, run the real CLI on it; it must exit 2. Returns (the file, stderr's lines)."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "trial", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    return path, proc.stderr.strip().splitlines()
