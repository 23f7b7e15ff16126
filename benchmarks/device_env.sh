# Sourced by the device scripts (. benchmarks/device_env.sh DEFAULT_OUT): the output folder
# ($OUT, else DEFAULT_OUT), the environment every run shares, and a header naming the GPU
# and the commit ($COMMIT when given: the device's own git may name another) in gpu.txt.
OUT="${OUT:-$1}"
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 LOWVM_CACHE_DIR=/tmp/lowvm-cache
# GemLite's source, where carried (benchmarks/carry_gemlite.sh; run with carry: .carry)
[ -d .carry/gemlite_src ] && export PYTHONPATH=.carry/gemlite_src:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit: ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
  | tee -a "$OUT/gpu.txt"
# sweep NAME SHAPE VARIANTS [gemm_quick options...]: one gemm_quick.py run of the given
# schedules on one shape, into $W/NAME.json and .log ($W: the script's work folder)
sweep() {
  local name=$1 shape=$2 variants=$3
  shift 3
  python benchmarks/gemm_quick.py --shapes "$shape" --variants "$variants" "$@" \
    --out "$W/$name.json" > "$W/$name.log" 2>&1
}
