#!/usr/bin/env bash
# One call on a one-GPU machine: the fast MXFP8 proxy step profiled (perf.sh's profile-fast stage) in up to four
# trees one after another on the same GPU, the A/B tables of docs/studies/bench.md. Run it from the repository root,
# carrying .whl, dev/gpu/commit and one tarball per other tree (HOWTO.md: `git archive --format=tar.gz -o
# .NAME.tgz BRANCH`). Its arguments are the trees, this checkout as "." (named main):
#   bash dev/gpu/ab_profile.sh . .dual.tgz .combo.tgz
# (a tarball of this repository is ~15 MB: the carry limit, 64 MiB with the working tree, takes two of them)
# Back in $OUT, two files a tree (8 at most): NAME_profile_fast.json and NAME_perf.log, NAME the tarball's name
# without its dot and .tgz. Each perf.log's summary lines are printed at the end. STAGES (default profile-fast),
# MODEL, DEVICE, KERNEL and QUICK go to perf.sh; ENV_SH=0 skips dev/gpu/env.sh, as in perf.sh (then the trees run
# with PYTHONPATH set to each tree's root). dev/gpu/tests/test_ab_profile.py runs it on a CPU.
set -u
if [ $# -lt 1 ] || [ $# -gt 4 ]; then
    echo "ab_profile.sh: give 1 to 4 trees ('.' or a carried .NAME.tgz): two files each come back, 8 at most" >&2
    exit 2
fi
if [ -z "${OUT:-}" ] || [ ! -d "$OUT" ]; then
    echo "ab_profile.sh: OUT must name an existing folder for the results" >&2
    exit 2
fi
ROOT=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
names=()
for tree in "$@"; do  # every argument checked before anything runs
    if [ "$tree" = . ]; then
        name=main
    else
        [ -f "$tree" ] || { echo "ab_profile.sh: $tree: no such tarball here (carry it)" >&2; exit 2; }
        name=$(basename "$tree" .tgz)
        name=${name#.}
    fi
    case " ${names[*]:-} " in *" $name "*) echo "ab_profile.sh: two trees named $name" >&2; exit 2 ;; esac
    names+=("$name")
done
i=0
for tree in "$@"; do
    name=${names[$i]}
    i=$((i + 1))
    dir=$ROOT
    if [ "$tree" != . ]; then
        dir=$WORK/$name
        mkdir -p "$dir"
        tar xzf "$tree" -C "$dir" || { echo "ab_profile.sh: $tree: not a tarball of a tree" >&2; exit 2; }
        [ -d .whl ] && cp -r .whl "$dir/"
        # the tree's commit, which `git archive` writes into the tarball; unknown where git cannot read it
        mkdir -p "$dir/dev/gpu"
        (gzip -dc "$tree" | git get-tar-commit-id 2>/dev/null || echo unknown) > "$dir/dev/gpu/commit"
    fi
    out=$WORK/$name.out
    mkdir -p "$out"
    echo "== $name ($tree)"
    (cd "$dir" && PYTHONPATH="$dir" OUT="$out" STAGES="${STAGES:-profile-fast}" bash dev/gpu/perf.sh \
        > "$out/stdout.log" 2>&1)
    echo "perf.sh exit: $?"
    [ -f "$out/profile_fast.json" ] && cp "$out/profile_fast.json" "$OUT/${name}_profile_fast.json"
    [ -f "$out/perf.log" ] && cp "$out/perf.log" "$OUT/${name}_perf.log"
done
for name in "${names[@]}"; do
    echo "== $name"
    grep -aE "^profile fast:|^  with stacks" "$OUT/${name}_perf.log" 2>/dev/null \
        || echo "(no profile summary: see ${name}_perf.log)"
done
