/* Shared helpers for the C tests (cmocka): files and directories, synthetic inputs, and
 * running the CLI (by shell, or forked with its exit code, signal and stderr). One copy of
 * each: a test that needs a helper twice takes it from here. */
#ifndef BFS_TESTUTIL_H
#define BFS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <pthread.h>
#include <stdatomic.h>
#include <cmocka.h>

#include "bfshard.h"

/* ---- files and directories -------------------------------------------------------------- */
/* Read a whole file; returns malloc'd buffer (caller frees; a NUL after len bytes) or NULL. */
uint8_t *tu_read_file(const char *path, size_t *len);
/* A whole file as a NUL-ended string (caller frees); "" when it is missing or unreadable. */
char *tu_slurp(const char *path);
/* Write a whole file; 0 on success. */
int tu_write_file(const char *path, const void *buf, size_t len);
/* A fresh empty temporary directory under $TMPDIR (or /tmp); caller frees the string. */
char *tu_tmpdir(const char *tag);
/* rm -rf */
void tu_rmrf(const char *path);
/* The names in dir but "." and "..", sorted, NULL-terminated (free with tu_names_free);
 * NULL when dir cannot be opened. */
char **tu_dir_names(const char *dir);
void tu_names_free(char **names);
/* True when a name in dir ends with suffix. */
bool tu_dir_has(const char *dir, const char *suffix);
/* Newlines in s. */
int tu_count_lines(const char *s);
/* Seconds on the monotonic clock. */
double tu_now_s(void);

/* ---- synthetic inputs -------------------------------------------------------------------- */
/* A safetensors file: 8-byte length, header as given, then data_len bytes of data (zeros
 * when data is NULL). Fails the test on an I/O error. */
void tu_write_st(const char *path, const char *header, const void *data, size_t data_len);
/* dir/model.safetensors, gpt-oss-shaped MXFP4: `layers` layers of experts
 * gate_up_proj_blocks [E, 256, 90, 16] U8 + scales [E, 256, 90] U8 (+ a BF16 bias [E, 512]
 * when bias); bytes from a fixed LCG, scales in a sane range (100..139: 2^-27 .. 2^12);
 * plus fixtures/mxfp4-tiny's config.json and tokenizer.json. */
void tu_gen_mxfp4(const char *dir, int E, int layers, bool bias);

/* ---- running commands --------------------------------------------------------------------- */
/* Run a shell command, return its exit status (0..255), or -1. Exit 127 (command not
 * found) fails the running test instead: a missing tool never passes a check. */
int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Path of the bfshard CLI under test ($BFSHARD, else build/bfshard). */
const char *tu_bfshard(void);
/* Runs `PREFIX bfshard ARGS` through the shell, stdin and stdout /dev/null. PREFIX: shell
 * words before the CLI's (absolute) path: "NAME=VALUE" assignments, "env -u X", "cd DIR &&"
 * ("" or NULL for none). Returns the exit status (as tu_sh); the whole stderr text in err
 * (NULL: dropped). */
int tu_cli(const char *prefix, const char *args, char *err, size_t cap);

/* How tu_spawn runs the CLI. Zero-initialised = stdout and stderr to /dev/null. */
typedef struct tu_proc {
    const char *env;          /* "NAME=VALUE" put into its environment; NULL: BFSHARD_TEST_SIGNAL unset */
    int out_fd;               /* its stdout; 0: /dev/null */
    const char *errf;         /* file its stderr goes to; NULL: /dev/null */
    unsigned long long fsize; /* RLIMIT_FSIZE, 0 = none (then stderr reaches errf through a `cat`, as
                               * the limit would cut the message short; tu_run reaps it) */
} tu_proc;
/* Fork and exec the CLI (tu_bfshard(); argv NULL-terminated, argv[0] only its name), with
 * SIGPIPE default and SIGXFSZ ignored (a file-size limit is an error to report, not a death). */
pid_t tu_spawn(char *const argv[], const tu_proc *p);
/* Reap pid: its exit code, or 1000 + the signal that ended it. */
int tu_wait(pid_t pid);
/* Each file of dir but hidden ones, read whole, given to fn in a child process that must
 * exit 0 (a crash, an abort, or with leak_check under ASan a leak, fails the test naming the
 * input). Returns how many were replayed. The fuzz corpora's replay (test_reliability,
 * test_fuzz_readers). */
int tu_replay_dir(const char *dir, int (*fn)(const uint8_t *, size_t), bool leak_check);
/* tu_spawn + tu_wait (and the `cat` of an fsize run). */
int tu_run(char *const argv[], const tu_proc *p);
/* An inotify descriptor watching dir for the events in mask (close it when done). */
int tu_watch(const char *dir, uint32_t mask);
/* SIGKILL child pid as soon as ifd reports an event in mask on `name`. Reaps it, with its
 * tu_wait code in *rc. True when the event came and the kill was sent; false when the child
 * exited first, or when timeout_s passed (then it is killed all the same). */
bool tu_kill_on_event(int ifd, pid_t pid, const char *name, uint32_t mask, double timeout_s, int *rc);

/* ---- reads of byte ranges (bfs_read_ranges, bfs_read_ranges_zst) ------------------------- */
typedef int (*tu_read_ranges_fn)(const char *path, const bfs_range *ranges, size_t n, int threads);
/* The ranges ol[i] = {offset, length} of path read by `read` with `threads` into one buffer
 * each, guarded by 0xA5 bytes on both sides: every byte equals want[offset...] and every guard
 * is untouched (the error is printed when the read fails). */
void tu_check_ranges(tu_read_ranges_fn read, const char *path, const uint8_t *want, const uint64_t (*ol)[2],
                     size_t n, int threads);
/* in compressed by bfs_compress_file_opts into out (zstd level, mode BFS_ZST_PLAIN or
 * BFS_ZST_BYTEGROUP, frames of frame bytes (0: the default), threads, replacing out); fails
 * the test on an error or a copy of no frame; returns its frames. */
uint64_t tu_compress(const char *in, const char *out, int level, int mode, uint64_t frame, int threads);
/* A safetensors file of n BF16 tensors "t0".."t{n-1}" of sizes[i] bytes (even) laid end to
 * end, byte i of the data byte_at(i) (BF16-like values: a few distinct high bytes, varied
 * low bytes, so byte grouping pays), written to path. */
void tu_write_st_bf16(const char *path, const size_t *sizes, int n);
uint8_t tu_bf16_byte_at(size_t i);

/* A thread calling bfs_cancel() every 200 us from tu_canceller_start until tu_canceller_stop. */
typedef struct tu_canceller {
    pthread_t t;
    atomic_int stop;
} tu_canceller;
void tu_canceller_start(tu_canceller *c);
void tu_canceller_stop(tu_canceller *c);

#endif
