#!/usr/bin/env bash
# The collapse table on the real engine (docs/real-engine.md): for each seed, agent-steady (off),
# agent-burst (off) and agent-burst (budgeter-park switched on at minute 3), 6 wall minutes each,
# against one real vLLM engine and a fresh sidecar per run. Then the table (collapse_table.py).
#   usage: scripts/engine/collapse-table.sh OUT_DIR [SEED ...]        (default seeds 0 1 2 3)
#   env:   PY (default .venv/bin/python), MINUTES (6), CONTROL_START_MIN (3), PRESET (cpu-tiny),
#          ROWS ("steady:off burst:off burst:budgeter-park"), ENGINE_URL (reuse a running engine),
#          ENGINE_POOL_TOKENS (default: the preset's pool_tokens), ENGINE_CPUS (pin the engine, e.g. 0),
#          ENGINE_NICE (e.g. -20, root; also its session's autogroup: `realengine serve --nice`),
#          FIT (1: `simulator fit` the engine before and after the runs, fit-start.json / fit-end.json),
#          SIDE_CPUS (pin the sidecars, the live-run driver and the fits elsewhere, e.g. 1: `taskset -c`)
# The docs' table was measured with ENGINE_CPUS=0 ENGINE_NICE=-20 (docs/real-engine.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: $0 OUT_DIR [SEED ...]}; shift || true
seeds=("$@"); [ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2 3)
PY=${PY:-.venv/bin/python}
MINUTES=${MINUTES:-6}; CONTROL_START_MIN=${CONTROL_START_MIN:-3}; PRESET=${PRESET:-cpu-tiny}
ROWS=${ROWS:-"steady:off burst:off burst:budgeter-park"}
export PREFIXOPS_OPERATOR_TOKEN=${PREFIXOPS_OPERATOR_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(18))')}
mkdir -p "$out"
port() { "$PY" -c 'from tests.support import free_port; print(free_port())'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 900); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; echo "no answer from $1" >&2; return 1; }
side=(); [ -n "${SIDE_CPUS:-}" ] && side=(taskset -c "$SIDE_CPUS")
engine=${ENGINE_URL:-}
if [ -z "$engine" ]; then
  ep=$(port); engine="http://127.0.0.1:$ep"
  pool=${ENGINE_POOL_TOKENS:-$("$PY" -c "from simulator.fit import preset_overrides as p; print(p('$PRESET').get('pool_tokens', 20480))")}
  place=()
  [ -n "${ENGINE_CPUS:-}" ] && place+=(--cpus "$ENGINE_CPUS")
  [ -n "${ENGINE_NICE:-}" ] && place+=(--nice "$ENGINE_NICE")
  "$PY" -m realengine build
  "$PY" -m realengine serve --port "$ep" --pool-tokens "$pool" "${place[@]}" > "$out/engine.log" 2>&1 & pids+=($!)
  wait_up "$engine/health"
fi
FIT=${FIT:-1}
[ "$FIT" = 1 ] && "${side[@]}" "$PY" -m simulator fit --engine "$engine" --out "$out/fit-start.json" | tee -a "$out/runs.txt"
for seed in "${seeds[@]}"; do
  for row in $ROWS; do
    scenario=agent-${row%%:*}; control=${row##*:}; name="$scenario-$control-seed$seed"
    sp=$(port); sidecar="http://127.0.0.1:$sp"
    "${side[@]}" "$PY" -m sidecar --engine "$engine" --port "$sp" --state-db "$out/$name.sidecar.db" > "$out/$name.sidecar.log" 2>&1 &
    sc=$!; pids+=($sc)
    wait_up "$sidecar/healthz"
    "${side[@]}" "$PY" -m simulator live-run --engine "$engine" --sidecar "$sidecar" --scenario "$scenario" --control "$control" \
      --control-start-min "$CONTROL_START_MIN" --minutes "$MINUTES" --seed "$seed" --preset "$PRESET" \
      --out "$out/$name" 2>&1 | tail -1 | tee -a "$out/runs.txt"
    kill "$sc"; wait "$sc" 2>/dev/null || true
    sleep 5  # let the engine finish what the run left
  done
done
[ "$FIT" = 1 ] && "${side[@]}" "$PY" -m simulator fit --engine "$engine" --out "$out/fit-end.json" | tee -a "$out/runs.txt"
"$PY" scripts/engine/collapse_table.py "$out" | tee "$out/table.md"
