/*
 * Compressed artifacts: the seekable zstd reader (format: zst_format.h). It reads
 * through a bfs_src (a file, or bytes in memory for the fuzzer), validates the seek
 * table and the byte-group map on open, and decodes only the frames a range needs,
 * checking each frame's size and checksum. Nothing read from the source is trusted.
 */
#include "zst/zst.h"
#include "base/bfs_io.h"
#include "input/safetensors.h"
#include "zst/zst.h"
#include "zst/zst_format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

#define BFS_ZST_IN_CHUNK (1u << 20)
#define BFS_ZST_UNGROUP_PIECE (64u << 10) /* a byte-grouped frame is restored this much at a time */
#define BFS_ZST_WHOLE_MAX (64u << 20)     /* a frame's compressed bytes up to this are read whole and
                                           * decoded in one call into a buffer of its size */

struct bfs_zst_reader {
    bfs_src src;
    char *what;
    uint32_t n;
    uint64_t *coff, *doff; /* n + 1 each: where frame k starts, compressed and uncompressed */
    uint32_t *dsize, *xxh;  /* xxh NULL when the table has no checksums */
    uint8_t *grouped;       /* BYTEGROUP: one byte per frame */
    int mode;
    bfs_zst_dec dec;        /* the single-threaded calls' decoder */
    uint64_t table_bytes;
};

void bfs__zst_dec_free(bfs_zst_dec *d)
{
    ZSTD_freeDCtx(d->dctx);
    free(d->inbuf);
    free(d->outbuf);
    free(d->gbuf);
    free(d->gtmp);
    free(d->cbuf);
    memset(d, 0, sizeof *d);
}

int bfs__zst_dec_init(bfs_zst_dec *d)
{
    memset(d, 0, sizeof *d);
    d->dctx = ZSTD_createDCtx();
    d->outcap = ZSTD_DStreamOutSize();
    d->inbuf = malloc(BFS_ZST_IN_CHUNK);
    d->outbuf = malloc(d->outcap);
    d->gtmp = malloc(BFS_ZST_UNGROUP_PIECE);
    if (!d->dctx || !d->inbuf || !d->outbuf || !d->gtmp) {
        bfs__zst_dec_free(d);
        return bfs__err(BFS_ENOMEM, "out of memory for a zstd decoder");
    }
    ZSTD_DCtx_setParameter(d->dctx, ZSTD_d_windowLogMax, 27);
    return 0;
}

void bfs__zst_reader_free(bfs_zst_reader *r)
{
    if (!r)
        return;
    if (r->src.close)
        r->src.close(&r->src);
    bfs__zst_dec_free(&r->dec);
    free(r->what);
    free(r->coff);
    free(r->doff);
    free(r->dsize);
    free(r->xxh);
    free(r->grouped);
    free(r);
}

static int bfs__zst_pread(const bfs_zst_reader *r, bfs_zst_dec *d, void *buf, size_t len, uint64_t off)
{
    const int rc = r->src.pread(&r->src, buf, len, off);
    if (rc == 0)
        d->bytes_read += len;
    return rc;
}

static int bfs__zst_parse_table(bfs_zst_reader *r)
{
    int rc = 0;
    uint8_t *t = NULL;
    const char *what = r->what;
    const uint64_t fs = r->src.size;
    if (fs < 8 + BFS_ZST_FOOTER)
        return bfs__err(BFS_EINPUT, "%s: %llu bytes, too short for a seekable zstd file (no seek table; truncated?)", what,
                        (unsigned long long)fs);
    bfs_zst_seek_footer foot;
    BFS_TRY(r->src.pread(&r->src, &foot, sizeof foot, fs - BFS_ZST_FOOTER));
    const uint32_t n = bfs__rd32(foot.nframes), magic = bfs__rd32(foot.magic);
    const uint8_t desc = foot.desc;
    if (magic != BFS_ZST_SEEK_MAGIC)
        BFS_FAIL(BFS_EINPUT, "%s: no seek table: last 4 bytes (offset %llu) are 0x%08x, not the seekable magic 0x%08x (not made by bfshard compress, or truncated)",
                 what, (unsigned long long)(fs - 4), magic, BFS_ZST_SEEK_MAGIC);
    if (desc & BFS_ZST_SEEK_RESERVED)
        BFS_FAIL(BFS_EINPUT, "%s: seek table descriptor 0x%02x at offset %llu has reserved bits set (a newer format?)", what,
                 desc, (unsigned long long)(fs - 5));
    if (n > BFS_ZST_MAX_FRAMES)
        BFS_FAIL(BFS_EINPUT, "%s: seek table claims %u frames at offset %llu, more than the format's %u", what, n,
                 (unsigned long long)(fs - 9), BFS_ZST_MAX_FRAMES);
    const uint64_t es = (desc & BFS_ZST_SEEK_CHECKSUMS) ? sizeof(bfs_zst_seek_entry) : offsetof(bfs_zst_seek_entry, xxh);
    const uint64_t hs = sizeof(bfs_zst_skip_hdr);
    const uint64_t tl = hs + es * n + BFS_ZST_FOOTER; /* the whole skippable frame; no overflow: n <= 2^27 */
    if (tl > fs)
        BFS_FAIL(BFS_EINPUT, "%s: seek table of %u frames needs %llu bytes but the file has %llu (truncated or corrupt)", what,
                 n, (unsigned long long)tl, (unsigned long long)fs);
    t = malloc((size_t)tl);
    if (!t)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory for a %llu-byte seek table", what, (unsigned long long)tl);
    const uint64_t ts = fs - tl;
    BFS_TRY(r->src.pread(&r->src, t, (size_t)tl, ts));
    r->table_bytes = tl;
    const bfs_zst_skip_hdr *sh = (const bfs_zst_skip_hdr *)t;
    if (bfs__rd32(sh->magic) != BFS_ZST_SKIP_MAGIC)
        BFS_FAIL(BFS_EINPUT, "%s: seek table at offset %llu starts with 0x%08x, not the skippable-frame magic 0x%08x", what,
                 (unsigned long long)ts, bfs__rd32(sh->magic), BFS_ZST_SKIP_MAGIC);
    if (bfs__rd32(sh->size) != tl - hs)
        BFS_FAIL(BFS_EINPUT, "%s: seek table frame size %u at offset %llu, but %u frames need %llu", what,
                 bfs__rd32(sh->size), (unsigned long long)(ts + offsetof(bfs_zst_skip_hdr, size)), n,
                 (unsigned long long)(tl - hs));
    r->n = n;
    r->coff = malloc(((size_t)n + 1) * sizeof *r->coff);
    r->doff = malloc(((size_t)n + 1) * sizeof *r->doff);
    r->dsize = malloc(((size_t)n + 1) * sizeof *r->dsize);
    if (desc & BFS_ZST_SEEK_CHECKSUMS)
        r->xxh = malloc(((size_t)n + 1) * sizeof *r->xxh);
    if (!r->coff || !r->doff || !r->dsize || (!r->xxh && (desc & BFS_ZST_SEEK_CHECKSUMS)))
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory for %u frames", what, n);
    uint64_t c = 0, d = 0;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *e = t + hs + es * k; /* a bfs_zst_seek_entry, without xxh when es is 8 */
        const uint32_t cs = bfs__rd32(e + offsetof(bfs_zst_seek_entry, csize));
        const uint32_t ds = bfs__rd32(e + offsetof(bfs_zst_seek_entry, dsize));
        const uint64_t eo = ts + hs + es * k;
        if (cs == 0)
            BFS_FAIL(BFS_EINPUT, "%s: frame %u: compressed size 0 in the seek table (offset %llu)", what, k,
                     (unsigned long long)eo);
        if (ds > BFS_ZST_MAX_DSIZE)
            BFS_FAIL(BFS_EINPUT, "%s: frame %u: decompressed size %u in the seek table (offset %llu) exceeds the format's %u",
                     what, k, ds, (unsigned long long)(eo + offsetof(bfs_zst_seek_entry, dsize)), BFS_ZST_MAX_DSIZE);
        if (cs > ts - c)
            BFS_FAIL(BFS_EINPUT, "%s: frame %u: compressed size %u (seek table offset %llu) runs past the seek table at %llu",
                     what, k, cs, (unsigned long long)eo, (unsigned long long)ts);
        r->coff[k] = c;
        r->doff[k] = d;
        r->dsize[k] = ds;
        if (r->xxh)
            r->xxh[k] = bfs__rd32(e + offsetof(bfs_zst_seek_entry, xxh));
        c += cs;
        d += ds;
    }
    r->coff[n] = c;
    r->doff[n] = d;
    if (c != ts)
        BFS_FAIL(BFS_EINPUT, "%s: the seek table's %u frames cover %llu bytes but the seek table starts at offset %llu", what,
                 n, (unsigned long long)c, (unsigned long long)ts);
cleanup:
    free(t);
    return rc;
}

/* BYTEGROUP: frame 0 is the header, the last frame the map. */
static int bfs__zst_parse_bytegroup(bfs_zst_reader *r)
{
    int rc = 0;
    uint8_t *m = NULL;
    const char *what = r->what;
    bfs_zst_bg_header hdr;
    if (r->n == 0 || r->coff[1] < sizeof hdr.magic)
        return 0; /* not ours: the zstd decoder will say what it is */
    BFS_TRY(r->src.pread(&r->src, hdr.magic, sizeof hdr.magic, 0));
    if (memcmp(hdr.magic, BFS_ZST_BG_MAGIC, sizeof hdr.magic) != 0)
        return 0;
    if (r->n < 2 || r->coff[1] != BFS_ZST_BG_HEADER || r->dsize[0] != 0)
        BFS_FAIL(BFS_EINPUT, "%s: bfshard byte-grouped file whose seek table does not start with the %u-byte header frame",
                 what, BFS_ZST_BG_HEADER);
    BFS_TRY(r->src.pread(&r->src, &hdr, sizeof hdr, 0));
    if (bfs__rd32(hdr.version) != BFS_ZST_BG_VERSION || bfs__rd32(hdr.transform) != BFS_ZST_BG_TRANSFORM)
        BFS_FAIL(BFS_EINPUT, "%s: bfshard compressed format version %u, transform %u at offset 8: this bfshard reads version %u, transform %u (upgrade bfshard)",
                 what, bfs__rd32(hdr.version), bfs__rd32(hdr.transform), BFS_ZST_BG_VERSION, BFS_ZST_BG_TRANSFORM);
    const uint32_t last = r->n - 1;
    const uint64_t msz = r->coff[r->n] - r->coff[last], want = sizeof(bfs_zst_map_hdr) + ((uint64_t)r->n + 7) / 8;
    if (r->dsize[last] != 0 || msz != want)
        BFS_FAIL(BFS_EINPUT, "%s: byte-group map (frame %u, offset %llu) is %llu bytes with decompressed size %u; expected %llu and 0",
                 what, last, (unsigned long long)r->coff[last], (unsigned long long)msz, r->dsize[last],
                 (unsigned long long)want);
    m = malloc((size_t)msz);
    r->grouped = calloc(r->n, 1);
    if (!m || !r->grouped)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory", what);
    BFS_TRY(r->src.pread(&r->src, m, (size_t)msz, r->coff[last]));
    const bfs_zst_map_hdr *mh = (const bfs_zst_map_hdr *)m;
    const uint8_t *bits = m + sizeof *mh;
    if (bfs__rd32(mh->skip.magic) != BFS_ZST_MAP_MAGIC || bfs__rd32(mh->skip.size) != msz - sizeof mh->skip ||
        memcmp(mh->tag, BFS_ZST_MAP_TAG, sizeof mh->tag) != 0)
        BFS_FAIL(BFS_EINPUT, "%s: byte-group map at offset %llu has a bad magic, size or tag", what,
                 (unsigned long long)r->coff[last]);
    for (uint32_t k = 0; k < r->n; k++) {
        const bool g = (bits[k / 8] >> (k % 8)) & 1;
        if (g && (k == 0 || k == last || r->dsize[k] % 2 != 0 || r->dsize[k] > BFS_ZST_MAX_GROUPED || r->dsize[k] == 0))
            BFS_FAIL(BFS_EINPUT, "%s: frame %u is marked byte-grouped but is %u bytes (must be even, 2 to %u, and data)", what,
                     k, r->dsize[k], BFS_ZST_MAX_GROUPED);
        r->grouped[k] = g;
    }
    r->mode = BFS_ZST_BYTEGROUP;
cleanup:
    free(m);
    return rc;
}

static int bfs__src_file_pread(const bfs_src *s, void *buf, size_t len, uint64_t off)
{
    return bfs__pread_all(s->fd, buf, len, off, s->what);
}

static void bfs__src_file_close(bfs_src *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

int bfs__src_file(bfs_src *s, const char *path)
{
    struct stat sb;
    memset(s, 0, sizeof *s);
    s->what = path;
    s->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block us: refused below */
    if (s->fd < 0)
        return bfs__err(errno == ENOENT ? BFS_EINPUT : BFS_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(s->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        bfs__src_file_close(s);
        return bfs__err(BFS_EINPUT, "%s: not a regular file", path);
    }
    s->size = (uint64_t)sb.st_size;
    s->pread = bfs__src_file_pread;
    s->close = bfs__src_file_close;
    return 0;
}

static int bfs__src_mem_pread(const bfs_src *s, void *buf, size_t len, uint64_t off)
{
    if (off > s->size || len > s->size - off)
        return bfs__err(BFS_EINPUT, "%s: unexpected end of file at offset %llu (truncated?)", s->what,
                        (unsigned long long)(off > s->size ? off : s->size));
    memcpy(buf, s->data + off, len);
    return 0;
}

void bfs__src_mem(bfs_src *s, const void *data, size_t len, const char *what)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->data = data;
    s->size = len;
    s->what = what;
    s->pread = bfs__src_mem_pread;
}

int bfs__zst_reader_open_src(const bfs_src *src, bfs_zst_reader **out)
{
    int rc = 0;
    *out = NULL;
    bfs_zst_reader *r = calloc(1, sizeof *r);
    if (!r) {
        bfs_src s = *src;
        if (s.close)
            s.close(&s);
        return bfs__err(BFS_ENOMEM, "out of memory");
    }
    r->src = *src;
    r->what = bfs__strdup(src->what);
    if (!r->what)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    r->src.what = r->what;
    BFS_TRY(bfs__zst_parse_table(r));
    BFS_TRY(bfs__zst_parse_bytegroup(r));
    BFS_TRY(bfs__zst_dec_init(&r->dec));
    *out = r;
    return 0;
cleanup:
    bfs__zst_reader_free(r);
    return rc;
}

int bfs__zst_reader_open(const char *path, bfs_zst_reader **out)
{
    bfs_src s;
    *out = NULL;
    const int rc = bfs__src_file(&s, path);
    return rc < 0 ? rc : bfs__zst_reader_open_src(&s, out);
}

uint64_t bfs__zst_reader_size(const bfs_zst_reader *r) { return r->doff[r->n]; }
int bfs__zst_reader_mode(const bfs_zst_reader *r) { return r->mode; }
uint32_t bfs__zst_reader_frames(const bfs_zst_reader *r) { return r->n; }

void bfs__zst_reader_stats(const bfs_zst_reader *r, uint64_t *compressed_bytes_read, uint64_t *frames_decoded)
{
    if (compressed_bytes_read)
        *compressed_bytes_read = r->dec.bytes_read;
    if (frames_decoded)
        *frames_decoded = r->dec.frames_decoded;
}

void bfs__zst_reader_reset_stats(bfs_zst_reader *r)
{
    r->dec.bytes_read = 0;
    r->dec.frames_decoded = 0;
}

uint64_t bfs__zst_span(const bfs_zst_reader *r, uint64_t off, uint64_t len)
{
    uint64_t s = 0;
    for (uint32_t k = 0; k < r->n && len > 0; k++)
        if (r->dsize[k] && r->doff[k] < off + len && r->doff[k + 1] > off)
            s += r->coff[k + 1] - r->coff[k];
    return s;
}

/* Decode frame k exactly: its compressed bytes must make one zstd frame (or a
 * skippable frame) of dsize[k] bytes. Delivers the bytes to sink as they come: from d's
 * buffer, or, when direct is not NULL, decoded straight into direct (dsize[k] bytes) and
 * delivered from there. */
static int bfs__zst_decode_raw(const bfs_zst_reader *r, bfs_zst_dec *d, uint32_t k, uint8_t *direct,
                               bfs_zst_sink sink, void *user)
{
    const uint64_t c0 = r->coff[k], cs = r->coff[k + 1] - c0, ds = r->dsize[k];
    uint64_t left = cs, produced = 0;
    ZSTD_inBuffer in = {d->inbuf, 0, 0};
    ZSTD_DCtx_reset(d->dctx, ZSTD_reset_session_only);
    for (;;) {
        if (in.pos == in.size && left > 0) {
            const size_t n = left < BFS_ZST_IN_CHUNK ? (size_t)left : BFS_ZST_IN_CHUNK;
            const int rc = bfs__zst_pread(r, d, d->inbuf, n, c0 + (cs - left));
            if (rc < 0)
                return rc;
            in = (ZSTD_inBuffer){d->inbuf, n, 0};
            left -= n;
        }
        /* into direct while it has room; past that into d's buffer, where any byte is one too many */
        const bool into = direct != NULL && produced < ds;
        ZSTD_outBuffer ob = {into ? direct + produced : d->outbuf, into ? (size_t)(ds - produced) : d->outcap, 0};
        const size_t ret = ZSTD_decompressStream(d->dctx, &ob, &in);
        if (ZSTD_isError(ret) && ZSTD_getErrorCode(ret) == ZSTD_error_memory_allocation)
            return bfs__err(BFS_ENOMEM, "%s: frame %u (compressed offset %llu): zstd: %s", r->what, k,
                            (unsigned long long)c0, ZSTD_getErrorName(ret));
        if (ZSTD_isError(ret))
            return bfs__err(BFS_EINPUT, "%s: frame %u (compressed bytes [%llu, %llu), uncompressed offset %llu) is corrupt: zstd: %s",
                            r->what, k, (unsigned long long)c0, (unsigned long long)(c0 + cs),
                            (unsigned long long)r->doff[k], ZSTD_getErrorName(ret));
        if (ob.pos > 0) {
            if (ob.pos > ds - produced)
                return bfs__err(BFS_EINPUT, "%s: frame %u (compressed offset %llu, uncompressed offset %llu) decompresses to more than the %llu bytes the seek table gives",
                                r->what, k, (unsigned long long)c0, (unsigned long long)r->doff[k], (unsigned long long)ds);
            const int rc = sink(user, ob.dst, ob.pos);
            if (rc < 0)
                return rc;
            produced += ob.pos;
        }
        if (ret == 0) {
            if (in.pos != in.size || left > 0)
                return bfs__err(BFS_EINPUT, "%s: frame %u (uncompressed offset %llu): the zstd frame ends at compressed offset %llu but the seek table says %llu",
                                r->what, k, (unsigned long long)r->doff[k],
                                (unsigned long long)(c0 + cs - left - (in.size - in.pos)), (unsigned long long)(c0 + cs));
            break;
        }
        if (in.pos == in.size && left == 0 && ob.pos < ob.size)
            return bfs__err(BFS_EINPUT, "%s: frame %u (compressed bytes [%llu, %llu), uncompressed offset %llu) is truncated",
                            r->what, k, (unsigned long long)c0, (unsigned long long)(c0 + cs),
                            (unsigned long long)r->doff[k]);
    }
    if (produced != ds)
        return bfs__err(BFS_EINPUT, "%s: frame %u (compressed offset %llu, uncompressed offset %llu) decompresses to %llu bytes, the seek table says %llu",
                        r->what, k, (unsigned long long)c0, (unsigned long long)r->doff[k], (unsigned long long)produced,
                        (unsigned long long)ds);
    d->frames_decoded++;
    return 0;
}

/* Frame k (at most BFS_ZST_WHOLE_MAX compressed bytes) decoded in one call into dst, its
 * dsize[k] bytes, without the streaming decoder's window (one copy less); the same checks:
 * exactly one zstd frame, ending where the seek table says, of exactly dsize[k] bytes. */
static int bfs__zst_decode_whole(const bfs_zst_reader *r, bfs_zst_dec *d, uint32_t k, uint8_t *dst)
{
    const uint64_t c0 = r->coff[k], cs = r->coff[k + 1] - c0, ds = r->dsize[k];
    if (cs > d->ccap) {
        free(d->cbuf);
        d->cbuf = malloc((size_t)cs);
        d->ccap = d->cbuf ? (size_t)cs : 0;
        if (!d->cbuf)
            return bfs__err(BFS_ENOMEM, "%s: out of memory for frame %u's %llu compressed bytes", r->what, k,
                            (unsigned long long)cs);
    }
    const int rc = bfs__zst_pread(r, d, d->cbuf, (size_t)cs, c0);
    if (rc < 0)
        return rc;
    const size_t fl = ZSTD_findFrameCompressedSize(d->cbuf, (size_t)cs);
    if (ZSTD_isError(fl))
        return bfs__err(BFS_EINPUT, "%s: frame %u (compressed bytes [%llu, %llu), uncompressed offset %llu) is corrupt or truncated: zstd: %s",
                        r->what, k, (unsigned long long)c0, (unsigned long long)(c0 + cs),
                        (unsigned long long)r->doff[k], ZSTD_getErrorName(fl));
    if (fl != cs)
        return bfs__err(BFS_EINPUT, "%s: frame %u (uncompressed offset %llu): the zstd frame ends at compressed offset %llu but the seek table says %llu",
                        r->what, k, (unsigned long long)r->doff[k], (unsigned long long)(c0 + fl),
                        (unsigned long long)(c0 + cs));
    const size_t got = ZSTD_decompressDCtx(d->dctx, dst, (size_t)ds, d->cbuf, (size_t)cs);
    if (ZSTD_isError(got) && ZSTD_getErrorCode(got) == ZSTD_error_memory_allocation)
        return bfs__err(BFS_ENOMEM, "%s: frame %u (compressed offset %llu): zstd: %s", r->what, k,
                        (unsigned long long)c0, ZSTD_getErrorName(got));
    if (ZSTD_isError(got) && ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall)
        return bfs__err(BFS_EINPUT, "%s: frame %u (compressed offset %llu, uncompressed offset %llu) decompresses to more than the %llu bytes the seek table gives",
                        r->what, k, (unsigned long long)c0, (unsigned long long)r->doff[k], (unsigned long long)ds);
    if (ZSTD_isError(got))
        return bfs__err(BFS_EINPUT, "%s: frame %u (compressed bytes [%llu, %llu), uncompressed offset %llu) is corrupt: zstd: %s",
                        r->what, k, (unsigned long long)c0, (unsigned long long)(c0 + cs),
                        (unsigned long long)r->doff[k], ZSTD_getErrorName(got));
    if (got != ds)
        return bfs__err(BFS_EINPUT, "%s: frame %u (compressed offset %llu, uncompressed offset %llu) decompresses to %llu bytes, the seek table says %llu",
                        r->what, k, (unsigned long long)c0, (unsigned long long)r->doff[k], (unsigned long long)got,
                        (unsigned long long)ds);
    d->frames_decoded++;
    return 0;
}

typedef struct {
    bfs_zst_sink sink; /* NULL: the bytes are already where they belong (direct) */
    void *user;
    XXH64_state_t *st;
} bfs_zst_fctx;

static int bfs__zst_sink_hash(void *user, const uint8_t *p, size_t n)
{
    bfs_zst_fctx *f = user;
    XXH64_update(f->st, p, n);
    return f->sink ? f->sink(f->user, p, n) : 0;
}

static int bfs__zst_sink_none(void *user, const uint8_t *p, size_t n)
{
    (void)user, (void)p, (void)n;
    return 0;
}

/* Original bytes [a, a + n) of a byte-grouped frame of fn bytes held grouped in g (a, n, fn even). */
static void bfs__ungroup_part(uint8_t *dst, const uint8_t *g, size_t fn, size_t a, size_t n)
{
    const size_t h = fn / 2, j0 = a / 2;
    for (size_t j = 0; j < n / 2; j++) {
        dst[2 * j + 1] = g[j0 + j];
        dst[2 * j] = g[h + j0 + j];
    }
}

/* Decode frame k, undo its byte grouping, check its checksum; deliver its original bytes to
 * sink, or (direct not NULL) write them straight into direct's dsize[k] bytes. */
int bfs__zst_decode_frame(const bfs_zst_reader *r, bfs_zst_dec *d, uint32_t k, uint8_t *direct,
                          bfs_zst_sink sink, void *user)
{
    int rc = 0;
    bfs_zst_fctx f = {.sink = direct ? NULL : sink, .user = user, .st = XXH64_createState()};
    if (!f.st)
        return bfs__err(BFS_ENOMEM, "out of memory");
    XXH64_reset(f.st, 0);
    if (r->grouped && r->grouped[k]) {
        const size_t ds = r->dsize[k];
        if (ds > d->gcap) {
            free(d->gbuf);
            d->gbuf = malloc(ds);
            d->gcap = d->gbuf ? ds : 0;
            if (!d->gbuf)
                BFS_FAIL(BFS_ENOMEM, "%s: out of memory for a %zu-byte frame", r->what, ds);
        }
        if (r->coff[k + 1] - r->coff[k] <= BFS_ZST_WHOLE_MAX)
            BFS_TRY(bfs__zst_decode_whole(r, d, k, d->gbuf));
        else
            BFS_TRY(bfs__zst_decode_raw(r, d, k, d->gbuf, bfs__zst_sink_none, NULL));
        for (size_t a = 0; a < ds; a += BFS_ZST_UNGROUP_PIECE) { /* restored a piece at a time */
            const size_t n = ds - a < BFS_ZST_UNGROUP_PIECE ? ds - a : BFS_ZST_UNGROUP_PIECE;
            uint8_t *o = direct ? direct + a : d->gtmp;
            bfs__ungroup_part(o, d->gbuf, ds, a, n);
            BFS_TRY(bfs__zst_sink_hash(&f, o, n));
        }
    } else if (direct && r->coff[k + 1] - r->coff[k] <= BFS_ZST_WHOLE_MAX) {
        BFS_TRY(bfs__zst_decode_whole(r, d, k, direct));
        BFS_TRY(bfs__zst_sink_hash(&f, direct, r->dsize[k]));
    } else {
        BFS_TRY(bfs__zst_decode_raw(r, d, k, direct, bfs__zst_sink_hash, &f));
    }
    if (r->xxh && (uint32_t)XXH64_digest(f.st) != r->xxh[k])
        BFS_FAIL(BFS_EINPUT, "%s: frame %u (compressed bytes [%llu, %llu), uncompressed offset %llu): checksum 0x%08x, the seek table says 0x%08x",
                 r->what, k, (unsigned long long)r->coff[k], (unsigned long long)r->coff[k + 1],
                 (unsigned long long)r->doff[k], (uint32_t)XXH64_digest(f.st), r->xxh[k]);
cleanup:
    XXH64_freeState(f.st);
    return rc;
}

typedef struct {
    bfs_zst_sink sink;
    void *user;
    uint64_t pos, a, b; /* pos: uncompressed offset of the next byte; deliver [a, b) */
} bfs_zst_clip;

static int bfs__zst_sink_clip(void *user, const uint8_t *p, size_t n)
{
    bfs_zst_clip *c = user;
    const uint64_t s = c->pos, e = c->pos + n;
    c->pos = e;
    const uint64_t lo = s > c->a ? s : c->a, hi = e < c->b ? e : c->b;
    if (lo >= hi)
        return 0;
    return c->sink(c->user, p + (lo - s), (size_t)(hi - lo));
}

/* Deliver uncompressed bytes [off, off + len), decoding only the frames that hold them. */
int bfs__zst_read_range(bfs_zst_reader *r, uint64_t off, uint64_t len, bfs_zst_sink sink, void *user)
{
    const uint64_t total = r->doff[r->n];
    if (off > total || len > total - off)
        return bfs__err(BFS_EINPUT, "%s: bytes [%llu, %llu) lie past its %llu uncompressed bytes", r->what,
                        (unsigned long long)off, (unsigned long long)(off + len), (unsigned long long)total);
    if (len == 0)
        return 0;
    /* first frame whose end is past off */
    uint32_t lo = 0, hi = r->n;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (r->doff[mid + 1] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (uint32_t k = lo; k < r->n && r->doff[k] < off + len; k++) {
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while reading %s", r->what);
        if (r->dsize[k] == 0)
            continue;
        bfs_zst_clip c = {.sink = sink, .user = user, .pos = r->doff[k], .a = off, .b = off + len};
        const int rc = bfs__zst_decode_frame(r, &r->dec, k, NULL, bfs__zst_sink_clip, &c);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int bfs__zst_check_empty_frames(bfs_zst_reader *r)
{
    for (uint32_t k = 0; k < r->n; k++) {
        if (r->dsize[k] != 0 || (k == 0 && r->mode == BFS_ZST_BYTEGROUP)) /* the 16-byte header, checked at open */
            continue;
        const int rc = bfs__zst_decode_raw(r, &r->dec, k, NULL, bfs__zst_sink_none, NULL); /* 0 bytes: never called */
        if (rc < 0)
            return rc;
    }
    return 0;
}

typedef struct {
    uint8_t *p;
} bfs_zst_memsink;

static int bfs__zst_sink_mem(void *user, const uint8_t *p, size_t n)
{
    bfs_zst_memsink *m = user;
    memcpy(m->p, p, n);
    m->p += n;
    return 0;
}

int bfs__zst_pread_range(bfs_zst_reader *r, void *buf, size_t len, uint64_t off)
{
    bfs_zst_memsink m = {buf};
    return bfs__zst_read_range(r, off, len, bfs__zst_sink_mem, &m);
}

/* Read and parse the safetensors header held in the first frames. */
int bfs__zst_read_header(bfs_zst_reader *r, uint8_t **hbuf, bfs_st_header *h)
{
    int rc = 0;
    uint8_t lb[8];
    uint8_t *b = NULL;
    *hbuf = NULL;
    const uint64_t total = bfs__zst_reader_size(r);
    if (total < 8)
        return bfs__err(BFS_EINPUT, "%s: decompresses to %llu bytes, too short for a safetensors file", r->what,
                        (unsigned long long)total);
    BFS_TRY(bfs__zst_pread_range(r, lb, 8, 0));
    uint64_t n = 0;
    BFS_TRY(bfs__st_header_len(lb, total, r->what, &n));
    b = malloc((size_t)n + 8);
    if (!b)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory for a %llu-byte header", r->what, (unsigned long long)n);
    BFS_TRY(bfs__zst_pread_range(r, b, (size_t)n + 8, 0));
    BFS_TRY(bfs__st_parse(b, total, r->what, h));
    *hbuf = b;
    b = NULL;
cleanup:
    free(b);
    return rc;
}

const char *bfs__zst_reader_name(const bfs_zst_reader *r) { return r->what; }

void bfs__zst_frame_span(const bfs_zst_reader *r, uint32_t k, uint64_t *doff, uint32_t *dsize, uint64_t *coff)
{
    *doff = r->doff[k];
    *dsize = r->dsize[k];
    *coff = r->coff[k];
}

uint32_t bfs__zst_frame_at(const bfs_zst_reader *r, uint64_t off)
{
    uint32_t lo = 0, hi = r->n; /* the first frame whose end is past off (n: none) */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (r->doff[mid + 1] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
