/* A conversion in parts (parts.c): which ranks a part converts (a --ranks list,
 * or this process's block from the launcher's environment), the names of a part's own
 * files in OUTDIR (bfshard.part-RANKS.json, .bfshard-inprogress-RANKS). bfs_merge:
 * src/commands/merge.c. */
#ifndef BFS_PARTS_H
#define BFS_PARTS_H

#include "plan/plan.h"

#include <dirent.h>
#include <stdbool.h>

#define BFS_PART_PREFIX "bfshard.part-"
#define BFS_PART_SUFFIX ".json"
#define BFS_PART_JOURNAL_PREFIX ".bfshard-inprogress-"

/* "0-7", "3", "0-3,8-11" into mask[0..W) (calloc'ed by the caller); BFS_EUSAGE naming
 * `what` (e.g. "--ranks") when malformed, out of 0..W-1, or listing a rank twice. */
int bfs__ranks_parse(const char *spec, int W, bool *mask, const char *what);
/* The canonical list of mask ("0-3,8-11"); "" when empty. Fails when it does not fit cap. */
int bfs__ranks_format(const bool *mask, int W, char *buf, size_t cap);

/* The ranks o->ranks names ("auto" resolved from the environment) into mask[0..W);
 * how: which variables were used ("" for a list). */
int bfs__ranks_resolve(const bfs_convert_opts *o, bool *mask, char *how, size_t howcap);
/* Processes of this job on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
 * SLURM_NTASKS_PER_NODE), 1 when not set. */
int bfs__ranks_local_procs(void);

/* A part's manifest and journal names for its canonical list; 0 or BFS_EUSAGE (too long). */
int bfs__part_names(const char *canon, char *manifest, char *journal, size_t cap);
/* name is a part manifest (bfshard.part-LIST.json) or part journal (.bfshard-inprogress-LIST):
 * its LIST into list (NUL-terminated). */
bool bfs__part_name_list(const char *name, char *list, size_t cap);

/* The part manifests (bfshard.part-LIST.json) among d's entries, sorted by name, into
 * names[0..n) (malloc'ed, as is each name; the caller frees both, after a failure too). */
int bfs__part_manifests(DIR *d, char ***names, int *n);

/* A part's share of tensors[] (docs/MANIFEST.md "Parts and merge"): rank r of W owns the
 * manifest's tensors [floor(T*r/W), floor(T*(r+1)/W)) of T (sorted by name), so a part's
 * manifest lists the tensors of its ranks and merge puts them together in rank order. *lo,
 * and the count. */
uint64_t bfs__part_share(uint64_t T, int W, int r, uint64_t *lo);


#endif
