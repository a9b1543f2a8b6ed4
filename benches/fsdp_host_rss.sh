#!/usr/bin/env bash
# Benchmark: peak host memory (resident set) per phase of a 4-rank CPU FSDP run, for two builds.
#
# What it measures. Each build's `flotilla run` trains the `small` preset (conf/model/small.yaml)
# under FSDP FULL_SHARD over 4 local ranks on CPU, with full (consolidated) checkpoints: 4 steps
# with an evaluation and a checkpoint every 2 steps and the final model; then a second run that
# resumes from the first run's step-4 checkpoint (`trainer.resume=<checkpoint>`) and trains to
# step 6 (evaluation, checkpoint and final model again). Both builds get exactly the same
# overrides. Every rank logs, with FLOTILLA_LOG=info, one line at its end:
#   peak host RSS by phase: start-up X MiB, resume Y MiB, step Z MiB, evaluation W MiB, ...
# (crates/flotilla-train/src/host_memory.rs: Linux's VmHWM, reset through /proc/self/clear_refs
# when a phase starts and read when it ends; a phase's figure is the process's whole resident set
# at its highest during that phase, libtorch and memory kept by the allocator included, so it
# is never below the resident set the phase started with). Phases a run did not go through are
# left out of its line.
#
# It prints a Markdown table, one row per phase, in MiB: the largest figure over the 4 ranks and
# over both runs (the job and its resume) for each build, and rank 0's own (rank 0 writes the
# checkpoints and the final model); then the same per run.
#
# Usage: benches/fsdp_host_rss.sh BEFORE_DIR AFTER_DIR
#   BEFORE_DIR, AFTER_DIR: directories that each hold a `flotilla` and a `flotilla-train`
#   binary (the training binary is passed through FLOTILLA_TRAIN_BINARY).
# Environment: WORK_DIR (default: a new mktemp -d directory) receives the run directories,
# which are kept (their logs/rank_<R>.log hold every line); CONF_DIR (default: this
# repository's conf/) is the config directory given to both builds. Both builds must carry the
# host-memory instrumentation (older commits need host_memory.rs wired in to print the line).
# Takes about 70 s on 2 cores with debug builds (run it under `nice -n 19` on a shared machine).
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BEFORE_DIR AFTER_DIR (each holding flotilla and flotilla-train)" >&2
    exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
conf=${CONF_DIR:-$repo/conf}
work=${WORK_DIR:-$(mktemp -d -t fsdp-host-rss.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# The job, the same for both builds (max_steps and the run directory are added per run).
overrides=(
    model=small
    trainer/dist=fsdp
    trainer.dist.sharding_strategy=FULL_SHARD
    trainer.dist.state_dict_type=full
    trainer.dist.backend=cpu
    trainer.device=cpu
    compute.tasks_per_node=4
    compute.gpus_per_node=0
    trainer.micro_batch_size=2
    trainer.global_batch_size=8
    trainer.eval_every=2
    trainer.eval_batches=2
    data.num_eval=16
    trainer.checkpoint_every=2
)
first_steps=4
resume_steps=6
phases=(start-up resume step evaluation checkpoint final)

# run LABEL BINDIR RUNDIR EXTRA...: one `flotilla run` of the job into RUNDIR.
run() {
    local label=$1 bin=$2 dir=$3
    shift 3
    for b in flotilla flotilla-train; do
        [ -x "$bin/$b" ] || { echo "$label: $bin/$b is missing" >&2; exit 2; }
    done
    echo "$label: flotilla run ... $* (into $dir)" >&2
    if ! (cd "$work" && FLOTILLA_LOG=info FLOTILLA_TRAIN_BINARY="$bin/flotilla-train" \
        "$bin/flotilla" run --config-dir "$conf" "${overrides[@]}" "$@" \
        flotilla.run.dir="$dir" >"$dir.out" 2>&1); then
        echo "$label: the run failed; the end of $dir.out:" >&2
        tail -20 "$dir.out" >&2
        exit 1
    fi
}

for side in before after; do
    if [ "$side" = before ]; then bin=$(cd "$1" && pwd); else bin=$(cd "$2" && pwd); fi
    rm -rf "$work/$side-train" "$work/$side-resume"
    run "$side" "$bin" "$work/$side-train" trainer.max_steps=$first_steps
    ckpt=$work/$side-train/checkpoints/step_$first_steps
    [ -d "$ckpt" ] || { echo "$side: no checkpoint at $ckpt" >&2; exit 1; }
    run "$side" "$bin" "$work/$side-resume" trainer.max_steps=$resume_steps trainer.resume="$ckpt"
done

# One record per rank and phase: SIDE RUN RANK PHASE MIB, from each rank's last such line.
records=$work/records.tsv
: >"$records"
for side in before after; do
    for run_name in train resume; do
        for log in "$work/$side-$run_name"/logs/rank_*.log; do
            rank=${log##*/rank_}
            rank=${rank%.log}
            line=$(grep 'peak host RSS by phase:' "$log" | tail -1 || true)
            if [ -z "$line" ]; then
                echo "$log has no 'peak host RSS by phase' line (is the build instrumented?)" >&2
                exit 1
            fi
            echo "${line#*peak host RSS by phase: }" | tr ',' '\n' |
                awk -v s="$side" -v r="$run_name" -v k="$rank" \
                    'NF == 3 && $3 == "MiB" { print s "\t" r "\t" k "\t" $1 "\t" $2 }' >>"$records"
        done
    done
done

# table TITLE RUNS: the table over the runs matching the regex RUNS.
table() {
    echo "$1"
    echo
    echo "| phase | before, max over ranks | after, max over ranks | rank 0 before | rank 0 after |"
    echo "|---|---:|---:|---:|---:|"
    for p in "${phases[@]}"; do
        awk -F'\t' -v p="$p" -v runs="$2" '
            $4 == p && $2 ~ runs {
                if (!(($1) in m) || $5 + 0 > m[$1]) m[$1] = $5 + 0
                if ($3 == 0 && (!(($1) in z) || $5 + 0 > z[$1])) z[$1] = $5 + 0
                seen = 1
            }
            function v(a, k) { return (k in a) ? a[k] : "-" }
            END {
                if (seen) printf "| %s | %s | %s | %s | %s |\n", p, v(m, "before"), v(m, "after"), v(z, "before"), v(z, "after")
            }' "$records"
    done
    echo
}

echo "Peak host RSS (MiB) by phase, model=small, FSDP FULL_SHARD, 4 CPU ranks, full checkpoints"
echo
table "Both runs (the job to step $first_steps and its resume to step $resume_steps):" '^(train|resume)$'
table "The job (steps 1-$first_steps):" '^train$'
table "The resume (from step $first_steps to step $resume_steps):" '^resume$'
echo "Run directories and rank logs: $work" >&2
