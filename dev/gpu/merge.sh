#!/usr/bin/env bash
# On the developer's machine, after a call of protocol.sh: fold the GPU machine's protocol folder (results.tgz)
# into the tracked copy dev/gpu/$NAME, finished runs only (a stopped run's checkpoint stays on that machine), then
# commit it at once: ignored files do not outlive the checkout.   bash dev/gpu/merge.sh PATH/results.tgz
# The GPU side starts from the tracked copy and only adds to it (new finished runs, pace.jsonl appended), so a
# tarball that lost, changed or cut short a tracked file is refused whole (exit 2, one line on stderr, nothing
# copied): the tracked runs are hours of GPU time.
set -eu
refuse() { echo "merge.sh: $*" >&2; exit 2; }
[ -n "${NAME:-}" ] || refuse "set NAME, the plan's name (its flags are dev/gpu/NAME.args)"
[ $# -eq 1 ] || refuse "usage: bash dev/gpu/merge.sh RESULTS.tgz (the results.tgz a protocol.sh call sent back)"
tgz=$1
[ -f "$tgz" ] || refuse "$tgz: no such file"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$tgz" -C "$tmp" 2>/dev/null || refuse "$tgz: not a whole gzip tarball (cut short in transfer?)"
src=$tmp/$NAME
[ -f "$src/protocol.json" ] || refuse "$tgz holds no $NAME/protocol.json"
if [ -s "$src/unfinished.txt" ]; then
    while read -r d; do
        [ -n "$d" ] || continue  # a blank line names nothing
        # protocol.sh writes runs/RUN/RECIPE; anything else would have rm reach outside the unpacked folder
        [[ "$d" =~ ^runs/[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$ && "$d" != *..* ]] \
            || refuse "$tgz: unfinished.txt names '$d', not a run folder runs/RUN/RECIPE"
        echo "not merged (stopped part-way): $d"
        rm -rf "${src:?}/$d"
    done < "$src/unfinished.txt"
fi
rm -f "$src/unfinished.txt"
find "$src" -type d -empty -delete
mkdir -p "dev/gpu/$NAME"
compacted=()
for f in $(cd "dev/gpu/$NAME" && find . -type f); do
    if [ ! -f "$src/$f" ] && [ -f "$src/$f.gz" ]; then  # a log tracked plain and compacted since (a fork's trunk
        # is compacted once its continuations are all done): taken when it holds the tracked bytes
        gzip -dc "$src/$f.gz" 2>/dev/null | cmp -s - "dev/gpu/$NAME/$f" \
            || refuse "$f.gz in $tgz is not the tracked $f compressed: not merged"
        compacted+=("$f")
        continue
    fi
    [ -f "$src/$f" ] || refuse "$f is tracked but not in $tgz: not merged"
    if [ "$f" = ./pace.jsonl ]; then  # appended to by every piece: the tracked lines must come first, unchanged
        n=$(stat -c %s "dev/gpu/$NAME/$f")
        cmp -s -n "$n" "dev/gpu/$NAME/$f" "$src/$f" \
            || refuse "$f in $tgz is not the tracked one with lines appended (an older call's?): not merged"
    else
        cmp -s "dev/gpu/$NAME/$f" "$src/$f" || refuse "$f differs from the tracked one in $tgz: not merged"
    fi
done
cp -r "$src/." "dev/gpu/$NAME/"
for f in "${compacted[@]}"; do
    echo "compacted: $f"
    git rm -q "dev/gpu/$NAME/$f"
done
git add "dev/gpu/$NAME"
git status --short "dev/gpu/$NAME" | head -40
