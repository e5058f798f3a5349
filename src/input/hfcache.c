/*
 * INPUT named as a model in the local Hugging Face cache, resolved offline the way
 * huggingface_hub resolves it (file_download.py try_to_load_from_cache, constants.py):
 *
 *   cache   $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
 *           $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
 *   folder  CACHE/models--ORG--NAME         (repo id "ORG/NAME", '/' -> "--")
 *   commit  the text of FOLDER/refs/REVISION when that file exists (a branch or tag),
 *           else REVISION itself (a commit hash)
 *   result  FOLDER/snapshots/COMMIT         (files there are symlinks into ../../blobs)
 *
 * An existing path is taken as a path first (a local "org/name" directory wins, as in
 * transformers' from_pretrained), except a models--ORG--NAME folder, which is resolved.
 * Never touches the network. This file owns bfs_hf_resolve and nothing else.
 */
#include "input/input.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BFS_HF_PREFIX "models--"

static bool bfs__is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool bfs__is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* huggingface_hub's validate_repo_id: [\w.-]+ optionally "ORG/" before, no "--" or "..",
 * not beginning or ending with '-' or '.', at most 96 characters. */
static bool bfs__is_repo_id(const char *s)
{
    const size_t n = strlen(s);
    int slashes = 0;
    if (n == 0 || n > 96 || strstr(s, "--") || strstr(s, ".."))
        return false;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (c == '/') {
            if (++slashes > 1 || i == 0 || i == n - 1)
                return false;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
        const bool edge = i == 0 || i == n - 1 || s[i - 1] == '/' || s[i + 1] == '/';
        if (edge && (c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* A repo id that is more likely a mistyped path: its first component is a local
 * directory, or it names a file bfshard reads. */
static bool bfs__looks_like_path(const char *s)
{
    static const char *const ext[] = {".safetensors", ".json", ".zst", ".bfz"};
    const char *slash = strchr(s, '/');
    const size_t n = strlen(s);
    char first[128];
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (n >= strlen(ext[i]) && !strcmp(s + n - strlen(ext[i]), ext[i]))
            return true;
    if (!slash || (size_t)(slash - s) >= sizeof first)
        return false;
    snprintf(first, sizeof first, "%.*s", (int)(slash - s), s);
    return bfs__is_dir(first);
}

/* A revision or a ref's content: no empty, ".", ".." or absolute component. */
static bool bfs__is_safe_rev(const char *r)
{
    if (!*r || *r == '/')
        return false;
    for (const char *p = r; *p;) {
        const char *e = strchr(p, '/');
        const size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == 0 || (k == 1 && p[0] == '.') || (k == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += k + (e ? 1 : 0);
        if (e && !*p)
            return false;
    }
    return true;
}

/* The hub cache directory (new string) and which variable named it. */
static char *bfs__hub_cache(const char **from)
{
    const char *v;
    char *home = NULL, *out = NULL;
    if ((v = getenv("HF_HUB_CACHE")) && *v) {
        *from = "$HF_HUB_CACHE";
        home = bfs__strdup(v);
    } else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) {
        *from = "$HUGGINGFACE_HUB_CACHE";
        home = bfs__strdup(v);
    } else {
        if ((v = getenv("HF_HOME")) && *v) {
            *from = "$HF_HOME/hub";
            home = bfs__path_join(v, "hub");
        } else if ((v = getenv("XDG_CACHE_HOME")) && *v) {
            *from = "$XDG_CACHE_HOME/huggingface/hub";
            home = bfs__path_join(v, "huggingface/hub");
        } else {
            *from = "the default, ~/.cache/huggingface/hub";
            home = bfs__strdup("~/.cache/huggingface/hub");
        }
    }
    /* expanduser: a leading "~/" (or "~") is $HOME */
    if (home && home[0] == '~' && (home[1] == '/' || home[1] == '\0')) {
        const char *h = getenv("HOME");
        out = bfs__path_join(h && *h ? h : "/", home[1] ? home + 2 : "");
        free(home);
        return out;
    }
    return home;
}

/* "refs: main, v1; snapshots: 0123..." of a cache folder, for an error message. */
static void bfs__list_cached(const char *folder, char *buf, size_t cap)
{
    static const char *const sub[2] = {"refs", "snapshots"};
    size_t k = 0;
    buf[0] = '\0';
    for (int s = 0; s < 2; s++) {
        char *p = bfs__path_join(folder, sub[s]);
        DIR *d = p ? opendir(p) : NULL;
        int n = 0;
        struct dirent *e;
        k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, "%s%s:", s ? "; " : "", sub[s]);
        while (d && (e = readdir(d)) != NULL && k < cap) {
            if (e->d_name[0] == '.')
                continue;
            k += (size_t)snprintf(buf + k, cap - k, "%s %s", n++ ? "," : "", e->d_name);
        }
        if (!n && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, " none");
        if (d)
            closedir(d);
        free(p);
    }
}

/* FOLDER/snapshots/COMMIT for revision rev of the cache folder; `name` names the model. */
static int bfs__resolve_folder(const char *folder, const char *name, const char *rev, char **out)
{
    int rc = 0;
    char *refs = NULL, *ref = NULL, *commit = NULL, *snaps = NULL, *snap = NULL;
    char have[1024];
    size_t len = 0;
    if (!bfs__is_safe_rev(rev))
        return bfs__err(BFS_EUSAGE, "--revision '%s': not a branch, tag or commit name", rev);
    refs = bfs__path_join(folder, "refs");
    ref = refs ? bfs__path_join(refs, rev) : NULL;
    if (!ref)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (bfs__is_file(ref)) {
        BFS_TRY(bfs__read_small_file(ref, 4096, &commit, &len));
        while (len && (commit[len - 1] == '\n' || commit[len - 1] == '\r' || commit[len - 1] == ' '))
            commit[--len] = '\0';
        if (!bfs__is_safe_rev(commit) || strchr(commit, '/'))
            BFS_FAIL(BFS_EINPUT, "%s: does not hold a commit hash", ref);
    } else {
        commit = bfs__strdup(rev);
        if (!commit)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    snaps = bfs__path_join(folder, "snapshots");
    snap = snaps ? bfs__path_join(snaps, commit) : NULL;
    if (!snap)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (!bfs__is_dir(snap)) {
        bfs__list_cached(folder, have, sizeof have);
        if (strcmp(commit, rev) != 0)
            BFS_FAIL(BFS_EINPUT, "%s: revision '%s' is commit %s, whose snapshot %s is not in the cache (%s): download it with `hf download %s --revision %s`",
                     name, rev, commit, snap, have, name, rev);
        BFS_FAIL(BFS_EINPUT, "%s: revision '%s' is not in the Hugging Face cache at %s (%s): download it with `hf download %s --revision %s` (or `huggingface-cli download`)",
                 name, rev, folder, have, name, rev);
    }
    *out = snap;
    snap = NULL;
cleanup:
    free(refs);
    free(ref);
    free(commit);
    free(snaps);
    free(snap);
    return rc;
}

/* The base name of p without trailing slashes, into buf. */
static const char *bfs__base(const char *p, char *buf, size_t cap)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/')
        b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), p + b);
    return buf;
}

int bfs__hf_resolve_dup(const char *input, const char *revision, char **out)
{
    int rc = 0;
    char *cache = NULL, *folder = NULL, *sub = NULL, base[4096];
    const char *from = "";
    *out = NULL;
    if (!input || !*input)
        return bfs__err(BFS_EUSAGE, "no input given");
    if (revision && !*revision)
        revision = NULL;

    struct stat sb;
    if (stat(input, &sb) == 0) {
        /* a path; a cache folder models--ORG--NAME is resolved to its snapshot */
        sub = bfs__path_join(input, "snapshots");
        if (!sub)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        if (S_ISDIR(sb.st_mode) && !strncmp(bfs__base(input, base, sizeof base), BFS_HF_PREFIX, strlen(BFS_HF_PREFIX)) &&
            bfs__is_dir(sub)) {
            BFS_TRY(bfs__resolve_folder(input, base, revision ? revision : "main", out));
            goto cleanup;
        }
        if (revision)
            BFS_FAIL(BFS_EUSAGE, "--revision is for a Hugging Face repo id (ORG/NAME) or a models--ORG--NAME cache folder; %s is a path",
                     input);
        *out = bfs__strdup(input);
        if (!*out)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        goto cleanup;
    }
    if (!bfs__is_repo_id(input) || bfs__looks_like_path(input)) {
        /* neither a path nor a repo id: input.c says that it cannot be accessed */
        if (revision)
            BFS_FAIL(BFS_EUSAGE, "--revision is for a Hugging Face repo id (ORG/NAME); '%s' is not one", input);
        *out = bfs__strdup(input);
        if (!*out)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        goto cleanup;
    }
    cache = bfs__hub_cache(&from);
    snprintf(base, sizeof base, BFS_HF_PREFIX "%s", input);
    for (char *p = base; *p; p++)
        if (*p == '/') {
            memmove(p + 2, p + 1, strlen(p + 1) + 1);
            p[0] = p[1] = '-';
            p++;
        }
    folder = cache ? bfs__path_join(cache, base) : NULL;
    if (!folder)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (!bfs__is_dir(folder))
        BFS_FAIL(BFS_EINPUT, "%s: no such file or directory, and not in the Hugging Face cache (%s, from %s): download it with `hf download %s` (or `huggingface-cli download %s`), or set HF_HUB_CACHE or HF_HOME to the cache that holds it; bfshard never uses the network",
                 input, folder, from, input, input);
    BFS_TRY(bfs__resolve_folder(folder, input, revision ? revision : "main", out));
cleanup:
    free(cache);
    free(folder);
    free(sub);
    return rc;
}

int bfs_hf_resolve(const char *input, const char *revision, char *out, size_t cap)
{
    char *p = NULL;
    bfs__err_clear();
    int rc = bfs__hf_resolve_dup(input, revision, &p);
    if (rc == 0 && (!out || strlen(p) >= cap))
        rc = bfs__err(BFS_EUSAGE, "bfs_hf_resolve: the path (%zu bytes) does not fit the buffer (%zu)", strlen(p) + 1, cap);
    if (rc == 0)
        memcpy(out, p, strlen(p) + 1);
    free(p);
    return rc;
}
