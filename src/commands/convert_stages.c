/* The BFSHARD_STAGES=1 report of a conversion (make bench reads it): seconds per stage, the
 * writer's and the ring's figures, the bytes read, as one JSON line on stderr. */
#include "commands/convert.h"
#include "output/units.h"
#include "output/writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void bfs__busy(bfs_run *r, double el, double *read, double *dequant, double *hash, double *write)
{
    bfs_wstages st;
    bfs__writer_stages(&r->w, &st);
    if (el <= 0)
        el = r->t_files0 > 0 ? bfs__now() - r->t_files0 : 0.0;
    const int lanes = r->w.nlanes > 0 ? r->w.nlanes : 1;
    *read = el > 0 ? r->t_read / el : 0.0;
    *dequant = el > 0 ? r->t_dequant / el : 0.0;
    /* the busier of the XXH3 and the SHA-256 threads (each one a lane) */
    *hash = el > 0 ? (st.hash > st.sha ? st.hash : st.sha) / (el * lanes) : 0.0;
    *write = el > 0 ? (st.write + st.zst + st.tail) / (el * lanes) : 0.0;
}

void bfs__progress_run(bfs_run *r, const char *tensor, bool done)
{
    bfs_progress p = {.bytes_done = done ? r->part_bytes : atomic_load(&r->w.total), .bytes_total = r->part_bytes,
                      .tensor = tensor, .writers = r->w.nlanes};
    bfs__busy(r, 0, &p.busy_read, &p.busy_dequant, &p.busy_hash, &p.busy_write);
    bfs__progress_report(r->o, &p);
}

/* BFSHARD_STAGES=1: one JSON line on stderr with the seconds per stage (make bench) */
void bfs__stages_print(const bfs_run *r, double total)
{
    const char *e = getenv("BFSHARD_STAGES");
    if (!e || strcmp(e, "1") || !r->plan)
        return;
    bfs_wstages st;
    bfs__writer_stages((bfs_writer *)&r->w, &st);
    const bfs_wstages *s = &st;
    const uint64_t bp = bfs__buf_page();
    uint64_t touched = 0; /* the buffers' pages the run filled (the memory model: units.h) */
    for (int i = 0; i < r->ring.n; i++)
        touched += (r->touched[i] + bp - 1) / bp * bp;
    /* writer_busy: the share of the run the writer spent writing (keep the disk busy); device
     * bytes: what the storage delivered, readahead included (-1: no count) */
    const uint64_t dev = bfs__device_read_bytes();
    double b_read, b_dequant, b_hash, b_write; /* over the rank files' seconds */
    bfs__busy((bfs_run *)r, r->t_files, &b_read, &b_dequant, &b_hash, &b_write);
    fprintf(stderr,
            "bfshard-stages {\"total_s\": %.4f, \"dequant_s\": %.4f, \"hash_s\": %.4f, \"wait_writer_s\": %.4f, "
            "\"write_s\": %.4f, \"zst_s\": %.4f, \"tail_s\": %.4f, \"commit_s\": %.4f, \"direct_bytes\": %llu, "
            "\"buffered_bytes\": %llu, \"input_s\": %.4f, \"plan_s\": %.4f, \"layout_s\": %.4f, \"setup_s\": %.4f, "
            "\"files_s\": %.4f, \"manifest_s\": %.4f, \"sha256_s\": %.4f, \"writer_busy\": %.4f, "
            "\"writer_busy_files\": %.4f, \"buffers\": %d, \"buffers_used\": %d, \"buffers_touched_bytes\": %llu, \"units_waited\": %llu, \"units_interleaved\": %llu, \"buffer_bytes\": %llu, \"unit_bytes\": %llu, \"group\": %d, "
            "\"input_bytes_read\": %llu, \"source_bytes_hashed\": %llu, \"device_bytes_read\": %lld, \"read_s\": %.4f, "
            "\"writers\": %d, \"busy_read\": %.4f, \"busy_dequant\": %.4f, \"busy_hash\": %.4f, \"busy_write\": %.4f}\n",
            total, r->t_dequant, s->hash, s->wait, s->write, s->zst, s->tail, r->t_commit,
            (unsigned long long)s->direct_bytes, (unsigned long long)s->buffered_bytes, r->t_input, r->t_plan,
            r->t_layout, r->t_setup, r->t_files, r->t_manifest, s->sha, total > 0 ? s->write / total : 0.0,
            r->t_files > 0 ? s->write / r->t_files : 0.0, r->ring.n, r->live,
            (unsigned long long)touched, (unsigned long long)r->waited, (unsigned long long)r->interleaved,
            (unsigned long long)r->ring.slot,
            (unsigned long long)r->ring.unit, r->group, (unsigned long long)r->in_read, (unsigned long long)r->src_read,
            dev == UINT64_MAX || r->dev_read0 == UINT64_MAX ? -1LL : (long long)(dev - r->dev_read0), r->t_read,
            r->w.nlanes, b_read, b_dequant, b_hash, b_write);
}
