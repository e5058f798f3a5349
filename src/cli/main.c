/* bfshard command line. Uses only the public API (include/bfshard.h). */
#include "bfshard.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const usage_main =
    "usage: bfshard COMMAND [OPTIONS]\n"
    "\n"
    "Convert quantized Hugging Face checkpoints (MXFP4 as in gpt-oss, bitsandbytes NF4/FP4)\n"
    "into BF16 checkpoints pre-sharded for every FSDP rank, with integrity hashes.\n"
    "\n"
    "commands:\n"
    "  convert INPUT OUTDIR --world-size W   write one BF16 rank file per FSDP rank\n"
    "  inspect INPUT [--world-size W]        show tensors, formats, the plan and memory\n"
    "  verify OUTDIR                         re-hash every file against the manifest\n"
    "\n"
    "  bfshard COMMAND --help    options of a command\n"
    "  bfshard --version\n"
    "\n"
    "exit codes: 0 ok, 1 internal, 2 usage, 3 bad input, 4 I/O, 5 memory/budget,\n"
    "            6 device, 7 verification failed, 8 output exists, 9 interrupted\n";

static const char *const usage_convert =
    "usage: bfshard convert INPUT OUTDIR --world-size W [options]\n"
    "\n"
    "INPUT is a .safetensors file or a directory (with or without model.safetensors.index.json).\n"
    "\n"
    "  --world-size W        number of FSDP ranks (default 1)\n"
    "  --layout dcp|hf       dcp: one file per rank for torch DCP's HuggingFaceStorageReader (default);\n"
    "                        hf: a consolidated from_pretrained-ready checkpoint (needs --world-size 1)\n"
    "  --max-shard-size N    hf layout: split files at N bytes (default 5GB)\n"
    "  --device D            auto (CUDA when present, else CPU; default), cpu, cuda, cuda:N[,M...]\n"
    "  --threads N           CPU threads (default: all online CPUs)\n"
    "  --mem BYTES           host buffer budget, K/M/G suffixes (default 256M)\n"
    "  --gpu-mem BYTES       device buffer budget (default 1G)\n"
    "  --mxfp4-layout L      hf: transposed [E, in, out] as transformers >= 4.56 (default);\n"
    "                        openai: untransposed [E, out, in] as openai/gpt-oss\n"
    "  --keep-dtype          keep F32/F16/F64 tensors that are not quantized (default: cast to BF16)\n"
    "  --force               replace bfshard's files in an existing non-empty OUTDIR\n"
    "  --cpu-level L         scalar|avx2|avx512: force a CPU kernel level (default: best)\n"
    "  --quiet               no progress, no log lines\n"
    "  --json                print a machine-readable summary on stdout\n"
    "\n"
    "A run that is interrupted leaves no incomplete file under a final name; running the same\n"
    "command again reuses the rank files that were finished and verify.\n";

static const char *const usage_inspect =
    "usage: bfshard inspect INPUT [--world-size W] [--layout dcp|hf] [--mem BYTES]\n"
    "                       [--mxfp4-layout hf|openai] [--keep-dtype] [--json]\n"
    "\n"
    "Lists every tensor with its dtype, shape and detected format, the plan per rank\n"
    "(tensors, bytes) and the host memory the conversion will need.\n";

static const char *const usage_verify =
    "usage: bfshard verify OUTDIR [--quiet] [--json]\n"
    "\n"
    "Re-hashes every file of OUTDIR against bfshard.manifest.json. Exit 0 when all match;\n"
    "otherwise names each bad file, tensor and byte range and exits 7.\n";

static int fail(int code, const char *what)
{
    fprintf(stderr, "bfshard: error: %s\n", what && *what ? what : bfs_strerror(code));
    return code < 0 ? -code : code;
}

static int usage_error(const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "bfshard: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", usage);
    return -BFS_EUSAGE;
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end = NULL;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    uint64_t mul = 1;
    if (*end) {
        const int si = end[1] == 'B' || end[1] == 'b';
        const uint64_t k = si ? 1000 : 1024;
        switch (*end | 0x20) {
        case 'k': mul = k; break;
        case 'm': mul = k * k; break;
        case 'g': mul = k * k * k; break;
        case 't': mul = k * k * k * k; break;
        default: return -1;
        }
        const char *rest = end + 1 + si;
        if (!si && (rest[0] == 'i') && (rest[1] == 'B' || rest[1] == 'b'))
            rest += 2;
        if (*rest)
            return -1;
    }
    if (v && mul > UINT64_MAX / v)
        return -1;
    *out = v * mul;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    if (!s)
        return -1;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* ---- progress ------------------------------------------------------------------ */
typedef struct {
    int tty;
    double t0, last;
    uint64_t last_bytes;
} prog_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_progress(const bfs_progress *p, void *user)
{
    prog_state *s = user;
    const double t = now_s();
    const int done = p->bytes_done >= p->bytes_total;
    if (!done && t - s->last < (s->tty ? 0.2 : 10.0))
        return;
    s->last = t;
    const double el = t - s->t0, rate = el > 0 ? (double)p->bytes_done / el : 0;
    const double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1;
    const double eta = rate > 0 ? (double)(p->bytes_total - p->bytes_done) / rate : 0;
    if (s->tty) {
        char bar[31];
        const int n = (int)(frac * 30);
        for (int i = 0; i < 30; i++)
            bar[i] = i < n ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %5.1f%% %9.1f/%.1f MB %7.1f MB/s ETA %4.0fs  ", bar, frac * 100,
                (double)p->bytes_done / 1e6, (double)p->bytes_total / 1e6, rate / 1e6, eta);
        if (done)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "bfshard: %.1f%% %.1f/%.1f MB %.1f MB/s ETA %.0fs (%s)\n", frac * 100,
                (double)p->bytes_done / 1e6, (double)p->bytes_total / 1e6, rate / 1e6, eta, p->tensor);
    }
    fflush(stderr);
}

static void on_signal(int sig)
{
    (void)sig;
    bfs_cancel();
}

/* ---- commands ------------------------------------------------------------------ */
typedef struct {
    bfs_convert_opts o;
    int json, quiet;
    const char *pos[2];
    int npos;
} cli_args;

static int parse_common(int argc, char **argv, cli_args *a, const char *usage, int maxpos)
{
    bfs_convert_opts_init(&a->o);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(usage, stdout);
            exit(0);
        } else if (!strcmp(s, "--json")) {
            a->json = 1;
        } else if (!strcmp(s, "--quiet") || !strcmp(s, "-q")) {
            a->quiet = 1;
        } else if (!strcmp(s, "--keep-dtype")) {
            a->o.keep_dtype = 1;
        } else if (!strcmp(s, "--force")) {
            a->o.force = 1;
        } else if (!strcmp(s, "--world-size") || !strcmp(s, "-w")) {
            if (parse_int(v, 1, 1000000, &a->o.world_size))
                return usage_error(usage, "--world-size needs an integer from 1 to 1000000, got '%s'", v ? v : "");
            i++;
        } else if (!strcmp(s, "--threads")) {
            if (parse_int(v, 0, 4096, &a->o.threads))
                return usage_error(usage, "--threads needs an integer, got '%s'", v ? v : "");
            i++;
        } else if (!strcmp(s, "--mem") || !strcmp(s, "--gpu-mem") || !strcmp(s, "--max-shard-size")) {
            uint64_t x;
            if (parse_size(v, &x) || x == 0)
                return usage_error(usage, "%s needs a size like 512M or 2G", s);
            if (!strcmp(s, "--mem"))
                a->o.mem = x;
            else if (!strcmp(s, "--gpu-mem"))
                a->o.gpu_mem = x;
            else
                a->o.max_shard_size = x;
            i++;
        } else if (!strcmp(s, "--layout")) {
            if (v && !strcmp(v, "dcp"))
                a->o.layout = BFS_LAYOUT_DCP;
            else if (v && !strcmp(v, "hf"))
                a->o.layout = BFS_LAYOUT_HF;
            else
                return usage_error(usage, "--layout must be dcp or hf, got '%s'", v ? v : "");
            i++;
        } else if (!strcmp(s, "--mxfp4-layout")) {
            if (v && !strcmp(v, "hf"))
                a->o.mxfp4_layout = BFS_MXFP4_HF;
            else if (v && !strcmp(v, "openai"))
                a->o.mxfp4_layout = BFS_MXFP4_OPENAI;
            else
                return usage_error(usage, "--mxfp4-layout must be hf or openai, got '%s'", v ? v : "");
            i++;
        } else if (!strcmp(s, "--device")) {
            if (!v)
                return usage_error(usage, "%s needs a value", s);
            a->o.device = v;
            i++;
        } else if (!strcmp(s, "--cpu-level")) {
            if (v && !strcmp(v, "scalar")) a->o.cpu_level = 0;
            else if (v && !strcmp(v, "avx2")) a->o.cpu_level = 1;
            else if (v && !strcmp(v, "avx512")) a->o.cpu_level = 2;
            else return usage_error(usage, "--cpu-level must be scalar, avx2 or avx512, got '%s'", v ? v : "");
            i++;
        } else if (s[0] == '-' && s[1]) {
            return usage_error(usage, "unknown option '%s'", s);
        } else {
            if (a->npos >= maxpos)
                return usage_error(usage, "unexpected argument '%s'", s);
            a->pos[a->npos++] = s;
        }
    }
    if (a->npos < maxpos)
        return usage_error(usage, "%s", maxpos == 2 ? "needs INPUT and OUTDIR" : "needs a path");
    return 0;
}

static int cmd_convert(int argc, char **argv)
{
    cli_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_common(argc, argv, &a, usage_convert, 2);
    if (rc)
        return rc;
    prog_state ps = {.tty = isatty(2), .t0 = now_s()};
    if (!a.quiet) {
        a.o.progress = on_progress;
        a.o.progress_user = &ps;
        a.o.log = stderr;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    bfs_convert_result res;
    rc = bfs_convert(a.pos[0], a.pos[1], &a.o, &res);
    if (ps.tty && !a.quiet && rc < 0)
        fputc('\n', stderr);
    if (a.json) {
        printf("{\"ok\": %s, \"exit_code\": %d, \"error\": \"", rc == 0 ? "true" : "false", rc < 0 ? -rc : 0);
        for (const char *p = rc < 0 ? bfs_last_error() : ""; *p; p++) {
            if (*p == '"' || *p == '\\')
                putchar('\\');
            if ((unsigned char)*p >= 0x20)
                putchar(*p);
        }
        printf("\", \"output\": \"%s\", \"world_size\": %d, \"tensors\": %llu, \"bytes_written\": %llu, "
               "\"files_written\": %llu, \"files_reused\": %llu, \"seconds\": %.3f, \"gb_per_s\": %.3f, "
               "\"host_buffer_bytes\": %llu, \"gpu_buffer_bytes\": %llu, \"backend\": \"%s\"}\n",
               a.pos[1], a.o.world_size, (unsigned long long)res.tensors, (unsigned long long)res.bytes_written,
               (unsigned long long)res.files_written, (unsigned long long)res.files_reused, res.seconds,
               res.seconds > 0 ? (double)res.bytes_written / res.seconds / 1e9 : 0.0,
               (unsigned long long)res.host_buffer_bytes, (unsigned long long)res.gpu_buffer_bytes, res.backend);
    }
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a.quiet)
        fprintf(stderr, "bfshard: wrote %llu bytes in %llu file(s)%s to %s in %.2f s (%.2f GB/s, %s)\n",
                (unsigned long long)res.bytes_written, (unsigned long long)res.files_written,
                res.files_reused ? " (others reused)" : "", a.pos[1], res.seconds,
                res.seconds > 0 ? (double)res.bytes_written / res.seconds / 1e9 : 0.0, res.backend);
    return 0;
}

static int cmd_inspect(int argc, char **argv)
{
    cli_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_common(argc, argv, &a, usage_inspect, 1);
    if (rc)
        return rc;
    rc = bfs_inspect(a.pos[0], &a.o, a.json, stdout);
    return rc < 0 ? fail(rc, bfs_last_error()) : 0;
}

static int cmd_verify(int argc, char **argv)
{
    cli_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_common(argc, argv, &a, usage_verify, 1);
    if (rc)
        return rc;
    uint64_t n = 0;
    rc = bfs_verify(a.pos[0], a.quiet ? NULL : stderr, &n);
    if (a.json)
        printf("{\"ok\": %s, \"exit_code\": %d, \"bytes_checked\": %llu}\n", rc == 0 ? "true" : "false",
               rc < 0 ? -rc : 0, (unsigned long long)n);
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a.quiet)
        fprintf(stderr, "bfshard: %s: OK (%llu bytes verified)\n", a.pos[0], (unsigned long long)n);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return -BFS_EUSAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("bfshard %s (cpu: %s; cuda: %s, %d device(s))\n", BFS_VERSION_STRING,
               bfs_cpu_level_name(bfs_cpu_best_level()), bfs_cuda_built() ? "built" : "not built",
               bfs_cuda_device_count());
        return 0;
    }
    if (!strcmp(cmd, "convert"))
        return cmd_convert(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect"))
        return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "verify"))
        return cmd_verify(argc - 2, argv + 2);
    fprintf(stderr, "bfshard: error: unknown command '%s'\n\n%s", cmd, usage_main);
    return -BFS_EUSAGE;
}
