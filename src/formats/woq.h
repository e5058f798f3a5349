/* Shared by GPTQ, AWQ and bitsandbytes 8-bit (gptq.c, awq.c, bnb8.c; docs/FORMATS.md section 9): the
 * input ranges a unit of a BFS_K_WOQ tensor reads, its kind name, and the checks of the
 * pieces they have in common (scale dtype, act-order group index). Implemented in woq.c. */
#ifndef BFS_FORMATS_WOQ_H
#define BFS_FORMATS_WOQ_H

#include "format.h"

/* The ranges unit u reads: the columns [row0, row1) of the transposed arrays of GPTQ and
 * AWQ GEMM (from the first byte to the last, every row of the array between), the rows of
 * AWQ GEMV and bitsandbytes 8-bit; GPTQ's g_idx whole. */
int bfs__woq_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC]);
const char *bfs__woq_kind_name(const bfs_ltensor *t);
/* The scale type of a GPTQ / AWQ scales tensor: BFS_WOQ_F16 (F16 only), or < 0 naming it. */
int bfs__woq_scale_type(const bfs_fctx *c, const bfs_raw *s, const char *weight);
/* Every entry of the I32 group index gi is in [0, ngroups) (< 0 naming the first that is not);
 * *plain = 1 where each is c / group_size (a checkpoint quantized without act-order still
 * stores g_idx). */
int bfs__woq_check_gidx(const bfs_fctx *c, const bfs_raw *gi, uint64_t ngroups, uint64_t group_size, int *plain);
/* A JSON integer member of the claim, or dflt when absent; < 0 when present and not an integer. */
int bfs__woq_cfg_int(const bfs_fctx *c, const char *key, int64_t dflt, int64_t *v);
/* The claim's "bits" (default 4) and "group_size" (default 128), as bfs__woq_cfg_int reads them. */
int bfs__woq_cfg_bits(const bfs_fctx *c, int64_t *bits, int64_t *group_size);

#endif
