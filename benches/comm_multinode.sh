#!/usr/bin/env bash
# comm_multinode.sh - `flotilla bench comm` (CPU backend, all_reduce) between 2 ranks on one
# node and between 2 ranks on two nodes of the namespaced test cluster
# (scripts/slurm-cluster-start.sh with SLURM_TEST_NODES=2), each rank one srun task
# (`--ranks-from-env`). Run as root from the repository, after
#   cargo build --release -p flotilla -p flotilla-train
# Prints both tables; starts the cluster if needed and stops it when it started it.
# Env: FLOTILLA (default target/release/flotilla), SIZES (default 4K,64K,1M,16M,64M), ITERS (20).
set -euo pipefail
cd "$(dirname "$0")/.."
FLOTILLA=${FLOTILLA:-target/release/flotilla}
SIZES=${SIZES:-4K,64K,1M,16M,64M}
ITERS=${ITERS:-20}
[[ -x $FLOTILLA ]] || { echo "comm_multinode.sh: $FLOTILLA is not built (cargo build --release -p flotilla -p flotilla-train)" >&2; exit 1; }
started=0
if [[ $(cat "${SLURM_TEST_DIR:-${TMPDIR:-/tmp}/flotilla-slurm}/nodes" 2>/dev/null) != 2 ]] || ! scontrol ping 2>/dev/null | grep -q "is UP"; then
  SLURM_TEST_NODES=2 bash scripts/slurm-cluster-start.sh
  started=1
fi
link_bytes() { # bytes received + sent by the host side of node 2's veth pair
  echo $(( $(</sys/class/net/flt-v2/statistics/rx_bytes) + $(</sys/class/net/flt-v2/statistics/tx_bytes) ))
}
bench() { # bench NODES TASKS_PER_NODE
  echo "\$ srun -N$1 --ntasks-per-node=$2 --cpus-per-task=1 ${*:3} $FLOTILLA bench comm --ranks-from-env --sizes $SIZES --iters $ITERS"
  local before rc=0
  before=$(link_bytes)
  srun -N"$1" --ntasks-per-node="$2" --cpus-per-task=1 --kill-on-bad-exit=1 "${@:3}" \
    bash -c 'echo "  rank $SLURM_PROCID on $(hostname) ($(hostname -I | tr -d " \n"))" >&2; exec "$@"' rank \
    "$FLOTILLA" bench comm --ranks-from-env --sizes "$SIZES" --iters "$ITERS" || rc=$?
  echo "  node 2's link (flt-v2) carried $(( ($(link_bytes) - before) / 1000000 )) MB"
  return "$rc"
}
status=0
# One node: node 2 (its two ranks talk over the node's own loopback); two nodes: across the bridge.
bench 1 2 -w fltnode2 || status=$?
bench 2 1 || status=$?
((started)) && bash scripts/slurm-cluster-stop.sh >/dev/null
exit "$status"
