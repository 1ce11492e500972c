#!/usr/bin/env bash
# On the GPU machine, from protocol.sh: make the protocol's working folder W (/tmp/$NAME) and say, in a line or
# two, which it is. A warm machine's W (an earlier call's, with a stopped run's checkpoint) is continued, unless it
# lacks a finished run the tracked copy dev/gpu/$NAME holds: an earlier call there started from a copy not yet
# merged, and continuing it would make those runs again. W is then replaced by the tracked copy, as on a fresh
# machine.   NAME=myplan W=/tmp/myplan bash dev/gpu/workdir.sh
set -eu
[ -n "${NAME:-}" ] || { echo "workdir.sh: set NAME, the plan's name (its flags are dev/gpu/NAME.args)" >&2; exit 2; }
W=${W:-/tmp/$NAME}
tracked=dev/gpu/$NAME
how="fresh machine"
if [ -f "$W/protocol.json" ] && [ -d "$tracked/runs" ]; then
    lacked=$(cd "$tracked" && find runs -name metrics.jsonl.gz | while read -r f; do [ -f "$W/$f" ] || echo "$f"; done)
    if [ -n "$lacked" ]; then
        echo "warm machine's $W lacked $(echo "$lacked" | wc -l) finished run(s) the tracked copy holds: replaced by it"
        rm -rf "$W"
        how="warm machine, its folder replaced"
    fi
fi
if [ -f "$W/protocol.json" ]; then
    echo "warm machine: continuing in $W (a run an earlier call stopped goes on from its checkpoint)"
elif [ -d "$tracked" ]; then
    rm -rf "$W"
    cp -r "$tracked" "$W"
    echo "$how: $W copied from $tracked (a run an earlier call stopped starts again at step 0)"
else
    echo "new protocol: no $tracked here, $W starts empty"
fi
