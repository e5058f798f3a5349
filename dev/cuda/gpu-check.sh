#!/bin/bash
# The CUDA path on a real GPU, in one command (< 10 min on one H100), from the repository root:
#     dev/cuda/gpu-check.sh            report: $OUT/gpu-check-report.txt (OUT defaults to a temp dir)
# Builds; runs the full CUDA tests (and through the PTX JIT path); compute-sanitizer memcheck,
# racecheck, synccheck when present; the kernel checker (bit-exact, GB/s against the GPU's HBM);
# the backend benchmark (end-to-end GB/s, per-stage times from nsys when present); every fixture
# on cuda vs cpu with cmp; a gpt-oss-20b-shaped 2-layer convert cuda vs cpu (time, peak RSS, peak
# device memory) and a 4x larger one (peak device memory against --gpu-mem); transformers'
# convert_moe_packed_tensors on the same GPU when torch is importable; a negative control (kernels
# built with -ftz=true must be refused by the start-up self-test, exit 6); the error messages of
# the driver/device checks and of a device fault; the node's I/O (dev/cuda/io-check.sh: dd floors
# with 1 and nproc writers on tmpfs and on the disk, then convert --device cuda and cpu, W=8 and
# --layout hf, to both, GB/s against those floors); a closing summary (kernel GB/s
# vs HBM, end to end vs the CPU backend and vs transformers, peak device memory vs --gpu-mem,
# which fails above --gpu-mem + 1 GiB of context or when it grows with the input); then
# bfshard.torch.load into CUDA shards (dev/cuda/load-check.py: fixtures at W=1 and 2, from .zst
# only and through a tiny pinned ring, bit for bit against a load into CPU tensors; a 2 GB
# gpt-oss-shaped rank file into cuda:0 in GB/s against a pinned H2D copy, a plain read and
# safetensors' safe_open; peak host memory against max_host_bytes), its figures in the summary.
# On a machine without a GPU every GPU step
# prints "SKIP (no GPU): ..." and the rest (build, emulated checks, the I/O step's CPU half) still runs.
# The I/O step adds ~3 min on a 16-core node and needs ~20 GB of tmpfs and ~15 GB of disk
# (it skips, saying so, what does not fit); the load step ~1-2 min and ~3 GB of /dev/shm.
# Knobs: OUT, JOBS (make -j, default nproc), BIG_LAYERS (the 4x input, default 8),
#        GPU_MEM (default 1G), KEEP=1 (keep the synthetic checkpoints), IO=0 (skip the I/O
#        step), and io-check.sh's own: IO_LAYERS, IO_GIB, IO_TMPFS, IO_DISK, IO_TIMEOUT;
#        LOAD=0 (skip the load step), LOAD_TIMEOUT (its limit, default 600 s).
set -u
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}
mkdir -p "$OUT"
REPORT=$OUT/gpu-check-report.txt
exec > >(tee "$REPORT") 2>&1
JOBS=${JOBS:-$(nproc)}
BIG_LAYERS=${BIG_LAYERS:-8}
GPU_MEM=${GPU_MEM:-1G}
W=$OUT/work
mkdir -p "$W"
S=$(date +%s)
FAILS=0
step() { echo; echo "=== [$(( $(date +%s) - S ))s] $*"; }
skip() { echo "SKIP (no GPU): $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
run() { local t=$1; shift; timeout "$t" "$@"; local rc=$?; [ $rc -eq 124 ] && echo "TIMEOUT after ${t}s: $*"; return $rc; }

GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then GPU=1; fi
HAVE_NVCC=0; command -v nvcc >/dev/null 2>&1 && HAVE_NVCC=1

step "0 machine"
if [ $GPU = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,pcie.link.gen.max,pcie.link.width.max,memory.total,compute_mode --format=csv
else
    echo "no GPU (nvidia-smi absent or lists none): every GPU step is skipped"
fi
[ $HAVE_NVCC = 1 ] && nvcc --version | tail -1 || echo "no nvcc: CUDA is not built"
lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)'; free -g | sed -n 2p; df -h . | tail -1
GPUNAME=$( [ $GPU = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo none)
case $GPUNAME in   # HBM bandwidth (TB/s), the figure the kernel GB/s is held against
    *H200*) HBM=4.8 ;; *H100*NVL*) HBM=3.9 ;; *H100*PCIe*) HBM=2.0 ;; *H100*|*H800*) HBM=3.35 ;;
    *B200*) HBM=8.0 ;; *A100*80GB*) HBM=2.0 ;; *A100*) HBM=1.55 ;; *L40S*|*L40*) HBM=0.86 ;;
    *L4*) HBM=0.3 ;; *T4*) HBM=0.32 ;; *A10*) HBM=0.6 ;; *) HBM=unknown ;;
esac
echo "GPU: $GPUNAME, HBM ~ $HBM TB/s"

step "1 build (the Makefile's exact flags), dev programs, the emulated build"
if [ $HAVE_NVCC = 1 ]; then
    run 400 make -j"$JOBS" all build/tests/test_cuda build/cuda-emu/bfshard build/cuda-emu/test_cuda \
        > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; fail "build"; exit 1; }
    grep -o "BFS_CUDA_ARCHS='[^']*'" "$W/build.log" | head -1
    run 200 sh dev/cuda/build.sh dev > "$W/dev.log" 2>&1 || { tail -5 "$W/dev.log"; fail "dev/cuda/build.sh dev"; }
else
    run 300 make -j"$JOBS" all > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; fail "build"; exit 1; }
    echo "no nvcc: CPU-only build; every CUDA step below is skipped"
fi
build/bfshard --version 2>/dev/null | head -2

step "2 test_cuda, full (bit-exact vs ref.h: every scale x every byte, chunking, budgets, memory bound, gpt-oss-20b layer)"
if [ $GPU = 1 ] && [ $HAVE_NVCC = 1 ]; then
    run 300 build/tests/test_cuda > "$W/test_cuda.txt" 2>&1; rc=$?
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  (ERROR|FAILED)|budget|^  ' "$W/test_cuda.txt" | head -40
    [ $rc = 0 ] || fail "test_cuda (rc $rc; $W/test_cuda.txt)"
    step "2b the same through the PTX JIT path (what a GPU without SASS in this build takes)"
    CUDA_FORCE_PTX_JIT=1 BFS_TEST_GPTOSS_ITEMS=2 BFS_TEST_CUDA_QUICK=1 run 200 build/tests/test_cuda > "$W/test_cuda_jit.txt" 2>&1 \
        || fail "test_cuda under CUDA_FORCE_PTX_JIT=1"
    grep -E '^\[  (PASSED|FAILED) ' "$W/test_cuda_jit.txt"
else
    skip "test_cuda on the GPU"
fi
if [ $HAVE_NVCC = 1 ]; then
    echo "-- make test-cuda-emu (the emulated runtime; no GPU needed)"
    run 300 make --no-print-directory test-cuda-emu > "$W/emu.txt" 2>&1 || fail "make test-cuda-emu"
    grep -E 'test-cuda-emu:|PASSED|FAILED' "$W/emu.txt" | tail -4
fi

step "3 compute-sanitizer memcheck, racecheck, synccheck (test_memory_bound is expected to fail under it: the tool takes device memory)"
if [ $GPU = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck synccheck; do
        BFS_TEST_GPTOSS_ITEMS=1 BFS_TEST_CUDA_QUICK=1 run 75 compute-sanitizer --tool $tool --print-limit 5 \
            build/tests/test_cuda > "$W/san_$tool.txt" 2>&1
        echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$W/san_$tool.txt" | tail -1)"
        grep -qE '(ERROR|RACECHECK|SYNCCHECK) SUMMARY: 0 ' "$W/san_$tool.txt" || fail "compute-sanitizer $tool ($W/san_$tool.txt)"
    done
elif [ $GPU = 1 ]; then echo "SKIP: compute-sanitizer not installed"
else skip "compute-sanitizer"; fi

step "4 the kernel alone: bit-exact v1..v3, GB/s (GPU HBM ~ $HBM TB/s)"
if [ $GPU = 1 ] && [ -x build/dev-cuda/mxfp4_dev ]; then
    run 90 build/dev-cuda/mxfp4_dev 0 32 5760 90 | tee "$W/kernel.txt"
    grep -q MISMATCH "$W/kernel.txt" && fail "kernel checker: mismatch"
    best=$(grep -oE '[0-9.]+ GB/s' "$W/kernel.txt" | sort -n | tail -1 | cut -d' ' -f1)
    KERNEL_GBS=$best
    [ -n "$best" ] && [ "$HBM" != unknown ] && awk -v b="$best" -v h="$HBM" \
        'BEGIN { printf "best kernel: %.0f GB/s = %.0f%% of HBM\n", b, 100 * b / (h * 1000) }'
else skip "kernel checker (build/dev-cuda/mxfp4_dev)"; fi

step "5 the backend end to end (gather, H2D, kernel, D2H, copy out), GB/s of BF16 output; per-stage times from nsys"
if [ $GPU = 1 ] && [ $HAVE_NVCC = 1 ]; then
    run 150 sh dev/cuda/build.sh bench 32 2>&1 | grep -vE '^(nvcc|gcc)' | tee "$W/bench.txt"
    if command -v nsys >/dev/null 2>&1; then
        run 120 nsys profile -q -t cuda,osrt -o "$W/bench" --force-overwrite true build/dev-cuda/backend_bench 8 >/dev/null 2>&1
        run 90 nsys stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum "$W/bench.nsys-rep" 2>/dev/null | head -60
    else echo "SKIP: nsys not installed (no per-stage times)"; fi
else skip "backend benchmark"; fi

step "6 CLI: every fixture, every layout, cuda vs cpu, byte for byte"
if [ $GPU = 1 ] && [ $HAVE_NVCC = 1 ]; then
    n=0; d=0
    for f in fixtures/*/; do
        f=${f%/}; case $(basename "$f") in expected|refuse) continue ;; esac
        for lay in "--layout hf" "--world-size 3" "--world-size 2 --mxfp4-layout openai" "--world-size 2 --keep-dtype"; do
            rm -rf "$W/c" "$W/p"
            build/bfshard convert "$f" "$W/c" $lay --device cuda --gpu-mem 64K --quiet || { fail "cuda convert $f $lay"; continue; }
            build/bfshard convert "$f" "$W/p" $lay --device cpu --cpu-level scalar --quiet
            for x in "$W"/p/*.safetensors; do n=$((n + 1)); cmp -s "$x" "$W/c/$(basename "$x")" || { d=$((d + 1)); fail "DIFF $f $lay $(basename "$x")"; }; done
        done
    done
    echo "fixtures: $n files compared, $d differ"; rm -rf "$W/c" "$W/p"
else skip "fixtures on the GPU (make test-cuda-emu above did them on the emulated runtime)"; fi

# peak device memory: nvidia-smi sampled every 100 ms while CMD runs (used - used before)
peak_run() { # label cmd...
    local label=$1; shift
    local base; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 > "$W/smi_$label.txt" 2>/dev/null &
    local smi=$!
    /usr/bin/time -v "$@" > "$W/run_$label.json" 2> "$W/time_$label.txt"; local rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    local peak; peak=$(sort -n "$W/smi_$label.txt" | tail -1)
    # for the summary: peak device MiB, wall seconds, GB/s (bfshard's --json)
    eval "PEAK_$label=$(( ${peak:-0} - ${base:-0} ))"
    eval "WALL_$label=$(awk -F: '/Elapsed/ { n = split($0, a, ":"); s = 0; for (i = 5; i <= n; i++) s = s * 60 + a[i]; print s }' "$W/time_$label.txt")"
    eval "GBS_$label=$(grep -oE '"gb_per_s": [0-9.]+' "$W/run_$label.json" | head -1 | awk '{print $2}')"
    echo "$label: rc $rc, $(grep -E 'Elapsed' "$W/time_$label.txt" | sed 's/.*: //') wall, peak RSS $(grep 'Maximum resident' "$W/time_$label.txt" | awk '{print $NF}') KB, peak device memory +$(( ${peak:-0} - ${base:-0} )) MiB (nvidia-smi, whole GPU), $(grep -oE '"gb_per_s": [0-9.]+' "$W/run_$label.json")"
    return $rc
}

step "7 gpt-oss-20b-shaped, 2 layers, cuda vs cpu (time, peak RSS, peak device memory), then ${BIG_LAYERS} layers on cuda"
if [ $GPU = 1 ] && [ $HAVE_NVCC = 1 ] && [ -x /usr/bin/time ]; then
    run 200 python3 dev/cuda/synth_gptoss.py "$W/syn2" --layers 2 || fail "synthetic checkpoint"
    peak_run cuda2 build/bfshard convert "$W/syn2" "$W/o_cuda" --world-size 8 --device cuda --gpu-mem "$GPU_MEM" --json --force
    peak_run cpu2 build/bfshard convert "$W/syn2" "$W/o_cpu" --world-size 8 --device cpu --json --force
    d=0; for x in "$W"/o_cpu/*.safetensors; do cmp -s "$x" "$W/o_cuda/$(basename "$x")" || { d=$((d + 1)); fail "DIFF gpt-oss $(basename "$x")"; }; done
    echo "gpt-oss 2 layers: $(ls "$W"/o_cpu/*.safetensors | wc -l) files, $d differ"; rm -rf "$W/o_cpu" "$W/o_cuda"
    step "7b transformers' convert_moe_packed_tensors on the same GPU (baseline)"
    if python3 -c 'import torch, transformers, safetensors; assert torch.cuda.is_available()' 2>/dev/null; then
        run 200 python3 - "$W/syn2" <<'PY'
import sys, time, json, torch
from safetensors import safe_open
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
d = sys.argv[1]; idx = json.load(open(d + "/model.safetensors.index.json"))["weight_map"]
tot_b, tot_t = 0, 0.0
for name in sorted(k for k in idx if k.endswith("_blocks")):
    with safe_open(f"{d}/{idx[name]}", "pt") as f:
        b = f.get_tensor(name); s = f.get_tensor(name.replace("_blocks", "_scales"))
    b, s = b.cuda(), s.cuda(); torch.cuda.synchronize(); t = time.perf_counter()
    out = convert_moe_packed_tensors(b, s); torch.cuda.synchronize(); dt = time.perf_counter() - t
    tot_b += out.numel() * 2; tot_t += dt
    print(f"{name}: {out.numel() * 2 / dt / 1e9:.1f} GB/s of BF16 (device to device)")
print(f"transformers convert_moe_packed_tensors: {tot_b / tot_t / 1e9:.1f} GB/s overall, {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB peak allocated")
PY
        TF_GBS=$(grep -oE 'convert_moe_packed_tensors: [0-9.]+' "$REPORT" | tail -1 | awk '{print $2}')
    else echo "SKIP: torch (with CUDA) + transformers not importable: no transformers baseline"; fi
    step "7c ${BIG_LAYERS} layers (4x the input) on cuda: peak device memory must stay at --gpu-mem ($GPU_MEM), not grow"
    rm -rf "$W/syn2"
    run 300 python3 dev/cuda/synth_gptoss.py "$W/synbig" --layers "$BIG_LAYERS" || fail "synthetic checkpoint (big)"
    peak_run cuda_big build/bfshard convert "$W/synbig" "$W/o_big" --world-size 8 --device cuda --gpu-mem "$GPU_MEM" --json --force
    rm -rf "$W/o_big"; [ "${KEEP:-0}" = 1 ] || rm -rf "$W/synbig"
else skip "gpt-oss-shaped converts"; fi

step "8 negative control: kernels built with -ftz=true must be refused (self-test, exit 6) and fail test_cuda"
if [ $HAVE_NVCC = 1 ]; then
    rm -rf build-ftz && mkdir -p build-ftz && cp -a build/src build/kernels build/tests build-ftz/ 2>/dev/null
    rm -f build-ftz/kernels/*.cu.o build-ftz/tests/test_cuda
    ok=1
    for k in kernels/*.cu; do  # the Makefile's flags, then -ftz=true last (the Makefile refuses to)
        nvcc -O2 -std=c++17 -Iinclude --fmad=false -prec-div=true -prec-sqrt=true -ftz=true \
            -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
            -gencode arch=compute_90,code=compute_90 -c "$k" -o "build-ftz/kernels/$(basename "$k" .cu).cu.o" 2>>"$W/ftz.log" || ok=0
    done
    [ $ok = 1 ] && run 300 make -j"$JOBS" BUILD=build-ftz build-ftz/bfshard build-ftz/tests/test_cuda >> "$W/ftz.log" 2>&1 || ok=0
    [ $ok = 1 ] || { tail -5 "$W/ftz.log"; fail "negative control build"; }
    if [ $GPU = 1 ] && [ $ok = 1 ]; then
        build-ftz/bfshard convert fixtures/mxfp4-tiny "$W/ftz" --device cuda --quiet 2> "$W/ftz_run.txt"; rc=$?
        cat "$W/ftz_run.txt"
        [ $rc = 6 ] && grep -q "self-test failed" "$W/ftz_run.txt" && echo "negative control: refused, exit 6 (good)" \
            || fail "the -ftz=true build was not refused (rc $rc)"
        BFS_TEST_GPTOSS_ITEMS=1 BFS_TEST_CUDA_QUICK=1 run 120 build-ftz/tests/test_cuda > "$W/ftz_test.txt" 2>&1 \
            && fail "test_cuda passed on the -ftz=true build" || echo "test_cuda on the -ftz=true build: fails (good)"
    elif [ $ok = 1 ]; then skip "running the -ftz=true build (it built)"; fi
    rm -rf build-ftz "$W/ftz"
    echo "-- the same refusal on the emulated runtime (FPU in flush-to-zero mode):"
    BFS_EMU_FTZ=1 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/ftz" --device cuda --quiet; rc=$?
    [ $rc = 6 ] && echo "emulated -ftz: exit 6 (good)" || fail "emulated -ftz run: rc $rc, want 6"
    rm -rf "$W/ftz"
else echo "SKIP (no nvcc): negative control"; fi

step "9 error messages (driver/device checks: issue 14 item 2; a device fault: item 6)"
e() { echo "\$ $*"; "$@" >/dev/null; echo "  -> exit $?"; }
e build/bfshard convert fixtures/mxfp4-tiny "$W/e" --device auto --force
env CUDA_VISIBLE_DEVICES= build/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda --quiet --force; echo "  -> exit $? (CUDA_VISIBLE_DEVICES= --device cuda)"
build/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda:7 --quiet --force; echo "  -> exit $? (--device cuda:7)"
if [ $GPU = 1 ]; then
    build/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda --gpu-mem 100000G --quiet --force; echo "  -> exit $? (--gpu-mem beyond the GPU)"
fi
if [ -x build/cuda-emu/bfshard ]; then
    echo "-- on the emulated runtime (what a real machine in that state prints):"
    BFS_EMU_DRIVER=0 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda --quiet --force; echo "  -> exit $? (no driver)"
    BFS_EMU_DRIVER=12040 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda --quiet --force; echo "  -> exit $? (driver 12.4)"
    BFS_EMU_DRIVER=12040 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device auto --force 2>&1 >/dev/null | grep -i "device auto"
    BFS_EMU_DEVICES=2 BFS_EMU_BUSY=1 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda:0 --quiet --force; echo "  -> exit $? (GPU 0 busy / exclusive)"
    BFS_EMU_DEVICES=2 BFS_EMU_BUSY=1 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda:1 --quiet --force; echo "  -> exit $? (cuda:1 while GPU 0 is busy)"
    BFS_EMU_CC=70 build/cuda-emu/bfshard convert fixtures/mxfp4-tiny "$W/e" --device cuda --quiet --force; echo "  -> exit $? (a 7.0 GPU)"
    grep -h "GPU faulted" "$W/emu.txt" "$W"/test_cuda*.txt 2>/dev/null | head -1 || true
    BFS_EMU_DEVICES=2 BFS_TEST_GPTOSS_ITEMS=1 build/cuda-emu/test_cuda 2>/dev/null | grep -m1 "GPU faulted"
fi
rm -rf "$W/e"

step "10 I/O: dd floors (1 and $(nproc) writers) on tmpfs and on the disk, then convert --device cuda and cpu to both"
if [ "${IO:-1}" = 1 ]; then
    # every command in it runs under its own timeout (IO_TIMEOUT); its output joins this report
    OUT="$W/io" IO_REPORT= bash dev/cuda/io-check.sh || fail "the I/O step (dev/cuda/io-check.sh)"
else echo "SKIP: the I/O step (IO=0)"; fi

step "11 bfshard.torch.load into CUDA shards: bit for bit vs a CPU load (fixtures, W=1 and 2, .zst only, a tiny ring), GB/s vs pinned H2D / read / safetensors, peak host memory"
if [ "${LOAD:-1}" != 1 ]; then echo "SKIP: the load step (LOAD=0)"
elif [ $GPU = 1 ] && python3 -c 'import torch, safetensors, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
    # fastsafetensors is not installed there (no network; its wheel could be carried): not compared
    run "${LOAD_TIMEOUT:-600}" python3 dev/cuda/load-check.py --build build > "$W/load.txt" 2>&1; rc=$?
    cat "$W/load.txt"
    [ $rc = 0 ] || fail "bfshard.torch.load into CUDA (rc $rc; $W/load.txt)"
elif [ $GPU = 1 ]; then echo "SKIP: python3 with torch (CUDA), safetensors and numpy not importable: no load step"
else skip "bfshard.torch.load into CUDA shards (python3 dev/cuda/load-check.py --dry-run checks the script on the CPU)"; fi

step "summary: the GPU pipeline"
# --gpu-mem in MiB (K/M/G suffixes)
gm_mib=$(echo "$GPU_MEM" | awk '{ v = $1 + 0; u = toupper(substr($1, length($1))); if (u == "K") v /= 1024; else if (u == "G") v *= 1024; else if (u != "M") v /= 1048576; printf "%d", v }')
# MXFP4 reads 17 bytes per 64 written: the memory traffic is 1.27x the output
echo "kernel alone:      ${KERNEL_GBS:-?} GB/s of BF16 output (HBM ~ $HBM TB/s$( [ -n "${KERNEL_GBS:-}" ] && [ "$HBM" != unknown ] && awk -v b="$KERNEL_GBS" -v h="$HBM" 'BEGIN { printf "; reads + writes: %.0f%% of it", 100 * 1.27 * b / (h * 1000) }'))"
echo "end to end, cuda:  ${GBS_cuda2:-?} GB/s, ${WALL_cuda2:-?} s wall (2 gpt-oss layers, W=8)"
echo "end to end, cpu:   ${GBS_cpu2:-?} GB/s, ${WALL_cpu2:-?} s wall$( [ -n "${WALL_cuda2:-}" ] && [ -n "${WALL_cpu2:-}" ] && awk -v a="$WALL_cpu2" -v b="$WALL_cuda2" 'BEGIN { if (b > 0) printf "  -> cuda is %.2fx the cpu backend", a / b }')"
echo "transformers:      ${TF_GBS:-?} GB/s (convert_moe_packed_tensors, device to device, no I/O)$( [ -n "${TF_GBS:-}" ] && [ -n "${GBS_cuda2:-}" ] && awk -v a="$GBS_cuda2" -v b="$TF_GBS" 'BEGIN { if (b > 0) printf "  -> bfshard end to end at %.2fx it", a / b }')"
for l in cuda2 cuda_big; do
    eval "p=\${PEAK_$l:-}"
    [ -n "$p" ] || continue
    # the CUDA context itself takes a few hundred MiB besides the backend's buffers
    echo "peak device memory, $l: +$p MiB (nvidia-smi) vs --gpu-mem $GPU_MEM = $gm_mib MiB (+ the context)"
    [ "$p" -le $((gm_mib + 1024)) ] || fail "peak device memory of $l: $p MiB, more than --gpu-mem ($gm_mib MiB) + 1 GiB of context"
done
[ -f "$W/io/io-summary.txt" ] && sed 's/^/I\/O, GB\/s: /' "$W/io/io-summary.txt"
[ -f "$W/load.txt" ] && sed -n 's/^SUMMARY //p' "$W/load.txt"
[ -n "${PEAK_cuda2:-}" ] && [ -n "${PEAK_cuda_big:-}" ] && [ "$PEAK_cuda_big" -gt $((PEAK_cuda2 + 256)) ] && \
    fail "peak device memory grew with the input: $PEAK_cuda2 MiB (2 layers) -> $PEAK_cuda_big MiB ($BIG_LAYERS layers)"

step "done: $FAILS failure(s); report: $REPORT"
[ "${KEEP:-0}" = 1 ] || rm -rf "$W/syn2" "$W/synbig"
exit $(( FAILS > 0 ))
