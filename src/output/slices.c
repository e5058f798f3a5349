/*
 * A weights file's slice index, NAME.slices (slices.h; the byte layout is docs/MANIFEST.md):
 * built from the plan and the writer's piece hashes, written durably beside its weights
 * file, and read back by verify to narrow a weights file that does not match down to the
 * tensors that differ. All integers little-endian; hashes XXH3-128 in canonical (big-endian)
 * byte order, the bytes xxh128sum prints as hex.
 *
 *   0   8  "BFSLICES"
 *   8   4  format version (1)          12  4  0
 *   16  8  data_start: bytes [0, data_start) of the weights file are its header
 *   24  16 XXH3-128 of those bytes
 *   40  8  count: the tensor slices the file holds
 *   48  16 x count: XXH3-128 of each slice's bytes, in the order of (offset, end)
 */
#include "output/slices.h"
#include "output/durable.h"
#include "output/manifest.h"
#include "base/bfs_io.h"
#include "input/safetensors.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void bfs__put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t bfs__get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

uint64_t bfs__slices_size(uint64_t npieces)
{
    return npieces > (UINT64_MAX - BFS_SLICES_HDR) / 16 ? UINT64_MAX : BFS_SLICES_HDR + 16 * npieces;
}

int bfs__slices_name(const char *weights, char *out, size_t cap)
{
    const size_t n = strlen(weights), k = strlen(".safetensors");
    const size_t stem = n > k && !strcmp(weights + n - k, ".safetensors") ? n - k : n;
    if (stem + sizeof BFS_SLICES_EXT > cap)
        return bfs__err(BFS_EINTERNAL, "%s: name too long for its slice index", weights);
    memcpy(out, weights, stem);
    memcpy(out + stem, BFS_SLICES_EXT, sizeof BFS_SLICES_EXT);
    return 0;
}

/* pieces in (offset, end) order: the order narrowing sorts the header's tensors in */
typedef struct {
    uint64_t a, b;
    size_t i;
} bfs_span;

static int bfs__span_cmp(const void *x, const void *y)
{
    const bfs_span *p = x, *q = y;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    if (p->b != q->b)
        return p->b < q->b ? -1 : 1;
    return p->i < q->i ? -1 : p->i > q->i;
}

int bfs__slices_write(int dirfd, const char *outdir, const bfs_plan *p, int f, const bfs_dig16 *piece_dig,
                      const char *hdr_hex, bool shared, char hex[33], char *sha)
{
    int rc = 0;
    const bfs_outfile *of = &p->files[f];
    const uint64_t len = bfs__slices_size(of->npieces);
    uint8_t *buf = NULL, prefix[8];
    char *text = NULL, name[NAME_MAX + 1];
    bfs_span *sp = NULL;
    XXH3_state_t *st = XXH3_createState();
    BFS_TRY(bfs__slices_name(of->name, name, sizeof name));
    if (!st || len > SIZE_MAX || !(buf = calloc(1, (size_t)len)) ||
        !(sp = malloc((of->npieces ? of->npieces : 1) * sizeof *sp)))
        BFS_FAIL(BFS_ENOMEM, "out of memory building %s", name);
    if (hdr_hex) {
        if (!bfs__hex16_parse(hdr_hex, buf + 24))
            BFS_FAIL(BFS_EINTERNAL, "%s: no header hash", of->name);
    } else {
        BFS_TRY(bfs__plan_header(p, of, &text));
        bfs__st_put_len(prefix, of->data_start - 8);
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, prefix, 8);
        XXH3_128bits_update(st, text, (size_t)(of->data_start - 8));
        XXH128_canonical_t hc;
        XXH128_canonicalFromHash(&hc, XXH3_128bits_digest(st));
        memcpy(buf + 24, hc.digest, 16);
    }
    memcpy(buf, BFS_SLICES_MAGIC, 8);
    buf[8] = (uint8_t)BFS_SLICES_VERSION;
    bfs__put_u64(buf + 16, of->data_start);
    bfs__put_u64(buf + 40, of->npieces);
    bool sorted = true; /* a file's pieces are in file order: sorted already */
    for (size_t i = 0; i < of->npieces; i++) {
        sp[i] = (bfs_span){of->pieces[i].offset, of->pieces[i].offset + of->pieces[i].nbytes, i};
        if (i > 0 && bfs__span_cmp(&sp[i - 1], &sp[i]) > 0)
            sorted = false;
    }
    if (!sorted)
        qsort(sp, of->npieces, sizeof *sp, bfs__span_cmp);
    for (size_t k = 0; k < of->npieces; k++) {
        if (!piece_dig[sp[k].i].set)
            BFS_FAIL(BFS_EINTERNAL, "%s: piece %zu has no hash", of->name, sp[k].i);
        memcpy(buf + BFS_SLICES_HDR + 16 * k, piece_dig[sp[k].i].b, 16);
    }
    BFS_TRY(bfs__write_durable_shared(dirfd, outdir, name, buf, (size_t)len, shared));
    bfs__hash_hex(XXH3_128bits(buf, (size_t)len), hex);
    if (sha)
        BFS_TRY(bfs__sha256_buf(buf, (size_t)len, sha));
cleanup:
    XXH3_freeState(st);
    free(text);
    free(sp);
    free(buf);
    return rc;
}

static int bfs__st_cmp(const void *x, const void *y)
{
    const bfs_st_tensor *p = x, *q = y;
    if (p->begin != q->begin)
        return p->begin < q->begin ? -1 : 1;
    return p->end < q->end ? -1 : p->end > q->end;
}

/* the header's tensors against the index's hashes: the number reported */
static int bfs__slices_cmp(const bfs_st_header *h, const uint8_t *ix, const char *path, FILE *report,
                           bfs_slices_hash_fn hash, void *user, bool report_read_errors)
{
    int bad = 0;
    char ep[BFS_ESC_MAX], et[BFS_ESC_MAX], got[33], want[33];
    for (size_t i = 0; i < h->n; i++) {
        const uint64_t off = h->data_start + h->t[i].begin, nb = h->t[i].end - h->t[i].begin;
        bfs__hex16_str(ix + BFS_SLICES_HDR + 16 * i, want);
        if (hash(user, off, nb, got) < 0) {
            if (report_read_errors) {
                bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu): %s", bfs__esc(path, ep, sizeof ep),
                            bfs__esc(h->t[i].name, et, sizeof et), (unsigned long long)off,
                            (unsigned long long)(off + nb), bfs_last_error());
                bfs__err_clear();
            }
            continue;
        }
        if (strcmp(got, want) != 0) {
            bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu) (hash %s, manifest %s)",
                        bfs__esc(path, ep, sizeof ep), bfs__esc(h->t[i].name, et, sizeof et), (unsigned long long)off,
                        (unsigned long long)(off + nb), got, want);
            bad++;
        }
    }
    return bad;
}

int bfs__slices_narrow(const uint8_t *ix, size_t ixlen, const char *ixname, const char *path, uint64_t size,
                       FILE *report, bfs_slices_read_fn rd, bfs_slices_hash_fn hash, void *user,
                       bool report_read_errors, uint64_t *data_start)
{
    int rc = 0;
    uint8_t *hb = NULL;
    bfs_st_header h = {0};
    char got[33], want[33], ep[BFS_ESC_MAX], en[BFS_ESC_MAX]; /* en: ixname, from the manifest */
    *data_start = size;
    bfs__esc(ixname, en, sizeof en);
    if (ixlen < BFS_SLICES_HDR || memcmp(ix, BFS_SLICES_MAGIC, 8) != 0 || bfs__get_u64(ix + 8) != BFS_SLICES_VERSION)
        return bfs__err(BFS_EINPUT, "%s: not a bfshard slice index (version %u)", en, BFS_SLICES_VERSION);
    const uint64_t ds = bfs__get_u64(ix + 16), count = bfs__get_u64(ix + 40);
    if (bfs__slices_size(count) != ixlen || ds < 8 || ds > size || ds - 8 > BFS_ST_MAX_HEADER)
        return bfs__err(BFS_EINPUT, "%s: malformed slice index (%llu slices in %zu bytes, header of %llu bytes)",
                        en, (unsigned long long)count, ixlen, (unsigned long long)ds);
    *data_start = ds;
    bfs__hex16_str(ix + 24, want);
    if (hash(user, 0, ds, got) < 0) {
        bfs__err_clear();
        return 0; /* the caller names the header */
    }
    if (strcmp(got, want) != 0)
        return 0; /* the header itself differs: its offsets cannot be trusted */
    if (!(hb = malloc((size_t)ds)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    bfs__err_clear();
    if (rd(user, 0, ds, hb) < 0 || bfs__st_parse(hb, size, path, &h) < 0 || h.data_start != ds || h.n != count) {
        bfs__report(report, "%s: its header matches %s but does not list its %llu slices: not narrowed (%s)",
                    bfs__esc(path, ep, sizeof ep), en, (unsigned long long)count,
                    bfs_last_error()[0] ? bfs_last_error() : "a different count");
        bfs__err_clear();
        goto cleanup;
    }
    qsort(h.t, h.n, sizeof *h.t, bfs__st_cmp);
    rc = bfs__slices_cmp(&h, ix, path, report, hash, user, report_read_errors);
cleanup:
    bfs__st_header_free(&h);
    free(hb);
    return rc;
}
