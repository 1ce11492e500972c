#!/usr/bin/env bash
# On the GPU machine, from protocol.sh: make the protocol's working folder W (/tmp/$NAME) and say, in a line or
# two, which it is. A warm machine's W (an earlier call's, with a stopped run's checkpoint) is continued, unless it
# lacks a finished run the tracked copy .gpu/$NAME holds: an earlier call there started from a copy not yet
# merged, and continuing it would make those runs again (2026-12-04: a run made twice so). W is then replaced
# by the tracked copy, as on a fresh machine.   NAME=proto5 W=/tmp/proto5 bash .gpu/workdir.sh
set -eu
NAME=${NAME:-proto5}
W=${W:-/tmp/$NAME}
tracked=.gpu/$NAME
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
