"""infra/slurm/campaign.sbatch offline: valid bash, requeue on preemption with a signal ahead of the time limit,
Ray started across the allocation by `ray symmetric-run` (a command the installed Ray has), the campaign run on
the head and connected to that Ray. The script runs for real on a single-node SLURM in
tests/integration/campaign/test_slurm.py (docs/deploy.md, section D)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "infra" / "slurm" / "campaign.sbatch"


def test_the_sbatch_script_parses_and_requeues_on_a_signal():
    text = SCRIPT.read_text()
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    assert "requeue" in directives and re.fullmatch(r"B:USR1@\d+", directives["signal"])
    assert directives["ntasks-per-node"] == "1"  # one symmetric-run per node
    assert "trap requeue USR1" in text and 'scontrol requeue "${SLURM_JOB_ID}"' in text
    assert re.search(r"ray symmetric-run --address \S+ --min-nodes", text)
    assert 'RAY_ADDRESS="$1" exec python -m orchestrator run "$2"' in text  # without it: a private local Ray


def test_symmetric_run_exists_in_the_installed_ray():
    ray = Path(sys.executable).parent / "ray"
    out = subprocess.run([str(ray), "symmetric-run", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--min-nodes" in out.stdout
