#!/usr/bin/env bash
# slurm-cluster-stop.sh - cancel remaining jobs, then stop the slurmd, slurmctld and munged that
# slurm-cluster-start.sh started, using only the PIDs it recorded in
# $SLURM_TEST_DIR/{slurmd,slurmctld,munged}.pid.  Idempotent: nothing recorded, nothing stopped.
set -euo pipefail
RUN=${SLURM_TEST_DIR:-${TMPDIR:-/tmp}/flotilla-slurm}
TIMEOUT=${SLURM_TEST_TIMEOUT:-30}

mine() { # mine NAME: prints the recorded PID if it is a live process called NAME
  local f=$RUN/$1.pid
  [[ -s $f && $(cat "/proc/$(<"$f")/comm" 2>/dev/null) == "$1" ]] && cat "$f"
}

# Cancel jobs first so that no slurmstepd/job processes outlive slurmd.
if mine slurmctld >/dev/null && [[ -n $(squeue -h -o %A 2>/dev/null) ]]; then
  echo "slurm-cluster-stop: cancelling remaining jobs: $(squeue -h -o %A | sort -u | tr '\n' ' ')"
  squeue -h -o %A | sort -u | xargs -r scancel || true
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    [[ -z $(squeue -h -t running,completing,configuring -o %A 2>/dev/null) ]] && break; sleep 0.5
  done
fi

rc=0
for d in slurmd slurmctld munged; do
  if ! pid=$(mine $d); then
    echo "slurm-cluster-stop: $d: no live process recorded in $RUN/$d.pid; nothing to stop"; rm -f "$RUN/$d.pid"; continue
  fi
  kill -TERM "$pid"
  for ((i = 0; i < TIMEOUT * 2; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "slurm-cluster-stop: $d (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true; rc=1
  fi
  echo "slurm-cluster-stop: $d (pid $pid) stopped"; rm -f "$RUN/$d.pid"
done
exit $rc
