#!/usr/bin/env bash
# Here, after a call of protocol.sh: fold the GPU machine's protocol folder (results.tgz) into the tracked copy
# .gpu/$NAME, finished runs only (a stopped run's checkpoint stayed on that machine), then commit it at once:
# nothing outside git outlives a session.   bash .gpu/merge.sh /work/.device/N/results.tgz
set -eu
NAME=${NAME:-proto5}
tgz=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$tgz" -C "$tmp"
src=$tmp/$NAME
[ -f "$src/protocol.json" ] || { echo "merge.sh: $tgz holds no $NAME/protocol.json"; exit 2; }
if [ -s "$src/unfinished.txt" ]; then
    while read -r d; do echo "not merged (stopped part-way): $d"; rm -rf "${src:?}/$d"; done < "$src/unfinished.txt"
fi
rm -f "$src/unfinished.txt"
find "$src" -type d -empty -delete
mkdir -p ".gpu/$NAME"
# the GPU side started from the tracked copy, so it holds every run here and more: refuse one that lost any
for f in $(cd ".gpu/$NAME" && find . -type f); do
    [ -f "$src/$f" ] || { echo "merge.sh: $f is tracked but not in $tgz: not merged"; exit 2; }
done
cp -r "$src/." ".gpu/$NAME/"
git add ".gpu/$NAME"
git status --short ".gpu/$NAME" | head -40
