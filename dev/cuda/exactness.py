#!/usr/bin/env python3
"""What the GPU would run, checked without one: every dequant kernel, compiled as
the build compiles it, for every architecture the build targets, computes exactly.

  PTX (nvcc -ptx per architecture, the build's flags): no fused multiply-add on floats
      (fma.* / mad.* on f16, bf16, f32, f64), no .ftz, no .approx, no div.full.
  SASS (cuobjdump -sass of the build's own objects, per architecture of the fatbin):
      no FFMA / DFMA / FFMA32I; HFMA2 only as the compiler's constant move
      (HFMA2 Rd, -RZ, RZ, imm, imm: -0 * 0 + imm); no .FTZ but F2I.FTZ.U32.TRUNC, and no
      MUFU but MUFU.RCP, both only inside the integer-division idiom (I2F.U32.RP /
      I2F.U64.RP, MUFU.RCP, IADD 0xffffffe, F2I...TRUNC: exact integer arithmetic).
      No kernel divides floats: NVFP4's block scale divide is done on the host by the
      reference function into a table (backend_cuda_pipe.c), so no kernel needs ptxas's
      correctly rounded div.rn.f32 expansion, whose FFMA and .FTZ would be fine but could
      not be told apart from a real contraction here.
  Negative controls first: a probe kernel (a * b + c) built with --fmad=true, and the NVFP4
      kernel built with -ftz=true, must each be caught; the probe built with the build's
      flags must pass.

Usage: exactness.py --build BUILD --nvcc NVCC --archs "75 80 90" --flags "NVCC FLAGS" KERNEL.cu...
cuobjdump (and the nvdisasm it runs): from PATH, beside nvcc, or the NVIDIA PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm fetched into BUILD/nvtools once (the toolkit here has no cuobjdump); without it the SASS half is
skipped, loudly. Exit 0: exact; 1: a finding (each printed with its kernel, arch and
instruction); 2: the check itself could not run.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

PTX_BAD = [
    (re.compile(r'\b(fma|mad)(\.[a-z0-9]+)*\.(f16|f16x2|bf16|bf16x2|f32|f64)\b'), 'fused multiply-add on floats'),
    (re.compile(r'\.ftz\b'), 'flush to zero'),
    (re.compile(r'\.approx\b'), 'approximate arithmetic'),
    (re.compile(r'\bdiv\.full\b'), 'approximate divide'),
]
SASS_INSN = re.compile(r'/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);')


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def find_cuobjdump(build, nvcc):
    for c in (shutil.which('cuobjdump'), os.path.join(os.path.dirname(nvcc), 'cuobjdump')):
        if c and os.access(c, os.X_OK):
            return c
    tools = os.path.join(build, 'nvtools')
    got = glob.glob(os.path.join(tools, 'nvidia', '*', 'bin', 'cuobjdump'))
    if not got:
        os.makedirs(tools, exist_ok=True)
        try:
            subprocess.run([sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps', '--dest', tools,
                            'nvidia-cuda-cuobjdump', 'nvidia-cuda-nvdisasm'], check=True, capture_output=True,
                           timeout=300)
            import zipfile
            for whl in glob.glob(os.path.join(tools, 'nvidia_cuda_*.whl')):
                zipfile.ZipFile(whl).extractall(tools)
        except (subprocess.SubprocessError, OSError) as e:
            print(f'exactness: cannot fetch nvidia-cuda-cuobjdump from PyPI ({e})')
        got = glob.glob(os.path.join(tools, 'nvidia', '*', 'bin', 'cuobjdump'))
    if got:
        bindir = os.path.dirname(got[0])
        for f in os.listdir(bindir):  # cuobjdump -sass runs nvdisasm, beside it
            os.chmod(os.path.join(bindir, f), 0o755)
        os.environ['PATH'] = bindir + os.pathsep + os.environ.get('PATH', '')
        return got[0]
    return None


def ptx_findings(text, what):
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split('//', 1)[0]
        for rx, why in PTX_BAD:
            if rx.search(code):
                out.append(f'{what}: PTX line {n}: {why}: {code.strip()}')
    return out


def sass_findings(text, what):
    """Findings in cuobjdump -sass output, per function."""
    out, func, insns = [], '?', []

    def judge():
        for i, (op, args) in enumerate(insns):
            near_after = ' '.join(o + ' ' + a for o, a in insns[i + 1:i + 4])
            near_before = ' '.join(o for o, _ in insns[max(0, i - 4):i])
            bad = None
            if op.startswith(('FFMA', 'DFMA')):
                bad = 'fused multiply-add on floats'
            elif op.startswith('HFMA2') and not re.match(r'\s*\w+,\s*-RZ,\s*RZ,', args):
                bad = 'fused multiply-add on half floats'
            elif '.FTZ' in op and not op.startswith('F2I.FTZ.U32.TRUNC'):
                bad = 'flush to zero'
            elif op.startswith('MUFU.') and not (op == 'MUFU.RCP' and (
                    '0xffffffe' in near_after or re.search(r'I2F\.(U32\.|U64\.)?RP', near_before))):
                bad = 'special-function unit outside the integer-division idiom'
            if bad:
                out.append(f'{what}: {func}: {bad}: {op} {args.strip()}')

    for line in text.splitlines():
        m = re.search(r'Function\s*:\s*(\S+)', line)
        if m:
            judge()
            func, insns = m.group(1), []
            continue
        m = SASS_INSN.search(line)
        if m:
            insns.append((m.group(1), m.group(2)))
    judge()
    return out


def ptx_of(nvcc, flags, arch, src, extra=()):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, 'k.ptx')
        run([nvcc, *flags, *extra, f'-arch=compute_{arch}', '-ptx', src, '-o', p])
        with open(p) as f:
            return f.read()


def sass_of_obj(cuobjdump, obj, arch):
    return run([cuobjdump, '-sass', '-arch', f'sm_{arch}', obj])


def sass_of_src(nvcc, cuobjdump, flags, arch, src, extra=()):
    with tempfile.TemporaryDirectory() as d:
        o = os.path.join(d, 'k.cubin')
        run([nvcc, *flags, *extra, f'-arch=sm_{arch}', '-cubin', src, '-o', o])
        return run([cuobjdump, '-sass', o])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', required=True)
    ap.add_argument('--nvcc', required=True)
    ap.add_argument('--archs', required=True)
    ap.add_argument('--flags', required=True, help="nvcc's flags without -gencode")
    ap.add_argument('kernels', nargs='+')
    a = ap.parse_args()
    flags = a.flags.split()
    archs = a.archs.split()
    here = os.path.dirname(os.path.abspath(__file__))
    probe = os.path.join(here, 'exact_probe.cu')
    cuobjdump = find_cuobjdump(a.build, a.nvcc)
    if not cuobjdump:
        print('exactness: SKIP the SASS half: no cuobjdump (not in the toolkit, and the '
              'nvidia-cuda-cuobjdump wheel could not be fetched); the PTX half still runs')
    failed = False
    try:
        # negative controls: the check must see what it exists to see
        arch = archs[-1]
        controls = [('the probe (a * b + c) with --fmad=true', probe, ['--fmad=true'], True),
                    ('the NVFP4 kernel with -ftz=true', a.kernels[0] if not any('nvfp4' in k for k in a.kernels)
                     else [k for k in a.kernels if 'nvfp4' in k][0], ['-ftz=true'], True),
                    ('the probe with the build\'s flags', probe, [], False)]
        for name, src, extra, want_found in controls:
            found = ptx_findings(ptx_of(a.nvcc, flags, arch, src, extra), name)
            if cuobjdump:
                found += sass_findings(sass_of_src(a.nvcc, cuobjdump, flags, arch, src, extra), name)
            ok = bool(found) == want_found
            print(f'exactness: control {"ok  " if ok else "FAIL"} {name}: '
                  f'{len(found)} finding(s), {"wanted some" if want_found else "wanted none"}')
            if not ok:
                failed = True
                for f in found[:10]:
                    print('  ' + f)
        # the kernels as built
        n = 0
        for src in a.kernels:
            obj = os.path.join(a.build, src[:-3] + '.cu.o')
            for arch in archs:
                found = ptx_findings(ptx_of(a.nvcc, flags, arch, src), f'{src} compute_{arch}')
                if cuobjdump:
                    found += sass_findings(sass_of_obj(cuobjdump, obj, arch), f'{src} sm_{arch}')
                for f in found:
                    print('exactness: ' + f)
                failed = failed or bool(found)
                n += 1
        print(f'exactness: {len(a.kernels)} kernel files x {len(archs)} architectures '
              f'(PTX{" and SASS" if cuobjdump else " only"}): {"FAILED" if failed else "exact"}')
    except subprocess.CalledProcessError as e:
        print(f'exactness: cannot run {" ".join(e.cmd)}: {e.stderr.strip()[:2000]}')
        return 2
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
