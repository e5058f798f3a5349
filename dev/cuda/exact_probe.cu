/* The exactness check's probe (dev/cuda/exactness.py): a multiply then an add, which a
 * build with --fmad=true contracts into one FFMA (caught), and the build's own flags keep
 * apart (FMUL, FADD: passes). Not part of bfshard. */
extern "C" __global__ void bfs_exact_probe(const float *a, const float *b, const float *c, float *out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = a[i] * b[i] + c[i];
}
