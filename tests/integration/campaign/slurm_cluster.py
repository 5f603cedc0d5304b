"""A single-node SLURM for tests: munge with a generated key, slurmctld and slurmd from Debian's packages (what
`.ci/run` installs), a generated slurm.conf, private state dirs and ports, all in a private PID namespace with its
own /proc (so `ray stop` and Ray's "already started" check, run by `ray symmetric-run` in the job, see only the
job's processes, never another test's Ray). The host network is shared: getaddrinfo(AI_ADDRCONFIG), which SLURM
uses to listen, finds no address in a network namespace that has only loopback.

The node advertises 4 CPUs (`SlurmdParameters=config_overrides`: more than the 2 cores of a CI runner, like the
tests' local Ray) and 2 GPUs on placeholder files (gres/gpu drops a GPU without a file; slurmd logs that they are no
devices and counts them): the allocation's GPU variables are set, nothing uses a GPU.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare")
UP = r"""
set -e
munged --key-file "$D/munge.key" --socket "$D/munge.sock" --pid-file "$D/munged.pid" --log-file "$D/munged.log" \
  --seed-file "$D/munge.seed" --force
slurmctld -D -f "$SLURM_CONF" > "$D/slurmctld.out" 2>&1 &
slurmd -D -f "$SLURM_CONF" > "$D/slurmd.out" 2>&1 &
echo up > "$D/up"
wait
"""


def available() -> str | None:
    """Why a local SLURM cannot start here, or None."""
    missing = [d for d in BINARIES if shutil.which(d) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (.ci/run installs slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "a private PID namespace and SlurmUser=root need root"
    return None


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _conf(d: Path, host: str, ctld: int, slurmd: int) -> str:
    return f"""ClusterName=citest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """Start with `Slurm.start()`, run clients with `.run([...])` (SLURM_CONF set), stop with `.stop()`."""

    def __init__(self, directory: Path, proc: subprocess.Popen):
        self.dir, self.proc = directory, proc
        self.env = {**os.environ, "SLURM_CONF": str(directory / "slurm.conf")}

    @classmethod
    def start(cls, timeout_s: float = 60) -> Slurm:
        d = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # short: Ray's socket paths in the job stay short
        d.chmod(0o755)  # munged wants its socket's directory searchable
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        (d / "munge.key").write_bytes(os.urandom(1024))
        (d / "munge.key").chmod(0o400)
        host = socket.gethostname()
        (d / "slurm.conf").write_text(_conf(d, host, *free_ports(2)))
        for i in range(2):  # stand-ins for /dev/nvidia*
            (d / f"gpu{i}").touch()
        (d / "gres.conf").write_text(f"NodeName={host} Name=gpu File={d}/gpu[0-1]\n")
        env = {**os.environ, "D": str(d), "SLURM_CONF": str(d / "slurm.conf")}
        with open(d / "up.out", "w") as log:
            proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", UP], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        cluster = cls(d, proc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = cluster.run(["sinfo", "-h", "-o", "%T"], check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return cluster
            time.sleep(0.5)
        log = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"SLURM did not come up in {timeout_s:.0f} s (node state {state!r}):\n{log}")

    def run(self, args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("env", self.env)
        return subprocess.run(args, check=check, capture_output=True, text=True, timeout=60, **kwargs)

    def logs(self, tail: int = 40) -> str:
        out = []
        for name in ("up.out", "slurmctld.log", "slurmd.log", "munged.log", *sorted(
                p.name for p in self.dir.glob("*.out") if p.name != "up.out")):  # the jobs' logs
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-tail:]))
        return "\n".join(out)

    def _namespace_pids(self) -> list[int]:
        """Every process in the cluster's PID namespace (the one `unshare` made for it), seen from outside."""
        try:
            init = int((Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")).read_text().split()[0])
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except (FileNotFoundError, IndexError, ValueError, ProcessLookupError):
            return []
        pids = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if os.readlink(p / "ns" / "pid") == ns:
                        pids.append(int(p.name))
                except OSError:
                    pass
        return pids

    def stop(self) -> None:
        """Cancel the jobs, then SIGKILL every process of the namespace (slurmstepd, Ray, the daemons)."""
        self.run(["scancel", "--full", "--user=root"], check=False)
        for pid in self._namespace_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
