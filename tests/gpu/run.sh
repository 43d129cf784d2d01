#!/usr/bin/env bash
# The GPU check in one command, for a CUDA machine: the tests (pytest -m gpu tests/gpu), then
# benchmarks/gpu_check.py (torchrun over every GPU when there are several), into one markdown results file.
#
#   bash tests/gpu/run.sh                       # writes gpu-check-results.md in the current directory
#   bash tests/gpu/run.sh /path/results.md      # elsewhere
#   TRAINWRIGHT_GPU_TESTS_ON_CPU=1 bash tests/gpu/run.sh   # the tests' and the script's own logic on CPU (gloo, tiny shapes)
#
# Exits non-zero when a test or a check fails. Skipped tests are listed with their reasons: a skip is not a pass.
# PYTHON picks the interpreter (default: the project's .venv, else python3).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$(realpath -m "${1:-gpu-check-results.md}")"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
cd "$ROOT"
GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
{
    echo "# GPU check — $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "GPUs: $GPUS; $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
    command -v nvidia-smi >/dev/null && nvidia-smi -L | sed 's/^/    /'
    echo
    echo "## pytest -m gpu tests/gpu"
} >"$OUT"
export TRAINWRIGHT_GPU_RESULTS="$OUT"   # the tests append their tables (step time, peak memory)
start=$(date +%s)
"$PYTHON" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT.pytest.txt"
tests_rc=${PIPESTATUS[0]}
{ echo; echo '```text'; tail -n 60 "$OUT.pytest.txt"; echo '```'; echo; echo "## benchmarks/gpu_check.py"; } >>"$OUT"
rm -f "$OUT.pytest.txt"
if [[ "${TRAINWRIGHT_GPU_TESTS_ON_CPU:-}" == 1 ]]; then
    check=("$PYTHON" benchmarks/gpu_check.py --smoke-on-cpu)
elif [[ "$GPUS" -ge 2 ]]; then
    check=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$GPUS" benchmarks/gpu_check.py)
else
    check=("$PYTHON" benchmarks/gpu_check.py)
fi
"${check[@]}" 2>"$OUT.stderr.txt" | tee -a "$OUT"
check_rc=${PIPESTATUS[0]}
if [[ $check_rc -ne 0 ]]; then
    { echo; echo '```text'; tail -n 80 "$OUT.stderr.txt"; echo '```'; } >>"$OUT"
fi
rm -f "$OUT.stderr.txt"
echo >>"$OUT"
echo "pytest exit status $tests_rc, gpu_check.py exit status $check_rc, $(( $(date +%s) - start )) s in all" | tee -a "$OUT"
echo "results: $OUT"
[[ $tests_rc -eq 0 && $check_rc -eq 0 ]]
