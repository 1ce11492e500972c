#!/usr/bin/env bash
# One call on a GPU machine: continue a convergence protocol plan (its flags in dev/gpu/$NAME.args) for about
# TOTAL seconds (default 585). Run it from the repository root, carrying .whl and dev/gpu/commit; then, on the
# developer's machine, merge what comes back:   bash dev/gpu/merge.sh PATH/results.tgz
# WHOLE=1 (default) starts only runs that end in time (--whole-runs: a stopped run's checkpoint lives on that
# machine's disk alone); WHOLE=0 fills the call, stopping a run part-way, for a call that another follows at once
# on the same warm machine (the next continues the run from its checkpoint in /tmp/$NAME).
# TIER=1 (for the last call of a series): the one-GPU tier (`pytest -m gpu`) in what is left of TOTAL after the
# tarball, when at least TIER_MIN s (default 320) are; its log is $OUT/tier.log (record it with
# golden.tier_summary). TIER_MIN: the tier takes ~280 s on an H200 (pytest's own count, the install already
# done), so 320 s leaves ~15 % over it; a tier cut at the end costs only time that would have idled.
# PARALLEL=N (default 1): N runs share the GPU at once (`--parallel N`; a proxy run peaks at ~23 GiB of GPU memory,
# so 3 fit on an H100, but gain nothing there: three proxy continuations at once made ~1.0x one's tokens a second).
# Its pace is recorded as N to a GPU, so the first call with a new N has no pace to refuse a run with: use it with
# WHOLE=0 on a machine the next call finds warm.
# The working folder is /tmp/$NAME on the GPU machine: a machine kept warm between calls keeps it, and with it
# a stopped run's checkpoint, so the next call continues that run; a fresh machine starts from the tracked copy.
set -u
NAME=${NAME:-}
TOTAL=${TOTAL:-585}
WHOLE=${WHOLE:-1}
TIER=${TIER:-0}
TIER_MIN=${TIER_MIN:-320}
PARALLEL=${PARALLEL:-1}
if [ -z "$NAME" ] || [ ! -f "dev/gpu/$NAME.args" ]; then
    echo "protocol.sh: no dev/gpu/\$NAME.args (NAME='$NAME'): write the plan's flags there and call with NAME=..." >&2
    exit 2
fi
source dev/gpu/env.sh
W=/tmp/$NAME
NAME="$NAME" W="$W" bash dev/gpu/workdir.sh > "$OUT/protocol.log" || exit 2
echo "${MXVAL_COMMIT:-unknown}" > "$OUT/commit"
# 30 s of the call go to the install above, the tarball below and the process's exit
minutes=$(python3 -c "print(round(($TOTAL - 30 - $SECONDS) / 60, 3))")
set -o pipefail
python3 -m convergence protocol $(cat "dev/gpu/$NAME.args") --device cuda --out "$W" \
    --stop-after-minutes "$minutes" --parallel "$PARALLEL" $([ "$WHOLE" = 1 ] && echo --whole-runs) 2>&1 \
    | tee -a "$OUT/protocol.log"
echo "protocol exit: $?"
# runs stopped part-way keep their checkpoint in $W only; say which, and send back the rest (a fork's finished
# trunk keeps its checkpoint too, but is finished: dev/gpu/unfinished.py)
python3 dev/gpu/unfinished.py "$W" > "$W/unfinished.txt"
# results/ stays behind: the plan is judged again on the developer's machine, on the CPU, and a whole plan's
# judged files (99 for a 64-run plan) take the tarball over the 16 MiB a file from $OUT may be
tar czf "$OUT/results.tgz" --exclude=checkpoint.pt --exclude="$NAME/results" -C /tmp "$NAME"
ls -la "$OUT"
left=$((TOTAL - 10 - SECONDS))
if [ "$TIER" = 1 ]; then
    if [ "$left" -ge "$TIER_MIN" ]; then
        echo "one-GPU tier in the ${left} s left (log: tier.log)"
        timeout "$left" python3 -m pytest -m gpu -p no:cacheprovider -v -rfEsx --timeout 200 --durations=25 \
            -o faulthandler_timeout=150 > "$OUT/tier.log" 2>&1
        echo "tier exit: $? (124: cut at the call's end, no summary to record)"; tail -3 "$OUT/tier.log"
    else
        echo "one-GPU tier not run: ${left} s left, it asks ${TIER_MIN} s"
    fi
fi
