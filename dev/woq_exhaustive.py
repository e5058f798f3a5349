#!/usr/bin/env python3
"""Exhaustive check of the GPTQ / AWQ / bitsandbytes 8-bit value rules (kernels/ref_woq.h) against torch:
every float16 scale (all 65536 bit patterns) times every code difference q - z in
[-255, 255], as GPTQModel computes it (scales * (int8/int16 tensor) in float16, then
.to(torch.bfloat16)), and bitsandbytes' int8_vectorwise_dequant (A * SCB * 7.874015718698502e-3
in float32, then bf16) for every int8 code against 2^16 SCB values (random float32 bit patterns,
plus 0, -0, inf, NaN, subnormals, the largest). Needs torch and a C compiler:

    /work/iv/bin/python dev/woq_exhaustive.py      # "2 passed, 0 failed"
"""
import os, subprocess, sys, tempfile
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = r'''
#include "ref_woq.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "wb"); FILE *g = fopen(argv[2], "rb"); FILE *h = fopen(argv[3], "wb");
    uint16_t *row = malloc(511 * 2);
    for (uint32_t s = 0; s < 65536; s++) {
        const uint16_t sh = (uint16_t)s;
        for (int d = -255; d <= 255; d++) row[d + 255] = bfs_woq_value((const uint8_t *)&sh, 0, BFS_WOQ_F16, d);
        fwrite(row, 2, 511, f);
    }
    float scb; uint16_t out[256];
    while (fread(&scb, 4, 1, g) == 1) {
        for (int q = -128; q < 128; q++) out[q + 128] = bfs_bnb8_value(q, scb);
        fwrite(out, 2, 256, h);
    }
    fclose(f); fclose(h); return 0;
}
'''

def bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).ravel()

def same(a, b):
    nan = ((a & 0x7FFF) > 0x7F80) & ((b & 0x7FFF) > 0x7F80)
    return int(((a != b) & ~nan).sum())

def main():
    d = tempfile.mkdtemp()
    src, exe = os.path.join(d, "x.c"), os.path.join(d, "x")
    open(src, "w").write(C)
    subprocess.check_call(["cc", "-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-I" + os.path.join(ROOT, "kernels"), src, "-o", exe])
    rng = np.random.default_rng(38)
    scb = rng.integers(0, 2**32, 65536, dtype=np.uint64).astype(np.uint32)
    scb[:8] = [0, 0x80000000, 0x7F800000, 0x7FC00000, 1, 0x007FFFFF, 0x7F7FFFFF, 0x42FE0000]
    scb.view(np.float32).tofile(os.path.join(d, "scb"))
    subprocess.check_call([exe, os.path.join(d, "f16"), os.path.join(d, "scb"), os.path.join(d, "b8")])
    ok = fail = 0
    s = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)[:, None]
    diff = torch.arange(-255, 256, dtype=torch.int16)[None, :]
    want = bits((s * diff).to(torch.bfloat16))
    n = same(np.fromfile(os.path.join(d, "f16"), dtype=np.uint16), want)
    print(f"fp16 rule: {n} of {want.size} differ"); ok, fail = ok + (n == 0), fail + (n != 0)
    A = torch.arange(-128, 128, dtype=torch.int8)[None, :].expand(65536, 256).contiguous()
    st = torch.from_numpy(scb.view(np.float32).copy())
    want = bits((A * st.view(-1, 1) * 7.874015718698502e-3).to(torch.bfloat16))
    n = same(np.fromfile(os.path.join(d, "b8"), dtype=np.uint16), want)
    print(f"bnb 8-bit rule: {n} of {want.size} differ"); ok, fail = ok + (n == 0), fail + (n != 0)
    print(f"{ok} passed, {fail} failed")
    return 1 if fail else 0

if __name__ == "__main__":
    sys.exit(main())
