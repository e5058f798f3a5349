/* OUTDIR (outdir.c): where it may be, the journal of an interrupted run
 * (.bfshard-inprogress: the plan fingerprint, then "HASH  NAME" of every committed rank
 * file), resuming from it, and preparing the directory; (outdir_own.c) which of its files
 * are ours, and its lock. */
#ifndef BFS_OUTDIR_H
#define BFS_OUTDIR_H

#include "plan/plan.h"

#include <limits.h>
#include <stdbool.h>

#define BFS_JOURNAL_NAME ".bfshard-inprogress"
#define BFS_ZJOURNAL_NAME ".bfshard-compress-inprogress" /* compress OUTDIR: "+ NAME" lines */
#define BFS_LOCK_NAME ".bfshard.lock"                     /* flock'ed; holds the writer's pid */

/* Files beside the weights that a BF16 checkpoint needs unchanged (copied by convert). */
extern const char *const bfs__aux_files[];
extern const size_t bfs__naux;

/* OUTDIR must not be the input directory or inside it, and no input file may lie inside OUTDIR. */
int bfs__outdir_check_paths(const char *input, const char *outdir, const bfs_input *in);
/* A finished conversion with this fingerprint is in OUTDIR and verifies (a rerun has
 * nothing to do); then a journal left by a run killed after its manifest is removed. */
bool bfs__outdir_already_done(const char *outdir, const char *fingerprint);

/* One writer per OUTDIR: flock on OUTDIR/.bfshard.lock (create: mkdir OUTDIR first).
 * Held by another process: BFS_EEXIST naming its pid. Unlock removes the lock file (and,
 * when failed, the directory if this run created it and it is empty).
 * A whole run, merge and compress OUTDIR take it exclusively (bfs__outdir_lock); a part of
 * a conversion takes it shared, so the parts of one conversion run side by side
 * and none of those three runs meanwhile, and its own part lock .bfshard.lock-LIST
 * exclusively, so one process writes a part (bfs__outdir_lock_part). The last part out
 * removes the shared lock file. */
#define BFS_PART_LOCK_PREFIX BFS_LOCK_NAME "-"
typedef struct bfs_outdir_lock {
    int fd, dirfd;
    bool created;
    bool part;                 /* pfd and pname are set */
    int pfd;                   /* the part lock */
    char pname[NAME_MAX + 1];
} bfs_outdir_lock;
int bfs__outdir_lock(const char *outdir, bool create, bfs_outdir_lock *lk);
int bfs__outdir_lock_part(const char *outdir, bool create, const char *list, bfs_outdir_lock *lk);
void bfs__outdir_unlock(bfs_outdir_lock *lk, const char *outdir, bool failed);

/* The files of OUTDIR that bfshard wrote: the names its manifest records (and their
 * compressed copies, the manifest, the sums file), those its journals record, and the
 * same for every part's manifest and journal. */
typedef struct bfs_owned {
    char **names;
    size_t n, cap;
} bfs_owned;
int bfs__owned_load(int dirfd, const char *outdir, bfs_owned *o);
bool bfs__owned_has(const bfs_owned *o, const char *name, size_t len);
void bfs__owned_free(bfs_owned *o);
/* name is ours to remove or replace: recorded, one of our hidden files (locks, journals,
 * a part's too), or a temporary ".X.partial" / ".X.PID.partial" of a name bfshard writes. */
bool bfs__outdir_is_ours(const bfs_owned *o, const char *name);
/* BFS_EEXIST naming OUTDIR/name when it exists and is not ours. */
int bfs__outdir_check_foreign(int dirfd, const char *outdir, const bfs_owned *o, const char *name);
/* name is a part's lock ".bfshard.lock-LIST". */
bool bfs__is_part_lock(const char *name);
/* The journal `name` in OUTDIR into *text (malloc'ed, NUL-terminated); NULL when absent,
 * unreadable or over 16 MiB (only out of memory fails). */
int bfs__read_journal(int dirfd, const char *name, char **text);
/* Append a line to a journal (name) in OUTDIR, fdatasync'ed. */
int bfs__journal_append(int dirfd, const char *outdir, const char *name, const char *line);

/* Open OUTDIR (*dirfd). Every name in outputs (what this run may write) must be absent or
 * ours. Then empty it of our files — or, when its journal holds this fingerprint (and not
 * force), resume: rank files the journal vouches for and whose hash still matches are kept
 * (reused[f], file_hex[f]); only temporaries go. A new run starts a journal naming outputs.
 * Files that no manifest or journal of bfshard records are never removed. */
int bfs__outdir_prepare(const char *outdir, const char *fingerprint, bool force, const bfs_plan *plan,
                        const char *const *outputs, size_t nout, int *dirfd, bool *reused, char (*file_hex)[33]);
/* A part of a conversion: the same for the rank files mine[] only, in an OUTDIR
 * other parts may share (at the same time). Every name in outputs must be absent or ours.
 * Refuses (BFS_EPARTS) another conversion's parts or manifest there (--force removes
 * those, unless that part is being written now: BFS_EEXIST), a part whose ranks overlap
 * ours, and (without --force) a file no manifest or journal of bfshard records; removes
 * only our own recorded rank files, their temporaries and our part manifest (kept when
 * resuming from our journal `jname`); never another part's files nor the user's. A new
 * part starts its journal naming outputs. */
int bfs__outdir_prepare_part(const char *outdir, const char *fingerprint, bool force, const bfs_plan *plan,
                             const bool *mine, const char *jname, const char *pname, const char *const *outputs,
                             size_t nout, int *dirfd, bool *reused, char (*file_hex)[33]);
/* With the OUTDIR lock held exclusively (merge): remove what killed parts left, their
 * temporaries of names bfshard writes and their part locks. */
void bfs__outdir_remove_debris(int dirfd);
/* A part with this fingerprint and these ranks is finished here: OUTDIR's merged manifest
 * or our part manifest `pname` verifies; then our journal `jname` is removed. */
bool bfs__outdir_part_done(const char *outdir, const char *fingerprint, const char *pname, const char *jname);
/* BFS_EIO when the free space cannot hold the rank files still to write. */
int bfs__outdir_check_space(int dirfd, const char *outdir, const bfs_plan *plan, const bool *reused);
/* Record a committed rank file in the journal (fdatasync'ed). */
int bfs__outdir_journal_add(int dirfd, const char *outdir, const char *jname, const char *hex, const char *name);
/* The run is complete (its manifest committed): the journal goes. */
void bfs__outdir_journal_remove(int dirfd, const char *jname);

#endif
