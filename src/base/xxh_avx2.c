/*
 * XXH3-128 streaming update with the AVX2 accumulate loop (built with -mavx2; called only
 * where the CPU has AVX2: bfs__xxh128_update in io.c). The shared libxxhash is built for
 * baseline x86-64 (SSE2); this is the same xxhash.h code with XXH_VECTOR = AVX2, inlined:
 * the same digests (XXH3 is defined independently of the vector width), about 1.3x the rate
 * from memory and 1.7x from cache here. Every hash bfshard computes over tensor bytes goes
 * through it: the writer's file and piece hashes, the source hashes, verify, the loader's
 * hashing reads. `state` is a libxxhash XXH3_state_t (made and reset by it); its layout is
 * the header's.
 */
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

void bfs__xxh3_128_update_avx2(void *state, const void *p, size_t n);

void bfs__xxh3_128_update_avx2(void *state, const void *p, size_t n)
{
    XXH3_128bits_update((XXH3_state_t *)state, p, n);
}
