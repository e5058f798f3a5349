/* The writer of convert's pipeline (writer.c): a pool of lanes, each a writer thread with
 * its own hash thread (and SHA-256 thread with convert --sha256), each lane owning whole
 * files: a file is given to one lane when it is begun (bfs__writer_begin_file), and that
 * lane's threads alone write it, hash it and feed its compressed copy, so files of different
 * lanes are written and hashed at once while each file's bytes go out in file order.
 * bfs__writer_push queues each job on its file's lane; the lane's hash thread hashes the
 * lane's jobs in order (file and piece XXH3-128s) while its writer thread writes them, so the
 * pushing thread only dequantizes; the writer thread writes with O_DIRECT where the
 * filesystem takes it (an aligned body from the unit buffers themselves, a block-sized carry
 * joining each job's partial head and tail; the file's last partial block buffered), feeds
 * the optional compressed copy, and bounds the dirty page cache where it must write
 * buffered; the SHA-256 thread hashes each job's bytes while the writer writes them (a job's
 * buffer is free again once every thread of its lane is done with it). The writer holds up
 * to BFS_WRITER_FILES files at once, each with its own hashes and carry: the next one's jobs
 * queue behind the last one's end (convert commits the last one once the writer has ended
 * it), and a group of rank files written together (convert_ranks.c) takes a slot each, their
 * jobs interleaved and spread over the lanes; a slot is reused only after
 * bfs__writer_release_file. Up to BFS_WQ_MAX jobs queue on each lane: the ring of unit
 * buffers (units.h: their size, batches and the memory model) and the headers and ends
 * between them. Every job has a number in push order (bfs__writer_pushed); a buffer is free
 * again once every job up to its last is done with, on every lane (bfs__writer_wait_job).
 * The headers are built by the hash thread of their file's lane in two buffers shared by all
 * lanes, taken in push order, so that the memory held does not grow with the lanes. */
#ifndef BFS_WRITER_H
#define BFS_WRITER_H

#include "output/units.h"
#include "input/srchash.h"
#include "zst/zst.h"
#include "base/bfs_io.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct bfs_wjob {
    const void *buf;
    size_t len;
    uint64_t off;
    int piece;     /* index in the file's pieces, -1 for the header */
    /* a batch (bfs__batch_end): pieces [piece, piece_last] (whole; the file's `of` given
     * to begin_file); 0 or == piece: one piece */
    int piece_last;
    bool piece_end;
    /* the off % BFS_DIO_ALIGN bytes before buf are the producer's, and buf minus that
     * is BFS_DIO_ALIGN-aligned: the writer may overwrite them (with the file's bytes
     * before off) to write the job from there with O_DIRECT, without a copy */
    bool headroom;
    bool end;      /* (bfs__writer_end_file) the file's last partial block */
    char *hex;     /* (end) the file's XXH3-128 goes here, hex, once the end job ran;
                    * (build) the header's own, when not NULL */
    /* the file's header (buf NULL), len bytes: built by the hash thread (bfs__plan_header_into
     * of the file's plan and `of`) in one of the writer's two header buffers before the
     * writer and the sha thread read it, so that the pushing thread neither builds nor
     * waits for the headers of a group's files */
    bool build;
    /* the file's whole size, reserved (posix_fallocate, else ftruncate) by its writer before
     * the job's bytes: a full disk fails there, before any of the file is written; 0: none */
    uint64_t reserve;
    int file;      /* (set by push) which of the writer's files: the one bfs__writer_use chose */
    uint64_t seq;  /* (set by push) its number: jobs pushed before it */
    int hb;        /* (set by push, build) the header buffer it is built in */
    uint64_t hwait; /* (set by push, build) jobs that must be done with before that buffer is */
} bfs_wjob;

/* Seconds spent per stage (BFSHARD_STAGES=1 prints them; bench/bench.py reads them): each
 * summed over the lanes (bfs__writer_stages). */
typedef struct bfs_wstages {
    double hash;   /* file + piece hashes, and the headers built (the hash threads, beside the writers) */
    double wait;   /* the pushing thread waiting for the writer (a slot, a buffer, a file's end) */
    double write;  /* pwrite, direct or buffered, and the dirty-page bound (writer threads) */
    double zst;    /* the compressed copy (writer threads) */
    double tail;   /* the last partial block of every file (writer threads) */
    double sha;    /* SHA-256 of the files (the sha threads, beside the writers) */
    uint64_t direct_bytes, buffered_bytes;
} bfs_wstages;

/* One file the writer writes (a slot of BFS_WRITER_FILES). */
typedef struct bfs_wfile {
    bool claimed;      /* begun and not yet released (bfs__writer_release_file) */
    int lane;          /* the lane that owns it from its begin to its end */
    int fd;
    bool direct;       /* fd has O_DIRECT (cleared for the last partial block, or on EINVAL) */
    bool ended;        /* its end job ran (under the writer's mu); true when unused */
    const char *what;
    uint8_t *carry;    /* BFS_CARRY_BYTES, aligned: file bytes [carry_off, carry_off + carry_len) */
    uint64_t carry_off;
    size_t carry_len;
    uint64_t flushed;  /* bytes pushed out and dropped (buffered writes) */
    uint64_t written;  /* bytes handed to the kernel */
    /* the compressed copy, fed in order, cut before each piece of `of`; NULL when off */
    bfs_zst_writer *zw;
    const bfs_plan *zplan;
    int zpiece;        /* piece that zw is in, -1 for the header */
    bfs_sha256 *sha;   /* the file's SHA-256 (the sha thread's), when on */
    char sha_hex[65];  /* its digest, once the file's end job is done */
    /* the hash thread's: the file's and the current piece's XXH3-128 */
    XXH3_state_t *file_st, *piece_st;
    const bfs_outfile *of; /* its pieces (set at its begin: the threads read them) */
    bfs_dig16 *piece_dig;
} bfs_wfile;

#define BFS_WRITER_FILES 32

#define BFS_WQ_MAX 64
struct bfs_writer;
/* One lane: a writer thread, its hash thread and its sha thread, and the jobs of the files it owns */
typedef struct bfs_wlane {
    struct bfs_writer *w;
    pthread_t tid, xxh_tid, sha_tid;
    bool started, xxh_started, sha_started;
    /* (with the writer's mu) its threads wait here for a job: woken by a push to this lane,
     * a job of this lane done, or stop, not by the other lanes' (the writer's cv is the
     * pusher's and the header builders': jobs retired) */
    pthread_cond_t cv;
    bfs_wjob q[BFS_WQ_MAX];
    int head, count;   /* ring of at most BFS_WQ_MAX jobs not yet done with (written and hashed) */
    int nwrite, nxxh, nsha; /* of those, from head: how many the writer wrote, the hash and sha threads hashed */
    bfs_wstages st;    /* its threads' seconds and bytes (under mu) */
    bfs_wstages wst;   /* the writer thread's own, copied into st after each job */
} bfs_wlane;

typedef struct bfs_writer {
    int nlanes;        /* set before bfs__writer_start (0: 1), at most BFS_WRITER_LANES */
    int next_lane;     /* the lane the next file begun goes to (round the lanes) */
    bfs_wlane lanes[BFS_WRITER_LANES];
    bool mu_init;
    pthread_mutex_t mu; /* one for the pool: jobs are units of megabytes */
    pthread_cond_t cv;  /* jobs retired (and failures, stop): what the pusher and header builders wait for */
    uint64_t pushed;   /* jobs queued over the writer's life (under mu) */
    /* the headers are built in two buffers taking turns in push order (aligned, grown to the
     * longest), each free again once every job up to the last header built in it is done with */
    uint8_t *hbuf[2];
    size_t hcap[2];
    uint64_t hjob[2];
    uint64_t hnext;
    bool sha;          /* set before bfs__writer_start: SHA-256 of every file (convert --sha256) */
    bool stop;
    int rc;            /* first failure, under mu; its message is in err */
    bfs_errslot err;
    bool no_direct;    /* BFSHARD_DIRECT=0: buffered writes only (tests compare both paths) */
    unsigned delay_us; /* BFSHARD_TEST_WRITER_DELAY_US: each job this much later, a slow disk
                        * for the tests (tests/ring_identical.sh); 0 otherwise */
    bfs_wfile files[BFS_WRITER_FILES];
    int cur;           /* the file jobs are pushed to, -1 before the first */
    _Atomic uint64_t total; /* tensor bytes over the run */
    bfs_wstages st;    /* the pushing thread's (wait); the lanes keep the rest */
} bfs_writer;

/* Start the lanes' threads (w zeroed first; w->sha set to hash every file with SHA-256 too,
 * w->nlanes to the lanes wanted). */
int bfs__writer_start(bfs_writer *w);
/* The stage seconds and bytes so far, summed over the lanes (once the files are ended). */
void bfs__writer_stages(bfs_writer *w, bfs_wstages *out);
/* Stop and join the threads (when started) and free their state; safe on a zeroed writer. */
void bfs__writer_stop(bfs_writer *w);
/* Begin a file in a free slot, given to the next lane round the pool: fd at offset 0, `what` names it in errors (both must
 * outlive the file's end), piece hashes go to piece_dig; zw (may be NULL) gets the same
 * bytes, cut before every piece of `of`. Jobs must then come in file order, each starting
 * where the one before ended, from offset 0. The writer may still be on other files.
 * Returns the file's slot (bfs__writer_use, _wait_file, _release_file), which jobs go
 * to until bfs__writer_use picks another. */
int bfs__writer_begin_file(bfs_writer *w, int fd, const char *what, bfs_dig16 *piece_dig, bfs_zst_writer *zw,
                           const bfs_plan *plan, const bfs_outfile *of);
/* Jobs pushed from now on go to the begun file in slot `file`. */
int bfs__writer_use(bfs_writer *w, int file);
/* After the file's last job: its end queued (the last partial block); the file's hash
 * goes into hex (33 bytes, kept until then) by the time bfs__writer_wait_file returns,
 * which comes before its fdatasync (bfs__tmp_commit). */
int bfs__writer_end_file(bfs_writer *w, char hex[33]);
/* After bfs__writer_wait_file (and bfs__writer_file_sha256) or a failure: slot `file`
 * may be begun again. */
void bfs__writer_release_file(bfs_writer *w, int file);
/* Wait until the writer has run the end of the file in slot `file`; returns as push. */
int bfs__writer_wait_file(bfs_writer *w, int file);
/* After bfs__writer_wait_file: the SHA-256 of the file in slot `file` (w->sha on), hex. */
const char *bfs__writer_file_sha256(const bfs_writer *w, int file);
/* Queue the job (hashed and written in order); blocks while BFS_WQ_MAX are pending. The
 * buffer (and its headroom) must stay untouched until bfs__writer_wait says it is free again. Returns
 * the writer's first failure (its message made the caller's), else 0. */
int bfs__writer_push(bfs_writer *w, const bfs_wjob *j);
/* Wait until at most `pending` jobs remain queued or running, over all lanes; returns as push. */
int bfs__writer_wait(bfs_writer *w, int pending);
/* The number of jobs pushed so far (the pushing thread's: right after a push, that job's
 * number + 1); bfs__writer_wait_job(w, n): wait until the first n jobs are done with (their
 * buffers free again); returns as push. */
uint64_t bfs__writer_pushed(const bfs_writer *w);
/* How many of the first jobs the writer is done with so far, every one of them on every lane
 * (it does not wait): job n's buffer is free once this is >= n. */
uint64_t bfs__writer_retired(bfs_writer *w);
int bfs__writer_wait_job(bfs_writer *w, uint64_t n);
/* Whether the writer has run the end of the file in slot `file` (does not wait). */
bool bfs__writer_file_ended(bfs_writer *w, int file);

#endif
