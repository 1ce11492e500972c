#!/usr/bin/env bash
# One call on a one-GPU machine: where the fast MXFP8 proxy step's time goes, measured as the starting point of the
# work on its speed (docs/studies/bench.md, "Where the fast MXFP8 step's time goes: the plan"). Run it from the
# repository root, carrying .whl and dev/gpu/commit (HOWTO.md). Everything lands in $OUT, 8 files, no sub-folder:
#   env.json                               the machine (dev/gpu/env.sh)
#   perf.log                               every command's whole output in order, each stage's exit code and time
#   profile_bf16.json, trace_bf16.json.gz  python -m convergence profile-step, BF16, eager; its raw events
#   profile_fast.json, trace_fast.json.gz  the same for MXFP8 on the fast kernel, with --stacks
#   fast_bench.json                        python -m numerics.layer.fast.bench --repeats 3 (casts, and linear and
#                                          grouped GEMM forward + backward, at the 16B expert shapes)
#   bench_proxy.json                       python -m convergence bench --model proxy --repeats 3 (eager and compiled;
#                                          rewritten after every round of repeats)
# A trace is read again on any machine with python -m convergence profile-step --from-trace FILE (the proxy's are
# estimated at 5-10 MB; a file over the call's 16 MiB would be left out, the others still come back). Each stage has a
# time limit (SIGINT, so a command stops as on Ctrl-C); the bench, the longest, comes last with what is left of
# TOTAL seconds (default 585: a call's 600 less the exit). Expected on an H200 about 7 minutes: install 20 s,
# profiles 40 + 60 s, layer bench 80 s, bench 240 s (the plan's section says how each is estimated).
# MODEL, DEVICE, KERNEL, REPEATS and QUICK=1 (small shapes and few steps) run the same stages elsewhere; ENV_SH=0 skips
# dev/gpu/env.sh on a machine whose environment is already set. dev/gpu/tests/test_perf.py runs it so on a CPU.
# STAGES (comma-separated, default all: profile-bf16,profile-fast,layer-bench,bench) runs a subset, e.g. to profile
# another commit's tree in the same call: cd into it (with its own .whl and dev/gpu/env.sh) and run this script.
set -u
MODEL=${MODEL:-proxy}
DEVICE=${DEVICE:-cuda}
KERNEL=${KERNEL:-fast}
REPEATS=${REPEATS:-3}
TOTAL=${TOTAL:-585}
QUICK=${QUICK:-0}
STAGES=${STAGES:-profile-bf16,profile-fast,layer-bench,bench}
if [ -z "${OUT:-}" ] || [ ! -d "$OUT" ]; then
    echo "perf.sh: OUT must name an existing folder for the results" >&2
    exit 2
fi
if [ "${ENV_SH:-1}" = 1 ]; then
    source dev/gpu/env.sh
else
    export PYTHONUNBUFFERED=1
fi
LOG=$OUT/perf.log
SIZE=()
LAYER=()
BENCH=()
if [ "$QUICK" = 1 ]; then
    SIZE=(--batch 1 --seq 32 --warmup 1 --steps 1)
    LAYER=(--quick --iters 1 --warmup 0 --no-compile)
    BENCH=(--batch 1 --seq 32 --warmup 0 --steps 1 --no-compile --kernel "$KERNEL")
fi

stage() {  # stage NAME LIMIT_S COMMAND...: its output to the log, one line on stdout (a stage not in STAGES: nothing)
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    case ",$STAGES," in *",$name,"*) ;; *) return 0 ;; esac
    echo "== $name (at most ${limit} s): $*" >> "$LOG"
    timeout -s INT -k 15 "$limit" "$@" >> "$LOG" 2>&1
    local code=$?
    echo "== $name: exit $code after $((SECONDS - t0)) s$([ $code = 124 ] && echo ', cut at its limit')" | tee -a "$LOG"
}

PROFILE=(python3 -m convergence profile-step --model "$MODEL" --device "$DEVICE" "${SIZE[@]}")
stage profile-bf16 120 "${PROFILE[@]}" --recipe bf16 --json "$OUT/profile_bf16.json" \
    --trace "$OUT/trace_bf16.json.gz"
stage profile-fast 150 "${PROFILE[@]}" --recipe mxfp8 --mxfp8-kernel "$KERNEL" --stacks \
    --json "$OUT/profile_fast.json" --trace "$OUT/trace_fast.json.gz"
stage layer-bench 150 python3 -m numerics.layer.fast.bench --device "$DEVICE" --repeats "$REPEATS" "${LAYER[@]}" \
    --json "$OUT/fast_bench.json"
left=$((TOTAL - SECONDS - 20))  # 20 s for the summary and the exit
if [[ ",$STAGES," != *",bench,"* ]]; then
    :
elif [ "$left" -ge 60 ]; then
    stage bench "$left" python3 -m convergence bench --model "$MODEL" --device "$DEVICE" --repeats "$REPEATS" \
        "${BENCH[@]}" --json "$OUT/bench_proxy.json"
else
    echo "== bench: not run, ${left} s left" | tee -a "$LOG"
fi

# the figures to read first, from the files (a stage that wrote nothing is said so)
OUT="$OUT" python3 - <<'EOF' | tee -a "$LOG"
import json, os
from pathlib import Path

out = Path(os.environ["OUT"])
for name in ("bf16", "fast"):
    p = out / f"profile_{name}.json"
    if not p.exists():
        print(f"profile {name}: none")
        continue
    r = json.loads(p.read_text())
    g = r["gpu"] or {}
    print(f"profile {name}: {r['step_ms']:.1f} ms/step unprofiled, wall {r['wall_ms']:.1f}; GPU kernels "
          f"{g.get('kernel_ms', float('nan')):.1f} ms, idle {g.get('idle_ms', float('nan')):.1f} ms; launches "
          f"{g.get('launches', float('nan')):.0f}, syncs {g.get('syncs', float('nan')):.0f}; GPU ms by group "
          + ", ".join(f"{k} {v['gpu_ms']:.1f}" for k, v in r["groups"].items() if v["gpu_ms"] is not None))
    if g.get("idle_before_caller"):
        print("  GPU idle before work launched by: " + "; ".join(
            f"{c['caller']} {c['ms']:.1f} ms" for c in g["idle_before_caller"][:3]))
    w = r.get("with_stacks")
    if w and w["groups"]["padding"]["gpu_ms"] is not None:  # only a step with Python stacks tells padding apart
        print(f"  with stacks (one step): GPU ms by group "
              + ", ".join(f"{k} {v['gpu_ms']:.1f}" for k, v in w["groups"].items() if v["gpu_ms"] is not None))
p = out / "fast_bench.json"
if p.exists():
    for o in json.loads(p.read_text())["ops"]:
        lo, hi = o["fast_over_bf16_range"]
        print(f"layer {o['op']} fwd+bwd: fast / bf16 {o['fast_over_bf16']:.2f}x ({lo:.2f}-{hi:.2f})")
else:
    print("layer bench: none")
p = out / "bench_proxy.json"
if p.exists():
    doc = json.loads(p.read_text())
    print(f"bench: {doc['repeats_done']} of {doc['repeats']} rounds")
    for r in doc["rows"]:
        if "error" in r:
            print(f"  {r['recipe']} {r['kernel']} compiled={r['compiled']}: {r['error']}")
            continue
        ratio = r.get("ratio_to_bf16_range") or [float("nan")] * 2
        print(f"  {r['recipe']} {r['kernel'] or '-'} compiled={r['compiled']}: {1e3 * r['step_s']:.1f} ms "
              f"({1e3 * r['step_s_range'][0]:.1f}-{1e3 * r['step_s_range'][1]:.1f}), x bf16 "
              f"{r.get('ratio_to_bf16', float('nan')):.2f} ({ratio[0]:.2f}-{ratio[1]:.2f})"
              + (f", {r['dynamo_graphs']} dynamo graph(s)" if r.get("dynamo_graphs") is not None else ""))
else:
    print("bench: none")
EOF
ls -la "$OUT"
echo "perf.sh: done after $SECONDS s"
