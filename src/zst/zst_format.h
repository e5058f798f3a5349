/*
 * Compressed artifacts: the seekable zstd file format, shared by the
 * writer (zst_write.c) and the reader (zst_read.c). This header owns the format:
 * its magic numbers, limits, packed layouts and the BF16 byte grouping.
 *
 * The format (zstd contrib/seekable_format/zstd_seekable_compression_format.md,
 * version 0.1.0; all numbers little-endian):
 *   1. frames, one after another; each an independent zstd frame (content size and
 *      XXH64 content checksum in its header/trailer, so stock `zstd -d` checks it),
 *      cut at every tensor boundary of the safetensors file and after at most
 *      frame_bytes (default 4 MiB) of uncompressed data;
 *   2. the seek table, a skippable frame, last in the file:
 *        u32 0x184D2A5E  skippable magic                      } bfs_zst_skip_hdr
 *        u32 FrameSize   = 12 * n + 9                         }
 *        n x { u32 compressed size, u32 decompressed size, u32 checksum }  bfs_zst_seek_entry
 *        u32 n           number of frames (<= 0x8000000)      } bfs_zst_seek_footer
 *        u8  descriptor  0x80: checksums present; bits 6..2 reserved, must be 0
 *        u32 0x8F92EAB1  seekable magic, the file's last 4 bytes
 *      checksum = low 32 bits of XXH64(seed 0) of the frame's uncompressed bytes.
 *   The plain mode (BFS_ZST_PLAIN) is exactly this: stock `zstd -d` restores the
 *   original bytes (it decodes the frames and skips the seek table).
 *
 *   BFS_ZST_BYTEGROUP (bfshard only, format version 1) is the same layout with
 *      frame 0   = 16 bytes, not a zstd frame, so stock zstd refuses the file
 *                  instead of writing wrong bytes: "\x89BFSZ\r\n\x1a", u32 version 1,
 *                  u32 transform 1 (bf16 byte grouping); seek table entry {16, 0, 0}
 *                  (bfs_zst_bg_header);
 *      last frame = a skippable frame (magic 0x184D2A5B) "BFSZMAP1" + one bit per
 *                  seek table entry (bit k of byte k/8): 1 = frame k is byte-grouped;
 *                  seek table entry {size, 0, 0} (bfs_zst_map_hdr + the bits).
 *   A byte-grouped frame holds the BF16 elements of one tensor with their high bytes
 *   (sign, exponent) first and their low bytes after: for an n-byte frame,
 *   grouped[i] = orig[2i + 1], grouped[n/2 + i] = orig[2i] for i < n/2. The checksum
 *   is of the original bytes. Grouped frames are at most 64 MiB. The writer groups a
 *   BF16 frame only when that compresses smaller (it loses on dequantized 4-bit values).
 *
 * Nothing read from a file is trusted: the reader checks every count, size and
 * offset of the seek table before use, decodes with bounded buffers whatever the
 * table claims, and checks that every frame ends exactly where the table says and
 * decompresses to exactly the size and checksum it gives.
 */
#ifndef BFS_ZST_FORMAT_H
#define BFS_ZST_FORMAT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define BFS_ZST_SKIP_MAGIC 0x184D2A5Eu
#define BFS_ZST_MAP_MAGIC 0x184D2A5Bu
#define BFS_ZST_SEEK_MAGIC 0x8F92EAB1u
#define BFS_ZST_SEEK_CHECKSUMS 0x80u    /* descriptor bit: entries carry checksums */
#define BFS_ZST_SEEK_RESERVED 0x7cu     /* descriptor bits that must be 0 */
#define BFS_ZST_FOOTER 9u
#define BFS_ZST_MAX_FRAMES 0x8000000u
#define BFS_ZST_MAX_DSIZE 0x40000000u   /* largest frame the format allows (1 GiB) */
#define BFS_ZST_MAX_GROUPED (64u << 20) /* largest byte-grouped frame */
#define BFS_ZST_MIN_FRAME 1024u
#define BFS_ZST_BG_HEADER 16u
#define BFS_ZST_BG_VERSION 1u
#define BFS_ZST_BG_TRANSFORM 1u         /* bf16 byte grouping */
#define BFS_ZST_BG_MAGIC "\x89" "BFSZ\r\n\x1a" /* 8 bytes, compared without the NUL */
#define BFS_ZST_MAP_TAG "BFSZMAP1"             /* 8 bytes, compared without the NUL */

/* ---- packed layouts: byte arrays only, so no padding and no alignment ---------- */
typedef struct bfs_zst_skip_hdr { /* the start of any skippable frame */
    uint8_t magic[4];
    uint8_t size[4]; /* bytes that follow */
} bfs_zst_skip_hdr;
static_assert(sizeof(bfs_zst_skip_hdr) == 8, "wrong skippable frame header size/padding");

typedef struct bfs_zst_seek_entry { /* with checksums (descriptor 0x80); without, the first 8 bytes */
    uint8_t csize[4];
    uint8_t dsize[4];
    uint8_t xxh[4];
} bfs_zst_seek_entry;
static_assert(sizeof(bfs_zst_seek_entry) == 12, "wrong seek table entry size/padding");

typedef struct bfs_zst_seek_footer {
    uint8_t nframes[4];
    uint8_t desc;
    uint8_t magic[4];
} bfs_zst_seek_footer;
static_assert(sizeof(bfs_zst_seek_footer) == BFS_ZST_FOOTER, "wrong seek table footer size/padding");

typedef struct bfs_zst_bg_header { /* BYTEGROUP frame 0 */
    uint8_t magic[8];
    uint8_t version[4];
    uint8_t transform[4];
} bfs_zst_bg_header;
static_assert(sizeof(bfs_zst_bg_header) == BFS_ZST_BG_HEADER, "wrong byte-group header size/padding");

typedef struct bfs_zst_map_hdr { /* BYTEGROUP last frame, then one bit per seek table entry */
    bfs_zst_skip_hdr skip;
    uint8_t tag[8];
} bfs_zst_map_hdr;
static_assert(sizeof(bfs_zst_map_hdr) == 16, "wrong byte-group map header size/padding");

static inline void bfs__le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t bfs__rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* BF16 byte grouping of an n-byte frame (n even) and its inverse. */
static inline void bfs__group(uint8_t *dst, const uint8_t *src, size_t n)
{
    const size_t h = n / 2;
    for (size_t i = 0; i < h; i++) {
        dst[i] = src[2 * i + 1];
        dst[h + i] = src[2 * i];
    }
}
static inline void bfs__ungroup(uint8_t *dst, const uint8_t *src, size_t n)
{
    const size_t h = n / 2;
    for (size_t i = 0; i < h; i++) {
        dst[2 * i + 1] = src[i];
        dst[2 * i] = src[h + i];
    }
}

#endif
