/*
 * Fuzz target: the input set readers -- model.safetensors.index.json,
 * config.json and the directory of .safetensors files -- through
 * bfs__input_open on a scratch directory built from the input, then the plan.
 *
 * Input: byte 0 flags, byte 1 options (fz_opts_from_byte), then parts
 * separated by FZ_SEP:
 *   part 0  model.safetensors.index.json   (written when flags bit 0)
 *   part 1  config.json                    (written when flags bit 1)
 *   part 2+ model-0000k-of-00003.safetensors, k = 1..3 (flags bits 2-3: how many)
 * flags bit 4: open the first .safetensors file instead of the directory.
 */
#include "fuzz_common.h"

#include <stdio.h>
#include <string.h>

#define FZ_SEP "\n--bfs--\n"
#define FZ_MAXPARTS 5

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const uint8_t flags = data[0];
    const fz_opts o = fz_opts_from_byte(data[1]);
    const uint8_t *part[FZ_MAXPARTS] = {0};
    size_t plen[FZ_MAXPARTS] = {0};
    int np = 0;
    const uint8_t *p = data + 2, *end = data + size;
    const size_t sl = strlen(FZ_SEP);
    while (np < FZ_MAXPARTS) {
        const uint8_t *s = memmem(p, (size_t)(end - p), FZ_SEP, sl);
        part[np] = p;
        plen[np] = s ? (size_t)(s - p) : (size_t)(end - p);
        np++;
        if (!s)
            break;
        p = s + sl;
    }
    fz_clean();
    const char *dir = fz_dir();
    char path[512], first[512] = "";
    if ((flags & 1) && np > 0) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        fz_write(path, part[0], plen[0]);
    }
    if ((flags & 2) && np > 1) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        fz_write(path, part[1], plen[1]);
    }
    const int nst = (flags >> 2) & 3;
    for (int k = 0; k < nst && 2 + k < np; k++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-00003.safetensors", dir, k + 1);
        fz_write(path, part[2 + k], plen[2 + k]);
        if (!first[0])
            snprintf(first, sizeof first, "%s", path);
    }
    fz_open_and_exercise((flags & 16) && first[0] ? first : dir, &o);
    return 0;
}
