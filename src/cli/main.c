/* bfshard command line: the commands, their usage texts and option tables (parsed by
 * opts.c), progress display and exit codes. Uses only the public API (include/bfshard.h). */
#include "bfshard.h"
#include "json_out.h"
#include "opts.h"
#include "progress.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const usage_main =
    "usage: bfshard COMMAND [OPTIONS]\n"
    "\n"
    "Convert quantized Hugging Face checkpoints into BF16 checkpoints pre-sharded for every\n"
    "FSDP rank, with integrity hashes. Formats read: MXFP4 as in gpt-oss; bitsandbytes\n"
    "NF4/FP4; FP8 block (DeepSeek-V3), per-tensor and fused experts [E, out, in] (transformers\n"
    "FP8Experts, block or per-expert scales); DeepSeek-V4/V4.1 (FP8 with E8M0 or F32 block\n"
    "scales, FP4 experts); compressed-tensors FP8, INT4, NVFP4, MXFP8, MXFP4, MXFP6 and\n"
    "mixed-precision; ModelOpt FP8 and NVFP4; AMD Quark MXFP4 and FP8. Other quantized\n"
    "formats are refused (exit 3). docs/FORMATS.md has the rules.\n"
    "\n"
    "commands:\n"
    "  convert INPUT OUTDIR --world-size W   write one BF16 rank file per FSDP rank\n"
    "  inspect INPUT [--world-size W]        show tensors, formats, the plan and memory\n"
    "  verify OUTDIR|OCIDIR                  re-hash every file against the manifest (or every blob)\n"
    "  merge OUTDIR                          finish a conversion done in parts (convert --ranks)\n"
    "  pack OUTDIR OCIDIR [--tag T]          an OCI image layout (CNCF ModelPack) for registries\n"
    "  compress FILE|OUTDIR                  seekable zstd for registries (per-tensor access)\n"
    "  decompress FILE.zst [-o OUT]          restore the .safetensors file\n"
    "  extract FILE.zst TENSOR [-o OUT]      one tensor, decoding only its frames\n"
    "\n"
    "  bfshard COMMAND --help    options of a command\n"
    "  bfshard -V, --version     version, source revision, CPU level and CUDA devices\n"
    "\n"
    "exit codes: 0 ok, 1 internal, 2 usage, 3 bad input, 4 I/O, 5 memory/budget,\n"
    "            6 device, 7 verification failed, 8 output exists or is in use,\n"
    "            9 interrupted (SIGINT, SIGTERM, SIGHUP), 10 parts disagree (other\n"
    "            input/options, overlapping ranks), 11 parts incomplete\n";

static const char *const usage_convert =
    "usage: bfshard convert INPUT OUTDIR --world-size W [options]\n"
    "       bfshard convert INPUT -o OUTDIR --world-size W [options]\n"
    "\n"
    "INPUT is a .safetensors file, a directory (with or without model.safetensors.index.json),\n"
    "or a model in the local Hugging Face cache: ORG/NAME or its models--ORG--NAME folder\n"
    "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; never the network).\n"
    "\n"
    "  --revision R          a cached model's branch, tag or commit hash (default main)\n"
    "  --world-size W        number of FSDP ranks (default 1)\n"
    "  --layout dcp|hf       dcp: one file per rank for torch DCP's HuggingFaceStorageReader (default);\n"
    "                        hf: a consolidated from_pretrained-ready checkpoint (needs --world-size 1)\n"
    "  --max-shard-size N    hf layout: split files at N bytes (default 5GB)\n"
    "  --names N             transformers: the names and shapes of transformers 5's state_dict\n"
    "                        (MoE experts packed 3-D, keys renamed; docs/NAMES.md); checkpoint:\n"
    "                        the input's names; torchtitan: the input's names, each expert in the\n"
    "                        file of the rank torchtitan's FSDP gives it (docs/LOADING.md).\n"
    "                        Default: transformers for --layout dcp when the model type is in the\n"
    "                        table, else checkpoint\n"
    "  --device D            auto (CUDA when present, else CPU; default), cpu, cuda, cuda:N[,M...]\n"
    "  -T, --threads N       CPU threads (default: all online CPUs)\n"
    "  --mem BYTES           host buffer budget, K/M/G suffixes (default 256M)\n"
    "  --max-rss BYTES       pick --mem so that the peak RSS inspect predicts fits BYTES (CPU)\n"
    "  --gpu-mem BYTES       device buffer budget (default 1G)\n"
    "  --mxfp4-layout L      hf: transposed [E, in, out] as transformers >= 4.56 (default);\n"
    "                        openai: untransposed [E, out, in] as openai/gpt-oss\n"
    "  --keep-dtype          keep F32/F16/F64 tensors that are not quantized (default: cast to BF16, but those the model keeps in float32)\n"
    "  --sha256              also the SHA-256 of every file, in the same pass (a thread beside the\n"
    "                        writer): files[].sha256 in the manifest and sha256sums.txt\n"
    "                        (`sha256sum -c`), the digests `bfshard pack` then need not re-read\n"
    "  --force               replace bfshard's files (those its manifest or journal records) in a\n"
    "                        non-empty OUTDIR; other files are left alone\n"
    "  --cpu-level L         scalar|avx2|avx512: force a CPU kernel level (default: best)\n"
    "  --compress zstd[:LEVEL]            also write each rank file as seekable zstd, NAME.safetensors.zst\n"
    "                                     (level default 3; readable by zstd -d; see bfshard compress --help)\n"
    "  --compress zstd-bytegroup[:LEVEL]  ... with BF16 byte grouping, NAME.safetensors.bfz (bfshard only)\n"
    "  --ranks LIST|auto     convert only these ranks (0-7, 3, 0-3,8-11) and write a part manifest,\n"
    "                        bfshard.part-LIST.json; `bfshard merge OUTDIR` finishes. auto: this\n"
    "                        process's block of ranks from the launcher (RANK/WORLD_SIZE,\n"
    "                        OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS)\n"
    "  --parts P             --ranks auto in a Kubernetes indexed Job: P parts, this one\n"
    "                        JOB_COMPLETION_INDEX\n"
    "  -o, --output OUTDIR   the output directory, instead of the second argument\n"
    "  --progress[=json]     draw progress even when stderr is not a terminal; json: one JSON\n"
    "                        object per line on stderr ({\"progress\": {\"bytes_done\": ...}})\n"
    "  --no-progress         no progress (log lines and the summary stay)\n"
    "  -q, --quiet           no progress, no log lines, no summary\n"
    "  -v, --verbose         a progress line per unit written (the tensor in the bar)\n"
    "  --json                print a machine-readable summary on stdout\n"
    "\n"
    "A run that is interrupted leaves no incomplete file under a final name; running the same\n"
    "command again reuses the rank files that were finished and verify.\n";

static const char *const usage_inspect =
    "usage: bfshard inspect INPUT [--world-size W] [--layout dcp|hf] [--mem BYTES] [--max-rss BYTES]\n"
    "                       [--mxfp4-layout hf|openai] [--keep-dtype] [--names N] [--ranks LIST|auto]\n"
    "                       [--revision R] [--json]\n"
    "\n"
    "Lists every tensor with its dtype, shape and detected format, the plan per rank\n"
    "(tensors, bytes) and the host memory the conversion will need: the buffers and the\n"
    "peak RSS of convert --device cpu with the same options, predicted. With --ranks: that\n"
    "part's rank files, the bytes it writes, the input bytes it reads and hashes.\n"
    "INPUT as for convert.\n"
    "\n"
    "Also reads what bfshard writes: an OUTDIR (what made it, options, ranks, formats,\n"
    "hashes present, compressed copies; `bfshard verify` re-hashes) and a .zst/.bfz file\n"
    "(format, frames, each tensor and its compression ratio).\n";

static const char *const usage_verify =
    "usage: bfshard verify OUTDIR|OCIDIR [--quiet] [--json]\n"
    "\n"
    "Re-hashes every file of OUTDIR against bfshard.manifest.json (XXH3-128, and sha256 where\n"
    "convert --sha256 recorded it). Exit 0 when all match; otherwise names each bad file,\n"
    "tensor and byte range and exits 7. An OUTDIR holding only some parts (convert --ranks,\n"
    "not merged) is checked against their part manifests, and the ranks that are elsewhere\n"
    "are named.\n"
    "\n"
    "A directory holding an oci-layout file is an OCI image layout (bfshard pack): every\n"
    "bfshard artifact its index.json names is checked: every blob's sha256 and size, the\n"
    "config against the ModelPack schema and the layers, and every layer against the OUTDIR\n"
    "manifest the artifact carries (name, size, XXH3-128, sha256, media type, rank).\n";

static const char *const usage_pack =
    "usage: bfshard pack OUTDIR OCIDIR [--tag T] [--copy] [--verify] [--name N] [--revision R]\n"
    "                    [--created now|TIME] [--quiet] [--json]\n"
    "\n"
    "Packs a finished conversion (merged, and verifying: else exit 7) as an OCI image layout\n"
    "holding a CNCF ModelPack artifact: one raw layer per file, sorted by path (rank files\n"
    "application/vnd.cncf.model.weight.v1.raw, config/tokenizer/manifest files\n"
    "...weight.config.v1.raw), the config application/vnd.cncf.model.config.v1+json, the tag\n"
    "in index.json. Push it with `skopeo copy oci:OCIDIR:T docker://REGISTRY/REPO:T` or\n"
    "`oras cp --from-oci-layout OCIDIR:T REGISTRY/REPO:T` (docs/OCI.md).\n"
    "Blobs are hard links to the OUTDIR's files when OCIDIR is on the same file system (else\n"
    "copies). The same OUTDIR gives the same bytes (no time stamp unless --created). A rerun\n"
    "after a crash goes on; files in OCIDIR that bfshard did not write are never removed.\n"
    "\n"
    "  --tag T             the tag (org.opencontainers.image.ref.name; default latest)\n"
    "  --copy              copy the blobs even where hard links are possible\n"
    "  --verify            re-hash every file, even those whose sha256 convert --sha256\n"
    "                      recorded (default: those are trusted when not modified since the\n"
    "                      manifest; the others are read once, sha256 and XXH3-128 together)\n"
    "  --name N            the config's descriptor.name (default: OUTDIR's directory name)\n"
    "  --revision R        the config's descriptor.revision, e.g. the source's commit\n"
    "  --created now|TIME  the config's descriptor.createdAt (RFC 3339); default: none\n"
    "  -q, --quiet, --json no log lines; machine-readable summary on stdout\n";

static const char *const usage_merge =
    "usage: bfshard merge OUTDIR [--quiet] [--json]\n"
    "\n"
    "Finishes a conversion done in parts (convert --ranks) whose files are all in OUTDIR:\n"
    "checks that the parts come from the same input and options (else exit 10) and hold\n"
    "every rank exactly once (a rank in two parts: 10; missing: 11), then writes\n"
    "bfshard.manifest.json and xxh128sums.txt exactly as one run writes them and removes\n"
    "the part manifests. Nothing is written when a check fails.\n";

static const char *const usage_compress =
    "usage: bfshard compress FILE.safetensors|OUTDIR [options]\n"
    "\n"
    "Seekable zstd: independent frames cut at every tensor boundary and every --frame-size\n"
    "bytes, and a seek table, so `bfshard extract` reads one tensor without decompressing\n"
    "the file. The default .zst is restored byte for byte by stock `zstd -d`.\n"
    "A FILE becomes FILE.zst. For a bfshard OUTDIR every rank file becomes\n"
    "NAME.safetensors.zst, recorded in bfshard.manifest.json (files[].zst: name, size,\n"
    "xxh3_128) and xxh128sums.txt; a rank file that does not match its manifest is refused.\n"
    "\n"
    "  --level N           zstd level, 1 (fast) to 19 (small), up to 22 (default 3)\n"
    "  -T, --threads N     compression threads (default: all online CPUs)\n"
    "  --frame-size BYTES  largest frame, uncompressed (default 4M)\n"
    "  --bytegroup         BF16 byte grouping (format zstd-seekable-bf16-bytegroup-v1): about\n"
    "                      12% smaller on trained weights; writes .bfz, which only bfshard reads\n"
    "  --rm                OUTDIR: remove each rank file once its compressed copy is recorded\n"
    "  -o OUT              FILE: output path (default FILE.zst, or FILE.bfz)\n"
    "  --force             replace existing compressed files\n"
    "  -q, --quiet, --json no log lines; machine-readable summary on stdout\n";

static const char *const usage_decompress =
    "usage: bfshard decompress FILE.safetensors.zst|.bfz [-o OUT] [--force]\n"
    "\n"
    "Restores the .safetensors file (default: the name without .zst/.bfz; -o - for standard\n"
    "output), checking every frame's size and checksum.\n";

static const char *const usage_extract =
    "usage: bfshard extract FILE.safetensors.zst|.bfz TENSOR [-o OUT] [--raw] [--force]\n"
    "\n"
    "Writes TENSOR as a standalone .safetensors file holding just that tensor (default\n"
    "OUT: TENSOR.safetensors, '/' replaced by '_'), or with --raw its bytes alone\n"
    "(little-endian, row-major; -o - for standard output). Only the frames that hold\n"
    "the tensor are read and decompressed.\n";

static int fail(int code, const char *what)
{
    fprintf(stderr, "bfshard: error: %s\n", what && *what ? what : bfs_strerror(code));
    return code < 0 ? -code : code;
}

static void on_signal(int sig)
{
    (void)sig;
    bfs_cancel();
}

/* Every command: SIGINT, SIGTERM and SIGHUP ask the library to stop (it removes its
 * temporaries and returns BFS_EINTR, exit 9); no SA_RESTART, so a blocked write returns
 * EINTR and sees it. A closed pipe is a write error (exit 4), not a silent death. */
static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a write error (exit 4), not a kill */
}

/* What a command printed on standard output must have arrived: exit 4 otherwise. */
static int check_stdout(int rc)
{
    const int bad = fflush(stdout) != 0 || ferror(stdout);
    if (!bad || rc != 0)
        return rc;
    fprintf(stderr, "bfshard: error: standard output: write failed: %s\n", strerror(errno ? errno : EPIPE));
    return -BFS_EIO;
}

/* ---- options ------------------------------------------------------------------- */
typedef struct {
    bfs_convert_opts co;  /* convert, inspect, verify */
    bfs_compress_opts zo; /* compress, decompress, extract */
    bfs_pack_opts po;     /* pack */
    const char *pos[2];
    const char *out; /* -o */
    int raw, json, quiet, verbose, progress;
} cli_args;

#define AT(field) offsetof(cli_args, field)
#define FLAG(name, alias, field, val) {name, alias, CLI_FLAG, AT(field), val, 0, NULL, NULL, NULL, 0}

/* --compress zstd[:LEVEL] | zstd-bytegroup[:LEVEL]: the mode and the level (default 3). */
static const char *opt_compress(void *base, const char *v, const char **arg)
{
    bfs_convert_opts *o = &((cli_args *)base)->co;
    const char *c = v ? strchr(v, ':') : NULL;
    const size_t kl = v ? (c ? (size_t)(c - v) : strlen(v)) : 0;
    if (v && kl == 4 && !strncmp(v, "zstd", 4))
        o->compress_mode = BFS_ZST_PLAIN;
    else if (v && kl == 14 && !strncmp(v, "zstd-bytegroup", 14))
        o->compress_mode = BFS_ZST_BYTEGROUP;
    else {
        *arg = v ? v : "";
        return "--compress must be zstd[:LEVEL] or zstd-bytegroup[:LEVEL], got '%s'";
    }
    o->compress_level = 3;
    if (c && (cli_parse_int(c + 1, -7, 22, &o->compress_level) || o->compress_level == 0)) {
        *arg = c + 1;
        return "--compress: LEVEL must be a zstd level from -7 to 22 (not 0), got '%s'";
    }
    return NULL;
}

static const cli_choice layouts[] = {{"dcp", BFS_LAYOUT_DCP}, {"hf", BFS_LAYOUT_HF}, {NULL, 0}};
static const cli_choice mxfp4_layouts[] = {{"hf", BFS_MXFP4_HF}, {"openai", BFS_MXFP4_OPENAI}, {NULL, 0}};
static const cli_choice names_modes[] = {{"transformers", BFS_NAMES_TRANSFORMERS}, {"checkpoint", BFS_NAMES_CHECKPOINT},
                                          {"torchtitan", BFS_NAMES_TORCHTITAN}, {"auto", BFS_NAMES_AUTO}, {NULL, 0}};
static const cli_choice cpu_levels[] = {{"scalar", 0}, {"avx2", 1}, {"avx512", 2}, {NULL, 0}};

static const cli_choice progress_modes[] = {{"json", CLI_PROGRESS_JSON}, {"bar", CLI_PROGRESS_BAR},
                                             {"log", CLI_PROGRESS_LOG}, {NULL, 0}};

static const cli_opt output_opts[] = { /* every command */
    FLAG("--json", NULL, json, 1),
    FLAG("--quiet", "-q", quiet, 1),
    FLAG("--verbose", "-v", verbose, 1),
    {0},
};

static const cli_opt progress_opts[] = { /* convert */
    {"--progress", NULL, CLI_OPTENUM, AT(progress), CLI_PROGRESS_BAR, .choices = progress_modes,
     .err = "--progress takes no value, or =json, =bar or =log; got '%s'"},
    FLAG("--no-progress", NULL, progress, CLI_PROGRESS_NONE),
    {"--output", "-o", CLI_STR, AT(out), 1, .err = "%s needs a path", .err_names_opt = 1}, /* or OUTDIR */
    {0},
};

static const cli_opt convert_opts[] = { /* convert, inspect, verify */
    FLAG("--keep-dtype", NULL, co.keep_dtype, 1),
    FLAG("--force", NULL, co.force, 1),
    FLAG("--sha256", NULL, co.sha256, 1),
    {"--world-size", "-w", CLI_INT, AT(co.world_size), 1, 1000000,
     .err = "--world-size needs an integer from 1 to 1000000, got '%s'"},
    {"--threads", "-T", CLI_INT, AT(co.threads), 0, 4096, .err = "--threads needs an integer, got '%s'"},
    {"--revision", NULL, CLI_STR, AT(co.revision), .err = "%s needs a branch, tag or commit hash", .err_names_opt = 1},
    {"--mem", NULL, CLI_SIZE, AT(co.mem), 1, .err = "%s needs a size like 512M or 2G", .err_names_opt = 1},
    {"--max-rss", NULL, CLI_SIZE, AT(co.max_rss), 1, .err = "%s needs a size like 512M or 2G", .err_names_opt = 1},
    {"--gpu-mem", NULL, CLI_SIZE, AT(co.gpu_mem), 1, .err = "%s needs a size like 512M or 2G", .err_names_opt = 1},
    {"--max-shard-size", NULL, CLI_SIZE, AT(co.max_shard_size), 1, .err = "%s needs a size like 512M or 2G",
     .err_names_opt = 1},
    {"--layout", NULL, CLI_ENUM, AT(co.layout), .choices = layouts, .err = "--layout must be dcp or hf, got '%s'"},
    {"--mxfp4-layout", NULL, CLI_ENUM, AT(co.mxfp4_layout), .choices = mxfp4_layouts,
     .err = "--mxfp4-layout must be hf or openai, got '%s'"},
    {"--names", NULL, CLI_ENUM, AT(co.names), .choices = names_modes,
     .err = "--names must be transformers, checkpoint, torchtitan or auto, got '%s'"},
    {"--device", NULL, CLI_STR, AT(co.device), .err = "%s needs a value", .err_names_opt = 1},
    {"--compress", NULL, CLI_FN, 0, .fn = opt_compress},
    {"--cpu-level", NULL, CLI_ENUM, AT(co.cpu_level), .choices = cpu_levels,
     .err = "--cpu-level must be scalar, avx2 or avx512, got '%s'"},
    {"--ranks", NULL, CLI_STR, AT(co.ranks), .err = "%s needs a rank list (0-7, 3, 0-3,8-11) or auto", .err_names_opt = 1},
    {"--parts", NULL, CLI_INT, AT(co.parts), 1, 1000000, .err = "--parts needs an integer from 1 to 1000000, got '%s'"},
    {0},
};

static const cli_opt zst_opts[] = { /* compress, decompress, extract */
    FLAG("--force", "-f", zo.force, 1),
    {"--output", "-o", CLI_STR, AT(out), .err = "%s needs a path", .err_names_opt = 1},
    {0},
};

static const cli_opt compress_opts[] = {
    FLAG("--rm", NULL, zo.remove, 1),
    FLAG("--bytegroup", NULL, zo.mode, BFS_ZST_BYTEGROUP),
    {"--level", NULL, CLI_INT, AT(zo.level), -7, 22, .err = "--level needs an integer from -7 to 22, got '%s'"},
    {"--threads", "-T", CLI_INT, AT(zo.threads), 0, 256, .err = "--threads needs an integer from 0 to 256, got '%s'"},
    {"--frame-size", NULL, CLI_SIZE, AT(zo.frame_bytes), 1024,
     .err = "--frame-size needs a size of at least 1K, like 4M, got '%s'"},
    {0},
};

static const cli_opt pack_opts[] = {
    FLAG("--copy", NULL, po.copy, 1),
    FLAG("--verify", NULL, po.verify, 1),
    {"--tag", "-t", CLI_STR, AT(po.tag), .err = "%s needs a tag", .err_names_opt = 1},
    {"--name", NULL, CLI_STR, AT(po.name), .err = "%s needs a name", .err_names_opt = 1},
    {"--revision", NULL, CLI_STR, AT(po.revision), .err = "%s needs a revision", .err_names_opt = 1},
    {"--created", NULL, CLI_STR, AT(po.created), .err = "%s needs `now` or an RFC 3339 time", .err_names_opt = 1},
    {0},
};

static const cli_opt extract_opts[] = {
    FLAG("--raw", NULL, raw, 1),
    {0},
};

static const cli_cmd convert_spec = {usage_convert, {convert_opts, progress_opts, output_opts}, 2,
                                     "needs INPUT and OUTDIR"};
static const cli_cmd inspect_spec = {usage_inspect, {convert_opts, output_opts}, 1, "needs a path"};
static const cli_cmd verify_spec = {usage_verify, {convert_opts, output_opts}, 1, "needs a path"};
static const cli_cmd merge_spec = {usage_merge, {output_opts}, 1, "needs OUTDIR"};
static const cli_cmd pack_spec = {usage_pack, {pack_opts, output_opts}, 2, "needs OUTDIR and OCIDIR"};
static const cli_cmd compress_spec = {usage_compress, {zst_opts, compress_opts, output_opts}, 1, "needs a path"};
static const cli_cmd decompress_spec = {usage_decompress, {zst_opts, output_opts}, 1, "needs a path"};
static const cli_cmd extract_spec = {usage_extract, {zst_opts, extract_opts, output_opts}, 2,
                                         "needs a file and a tensor name"};

/* Defaults of both option structs, then argv parsed against spec. 0 or 2 (usage error). */
static int parse_args(const cli_cmd *spec, int argc, char **argv, cli_args *a)
{
    memset(a, 0, sizeof *a);
    bfs_convert_opts_init(&a->co);
    bfs_compress_opts_init(&a->zo);
    bfs_pack_opts_init(&a->po);
    return cli_parse(spec, argc, argv, a, a->pos);
}

/* ---- commands ------------------------------------------------------------------ */
static int cmd_convert(cli_args *a)
{
    cli_progress ps;
    cli_progress_start(&ps, a->quiet ? CLI_PROGRESS_NONE : a->progress, a->verbose);
    if (ps.mode != CLI_PROGRESS_NONE) {
        a->co.progress = cli_progress_fn;
        a->co.progress_user = &ps;
    }
    if (!a->quiet)
        a->co.log = stderr;

    bfs_convert_result res;
    bfs_convert_result_init(&res);
    const int rc = bfs_convert(a->pos[0], a->pos[1], &a->co, &res);
    cli_progress_end(&ps);
    if (a->json) {
        json_t *o = cli_json_begin("convert");
        cli_json_str(o, "input", a->pos[0]);
        cli_json_str(o, "output", a->pos[1]);
        json_object_set_new(o, "world_size", json_integer(a->co.world_size));
        json_object_set_new(o, "tensors", json_integer((json_int_t)res.tensors));
        json_object_set_new(o, "bytes_written", json_integer((json_int_t)res.bytes_written));
        json_object_set_new(o, "files_written", json_integer((json_int_t)res.files_written));
        json_object_set_new(o, "files_reused", json_integer((json_int_t)res.files_reused));
        json_object_set_new(o, "seconds", json_real(res.seconds));
        json_object_set_new(o, "gb_per_s", json_real(res.seconds > 0 ? (double)res.bytes_written / res.seconds / 1e9 : 0.0));
        json_object_set_new(o, "host_buffer_bytes", json_integer((json_int_t)res.host_buffer_bytes));
        json_object_set_new(o, "gpu_buffer_bytes", json_integer((json_int_t)res.gpu_buffer_bytes));
        cli_json_str(o, "backend", res.backend);
        cli_json_str(o, "ranks", res.ranks);
        json_object_set_new(o, "input_bytes_read", json_integer((json_int_t)res.input_bytes_read));
        json_object_set_new(o, "source_bytes_hashed", json_integer((json_int_t)res.source_bytes_hashed));
        json_object_set_new(o, "tensors_dequantized", json_integer((json_int_t)res.tensors_dequantized));
        json_object_set_new(o, "tensors_cast", json_integer((json_int_t)res.tensors_cast));
        json_object_set_new(o, "tensors_copied", json_integer((json_int_t)res.tensors_copied));
        json_object_set_new(o, "tensors_dropped", json_integer((json_int_t)res.tensors_dropped));
        json_object_set_new(o, "write_seconds", json_real(res.write_seconds));
        json_object_set_new(o, "writer_busy", json_real(res.seconds > 0 ? res.write_seconds / res.seconds : 0.0));
        json_object_set_new(o, "writers", json_integer(res.writers));
        json_t *busy = json_object(); /* which stage bounds the run: the one near 1 */
        if (busy) {
            json_object_set_new(busy, "read", json_real(res.busy_read));
            json_object_set_new(busy, "dequant", json_real(res.busy_dequant));
            json_object_set_new(busy, "hash", json_real(res.busy_hash));
            json_object_set_new(busy, "write", json_real(res.busy_write));
            json_object_set_new(o, "busy", busy);
        }
        cli_json_end(o, rc, NULL);
    }
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a->quiet)
        cli_convert_summary(stderr, &res, a->pos[1]);
    return 0;
}

static int cmd_inspect(cli_args *a)
{
    if (!a->json) {
        const int rc = bfs_inspect(a->pos[0], &a->co, 0, stdout);
        return rc < 0 ? fail(rc, bfs_last_error()) : 0;
    }
    /* the library's JSON, wrapped in the --json envelope */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int rc = mem ? bfs_inspect(a->pos[0], &a->co, 1, mem) : BFS_ENOMEM;
    if (mem && fclose(mem) != 0 && rc == 0)
        rc = BFS_ENOMEM;
    json_t *o = cli_json_begin("inspect"), *lib = rc == 0 ? json_loadb(text, len, 0, NULL) : NULL;
    if (rc == 0 && (!lib || json_object_update(o, lib) != 0))
        rc = BFS_ENOMEM;
    json_decref(lib);
    free(text);
    cli_json_end(o, rc, rc == BFS_ENOMEM && !*bfs_last_error() ? "out of memory" : NULL);
    return rc < 0 ? fail(rc, bfs_last_error()) : 0;
}

static int cmd_verify(cli_args *a)
{
    uint64_t n = 0;
    int rc;
    if (!a->json) {
        rc = bfs_verify(a->pos[0], a->quiet ? NULL : stderr, &n);
    } else { /* every report line also becomes an entry of "problems" */
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        rc = mem ? bfs_verify(a->pos[0], mem, &n) : BFS_ENOMEM;
        const int closed = mem ? fclose(mem) : -1;
        json_t *o = cli_json_begin("verify"), *problems = json_array();
        cli_json_str(o, "outdir", a->pos[0]);
        json_object_set_new(o, "bytes_checked", json_integer((json_int_t)n));
        for (char *l = closed == 0 ? text : NULL, *nl; l && *l; l = nl + 1) {
            nl = strchr(l, '\n');
            if (!nl)
                break;
            *nl = '\0';
            if (!a->quiet)
                fprintf(stderr, "%s\n", l);
            json_array_append_new(problems, cli_json_text(l));
        }
        json_object_set_new(o, "problems", problems);
        free(text);
        cli_json_end(o, rc, NULL);
    }
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a->quiet)
        fprintf(stderr, "bfshard: %s: OK (%llu bytes verified)\n", a->pos[0], (unsigned long long)n);
    return 0;
}

static int cmd_merge(cli_args *a)
{
    const int rc = bfs_merge(a->pos[0], a->quiet ? NULL : stderr);
    if (a->json) {
        json_t *o = cli_json_begin("merge");
        cli_json_str(o, "outdir", a->pos[0]);
        cli_json_end(o, rc, NULL);
    }
    return rc < 0 ? fail(rc, bfs_last_error()) : 0;
}

/* ---- OCI artifacts ------------------------------------------------------ */
static int cmd_pack(cli_args *a)
{
    if (!a->quiet)
        a->po.log = stderr;
    bfs_pack_result res;
    bfs_pack_result_init(&res);
    const int rc = bfs_pack(a->pos[0], a->pos[1], &a->po, &res);
    if (a->json) {
        json_t *o = cli_json_begin("pack");
        cli_json_str(o, "outdir", a->pos[0]);
        cli_json_str(o, "ocidir", a->pos[1]);
        cli_json_str(o, "tag", a->po.tag ? a->po.tag : "latest");
        cli_json_str(o, "manifest_digest", res.manifest_digest);
        json_object_set_new(o, "layers", json_integer((json_int_t)res.layers));
        json_object_set_new(o, "bytes", json_integer((json_int_t)res.bytes));
        json_object_set_new(o, "blobs_linked", json_integer((json_int_t)res.linked));
        json_object_set_new(o, "blobs_copied", json_integer((json_int_t)res.copied));
        json_object_set_new(o, "blobs_kept", json_integer((json_int_t)res.kept));
        json_object_set_new(o, "bytes_hashed", json_integer((json_int_t)res.bytes_hashed));
        json_object_set_new(o, "seconds", json_real(res.seconds));
        cli_json_end(o, rc, NULL);
    }
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a->quiet)
        fprintf(stderr, "bfshard: packed %llu layers (%llu bytes) in %.2f s: %s:%s %s\n", (unsigned long long)res.layers,
                (unsigned long long)res.bytes, res.seconds, a->pos[1], a->po.tag ? a->po.tag : "latest",
                res.manifest_digest);
    return 0;
}

/* ---- compressed artifacts ---------------------------------------------- */
static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int cmd_compress(cli_args *a)
{
    int rc;
    if (!a->quiet)
        a->zo.log = stderr;
    bfs_compress_result res;
    bfs_compress_result_init(&res);
    char out[4096];
    const int dir = is_dir(a->pos[0]);
    if (dir) {
        if (a->out)
            return cli_usage_error(usage_compress, "%s", "-o is for a FILE; an OUTDIR is compressed in place");
        rc = bfs_compress_outdir(a->pos[0], &a->zo, &res);
    } else {
        if (a->zo.remove)
            return cli_usage_error(usage_compress, "%s", "--rm is for an OUTDIR (its manifest records the compressed copy)");
        if (!a->out) {
            snprintf(out, sizeof out, "%s%s", a->pos[0], a->zo.mode == BFS_ZST_BYTEGROUP ? ".bfz" : ".zst");
            a->out = out;
        }
        rc = bfs_compress_file_opts(a->pos[0], a->out, &a->zo, &res);
    }
    if (a->json) {
        json_t *o = cli_json_begin("compress");
        cli_json_str(o, "input", a->pos[0]);
        cli_json_str(o, "output", dir ? NULL : a->out);
        json_object_set_new(o, "files", json_integer((json_int_t)res.files));
        json_object_set_new(o, "bytes_in", json_integer((json_int_t)res.bytes_in));
        json_object_set_new(o, "bytes_out", json_integer((json_int_t)res.bytes_out));
        json_object_set_new(o, "ratio", json_real(res.bytes_out ? (double)res.bytes_in / (double)res.bytes_out : 0.0));
        json_object_set_new(o, "frames", json_integer((json_int_t)res.frames));
        json_object_set_new(o, "seconds", json_real(res.seconds));
        json_object_set_new(o, "mb_per_s", json_real(res.seconds > 0 ? (double)res.bytes_in / res.seconds / 1e6 : 0.0));
        cli_json_end(o, rc, NULL);
    }
    if (rc < 0)
        return fail(rc, bfs_last_error());
    if (!a->quiet)
        fprintf(stderr, "bfshard: compressed %llu file(s): %llu -> %llu bytes (%.3fx) in %.2f s (%.1f MB/s)%s%s\n",
                (unsigned long long)res.files, (unsigned long long)res.bytes_in, (unsigned long long)res.bytes_out,
                res.bytes_out ? (double)res.bytes_in / (double)res.bytes_out : 0.0, res.seconds,
                res.seconds > 0 ? (double)res.bytes_in / res.seconds / 1e6 : 0.0, dir ? "" : " to ", dir ? "" : a->out);
    return 0;
}

static int strip_ext(const char *in, char *out, size_t cap)
{
    const size_t n = strlen(in);
    if (n <= 4 || n >= cap || (strcmp(in + n - 4, ".zst") != 0 && strcmp(in + n - 4, ".bfz") != 0))
        return -1;
    memcpy(out, in, n - 4);
    out[n - 4] = '\0';
    return 0;
}

/* decompress, extract: the summary goes to standard error when the data goes to standard output */
static void json_summary(const char *command, const cli_args *a, int rc)
{
    json_t *o = cli_json_begin(command);
    cli_json_str(o, "input", a->pos[0]);
    if (a->pos[1])
        cli_json_str(o, "tensor", a->pos[1]);
    cli_json_str(o, "output", a->out);
    if (strcmp(a->out, "-") == 0)
        fflush(stdout), cli_json_end_to(o, rc, NULL, stderr);
    else
        cli_json_end(o, rc, NULL);
}

static int cmd_decompress(cli_args *a)
{
    char out[4096];
    if (!a->out) {
        if (strip_ext(a->pos[0], out, sizeof out))
            return cli_usage_error(usage_decompress, "%s does not end in .zst or .bfz: name the output with -o", a->pos[0]);
        a->out = out;
    }
    const int rc = bfs_decompress_file_opts(a->pos[0], a->out, &a->zo);
    if (a->json)
        json_summary("decompress", a, rc);
    return rc < 0 ? fail(rc, bfs_last_error()) : 0;
}

static int cmd_extract(cli_args *a)
{
    char out[4096];
    if (!a->out) {
        snprintf(out, sizeof out, "%s%s", a->pos[1], a->raw ? ".bin" : ".safetensors");
        for (char *p = out; *p; p++)
            if (*p == '/')
                *p = '_';
        a->out = out;
    }
    const int rc = bfs_extract_opts(a->pos[0], a->pos[1], a->out, a->raw, &a->zo);
    if (a->json)
        json_summary("extract", a, rc);
    return rc < 0 ? fail(rc, bfs_last_error()) : 0;
}
/* ---- end of compressed artifacts ---- */

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
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("bfshard %s (%s; cpu: %s; cuda: %s, %d device(s))\n", BFS_VERSION_STRING, bfs_build_revision(),
               bfs_cpu_level_name(bfs_cpu_best_level()), bfs_cuda_built() ? "built" : "not built",
               bfs_cuda_device_count());
        return 0;
    }
    static const struct {
        const char *name;
        const cli_cmd *spec;
        int (*run)(cli_args *a);
    } commands[] = {
        {"convert", &convert_spec, cmd_convert},          {"inspect", &inspect_spec, cmd_inspect},
        {"verify", &verify_spec, cmd_verify},             {"compress", &compress_spec, cmd_compress},
        {"merge", &merge_spec, cmd_merge},                {"pack", &pack_spec, cmd_pack},
        {"decompress", &decompress_spec, cmd_decompress}, {"extract", &extract_spec, cmd_extract},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) != 0)
            continue;
        cli_args a;
        const int rc = parse_args(commands[i].spec, argc - 2, argv + 2, &a);
        bool json = false; /* a usage error may come before --json is read */
        for (int k = 2; k < argc && strcmp(argv[k], "--") != 0; k++)
            json = json || strcmp(argv[k], "--json") == 0;
        if (rc && json) { /* a usage error: scripts get their JSON too */
            json_t *o = cli_json_begin(cmd);
            cli_json_end(o, -rc, cli_usage_message());
        }
        if (rc)
            return rc;
        install_signals();
        return check_stdout(commands[i].run(&a));
    }
    fprintf(stderr, "bfshard: error: unknown command '%s'\n\n%s", cmd, usage_main);
    return -BFS_EUSAGE;
}
