/*
 * Know what you read: the must-refuse corpus.
 *
 * bfshard decides support from config.json and the tensors (src/formats/refuse.c);
 * the edge cases of that verdict are tests/test_detect.c.
 *
 * fixtures/refuse/cases.tsv (written by fixtures/refuse/gen_refuse.py, see
 * fixtures/refuse/README.md) lists every case: its input, the exit code, and words
 * one of which the error line must contain. For a case that must be refused (exit 3):
 *   `bfshard convert CASE OUT` exits 3, prints exactly one line on stderr naming the
 *   method or a tensor, and leaves no *.safetensors in OUT;
 *   `bfshard inspect CASE` exits 3 too (the verdict before any work).
 * For a positive (exit 0): convert and inspect exit 0 and verify passes.
 *
 * The corpus itself is checked too: cases.tsv parses, every input exists, the corpus
 * is under 1 MB.
 */
#include "testutil.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define REFUSE_DIR "fixtures/refuse"
#define MAX_CASES 64

typedef struct {
    char name[128];
    char input[512];
    int exit_code;
    char needles[512];
} refuse_case;

static refuse_case cases[MAX_CASES];
static int ncases;

static int load_cases(void)
{
    FILE *f = fopen(REFUSE_DIR "/cases.tsv", "r");
    char line[2048];
    if (!f)
        return -1;
    ncases = 0;
    while (fgets(line, sizeof line, f) && ncases < MAX_CASES) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        refuse_case *c = &cases[ncases];
        char *save = NULL, *tok;
        memset(c, 0, sizeof *c);
        if (!(tok = strtok_r(line, "\t", &save)))
            continue;
        snprintf(c->name, sizeof c->name, "%s", tok);
        if (!(tok = strtok_r(NULL, "\t", &save)))
            continue;
        snprintf(c->input, sizeof c->input, "%s", tok);
        if (!(tok = strtok_r(NULL, "\t", &save)))
            continue;
        c->exit_code = atoi(tok);
        if ((tok = strtok_r(NULL, "\t", &save)))
            snprintf(c->needles, sizeof c->needles, "%s", tok);
        ncases++;
    }
    fclose(f);
    return 0;
}

static int contains_ci(const char *hay, const char *needle)
{
    const size_t n = strlen(needle);
    if (!n)
        return 1;
    for (const char *p = hay; *p; p++)
        if (!strncasecmp(p, needle, n))
            return 1;
    return 0;
}

/* any of the '|'-separated words */
static int names_one_of(const char *text, const char *needles)
{
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", needles);
    for (char *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save))
        if (contains_ci(text, t))
            return 1;
    return 0;
}

static int count_safetensors(const char *dir)
{
    char **names = tu_dir_names(dir);
    int n = 0;
    for (size_t i = 0; names && names[i]; i++)
        n += strlen(names[i]) >= 12 && strstr(names[i], ".safetensors") != NULL;
    tu_names_free(names);
    return n;
}

/* Runs `bfshard ARGS`, stderr into errf; returns the exit status, stderr text in err. */
static int run(const char *errf, char *err, size_t cap, int *lines, const char *args)
{
    const int rc = tu_sh("%s %s 2>'%s' >/dev/null </dev/null", tu_bfshard(), args, errf);
    size_t n = 0;
    uint8_t *b = tu_read_file(errf, &n);
    int nl = 0;
    for (size_t i = 0; b && i < n; i++)
        nl += b[i] == '\n';
    if (n && b && b[n - 1] != '\n')
        nl++;
    snprintf(err, cap, "%.*s", (int)n, b ? (char *)b : "");
    free(b);
    if (lines)
        *lines = nl;
    return rc;
}

static void one_case(void **state)
{
    const refuse_case *c = *state;
    char *tmp = tu_tmpdir("refuse");
    char out[4096], errf[4096], args[8192], err[8192];
    int lines = 0;
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(errf, sizeof errf, "%s/err", tmp);
    int failed = 0;

    snprintf(args, sizeof args, "inspect '%s/%s'", REFUSE_DIR, c->input);
    const int rci = run(errf, err, sizeof err, &lines, args);
    if (rci != c->exit_code) {
        fprintf(stderr, "  %s: inspect exited %d, expected %d: %s\n", c->name, rci, c->exit_code, err);
        failed = 1;
    }

    snprintf(args, sizeof args, "convert '%s/%s' '%s' --device cpu --quiet", REFUSE_DIR, c->input, out);
    const int rc = run(errf, err, sizeof err, &lines, args);
    if (rc != c->exit_code) {
        fprintf(stderr, "  %s: convert exited %d, expected %d: %s\n", c->name, rc, c->exit_code, err);
        failed = 1;
    }
    if (c->exit_code == 3) {
        if (rc == 3 && lines != 1) {
            fprintf(stderr, "  %s: %d lines on stderr, expected one: %s\n", c->name, lines, err);
            failed = 1;
        }
        if (rc == 3 && !names_one_of(err, c->needles)) {
            fprintf(stderr, "  %s: the error names none of %s: %s\n", c->name, c->needles, err);
            failed = 1;
        }
        const int nst = count_safetensors(out);
        if (nst) {
            fprintf(stderr, "  %s: %d *.safetensors file(s) left in OUTDIR\n", c->name, nst);
            failed = 1;
        }
    } else if (rc == 0) {
        snprintf(args, sizeof args, "verify '%s' --quiet", out);
        const int rv = run(errf, err, sizeof err, &lines, args);
        if (rv != 0) {
            fprintf(stderr, "  %s: verify exited %d: %s\n", c->name, rv, err);
            failed = 1;
        }
    }
    tu_rmrf(tmp);
    free(tmp);
    if (failed)
        fail_msg("%s (%s): see above", c->name, c->input);
}

/* The corpus is present, parses, and stays small. */
static void corpus_present(void **state)
{
    (void)state;
    assert_true(ncases >= 10);
    int refuse = 0, ok = 0;
    for (int i = 0; i < ncases; i++) {
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", REFUSE_DIR, cases[i].input);
        if (stat(p, &sb) != 0)
            fail_msg("case %s: %s is missing (regenerate with fixtures/refuse/gen_refuse.py)", cases[i].name, p);
        if (cases[i].exit_code == 3) {
            refuse++;
            if (!cases[i].needles[0])
                fail_msg("case %s: a must-refuse case without words to look for", cases[i].name);
        } else {
            assert_int_equal(cases[i].exit_code, 0);
            ok++;
        }
    }
    assert_true(refuse >= 8 && ok >= 1);
    assert_int_equal(tu_sh("test $(du -sk --apparent-size %s | cut -f1) -lt 1024", REFUSE_DIR), 0);
}

int main(void)
{
    if (load_cases() != 0) {
        fprintf(stderr, "test_refuse: cannot read %s/cases.tsv (run from the repository root)\n", REFUSE_DIR);
        return 1;
    }
    static struct CMUnitTest tests[MAX_CASES + 1];
    static char names[MAX_CASES][160];
    int n = 0;
    tests[n++] = (struct CMUnitTest){.name = "corpus_present", .test_func = corpus_present};
    for (int i = 0; i < ncases; i++) {
        snprintf(names[i], sizeof names[i], "%s/%s", cases[i].exit_code ? "refuse" : "accept", cases[i].name);
        tests[n++] = (struct CMUnitTest){.name = names[i], .test_func = one_case, .initial_state = &cases[i]};
    }
    if (getenv("BFS_TEST")) /* run only the tests matching this pattern */
        cmocka_set_test_filter(getenv("BFS_TEST"));
    return _cmocka_run_group_tests("test_refuse", tests, (size_t)n, NULL, NULL);
}
