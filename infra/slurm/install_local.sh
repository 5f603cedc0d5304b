#!/usr/bin/env bash
# Debian's SLURM daemons, clients and munge for the single-node test (make test-slurm); nothing when already
# installed. Their services are not started (policy-rc.d): the test starts its own, with its own config.
set -euo pipefail
slurm_missing=""
for bin in slurmctld slurmd sbatch munged; do command -v "$bin" >/dev/null || slurm_missing=1; done
if [ -n "$slurm_missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  policy=/usr/sbin/policy-rc.d
  made_policy=""
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1; fi
  { DEBIAN_FRONTEND=noninteractive apt-get -qq update \
      && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends \
           slurmctld slurmd slurm-client munge; } >/tmp/ci-slurm-install.log 2>&1 \
    || { echo "SLURM did not install: /tmp/ci-slurm-install.log" >&2; exit 1; }
  if [ -n "$made_policy" ]; then rm -f "$policy"; fi
fi
