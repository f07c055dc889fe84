/* gemm_qualify — qualification of pinned cuBLASLt GEMM algorithms for batch
 * invariance (kernels/tc/gemm_pin.h, docs/tensor-core-tier.md §2), per
 * weight shape, written as one markdown report: the default heuristic's
 * pick per M and whether row 0 keeps its bits, then every candidate
 * (configuration, qualified or its first failing M and row, µs at M = 1, 32,
 * 256), and the pinned record of the fastest qualified one.
 *
 *   gemm_qualify OUT.md [--shape NxK]... [--max-rows R] [--max-candidates C]
 *                [--max-per-algo A] [--reps T] [--max-seconds S] [--device D]
 *
 * Default shapes: the Qwen3-Next linears 2048x4096, 12288x2048, 512x2048;
 * --max-rows 1024; --max-candidates 2000 (heuristic picks first, then one
 * configuration of each algorithm id in turn; 0 = every configuration
 * cuBLASLt accepts); --max-per-algo 0 (all); --reps 20; --max-seconds 150
 * per shape (candidates not started by then are reported as not run; 0 = no
 * limit), so the default three shapes fit a 10-minute command. Progress
 * goes to stderr.
 * Exit status: 0 when every shape has a qualified algorithm, 1 when one has
 * none, 2 on errors (no GPU, bad arguments, CUDA/cuBLASLt failures). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "tc/gemm_pin.h"
#include "ls_cuda.h"

#define MAX_SHAPES 16

static const char usage[] =
    "usage: gemm_qualify OUT.md [--shape NxK]... [--max-rows R] [--max-candidates C]\n"
    "                    [--max-per-algo A] [--reps T] [--max-seconds S] [--device D]\n";

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int main(int argc, char **argv)
{
    int64_t shapes[MAX_SHAPES][2] = {{2048, 4096}, {12288, 2048}, {512, 2048}};
    int n_shapes = 3, user_shapes = 0;
    ls_gemm_qualify_opts o;
    ls_gemm_qualify_opts_default(&o);
    o.max_candidates = 2000;
    o.max_seconds = 150.0;
    long device = 0, v = 0;
    static const struct option longs[] = {
        {"shape", required_argument, NULL, 's'},      {"max-rows", required_argument, NULL, 'm'},
        {"max-candidates", required_argument, NULL, 'c'}, {"max-per-algo", required_argument, NULL, 'a'},
        {"reps", required_argument, NULL, 'r'},       {"device", required_argument, NULL, 'd'},
        {"max-seconds", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch, idx = 0;
    while ((ch = getopt_long(argc, argv, "h", longs, &idx)) != -1) {
        switch (ch) {
        case 's': {
            long long n = 0, k = 0;
            int used = 0;
            if (sscanf(optarg, "%lldx%lld%n", &n, &k, &used) != 2 || optarg[used] || n < 1 || k < 1) {
                fprintf(stderr, "gemm_qualify: --shape %s: expected NxK, e.g. 2048x4096\n", optarg);
                return 2;
            }
            if (!user_shapes) n_shapes = 0;
            user_shapes = 1;
            if (n_shapes == MAX_SHAPES) {
                fprintf(stderr, "gemm_qualify: at most %d --shape\n", MAX_SHAPES);
                return 2;
            }
            shapes[n_shapes][0] = n;
            shapes[n_shapes][1] = k;
            n_shapes++;
            break;
        }
        case 'm':
            if (!parse_long(optarg, 2, 1 << 20, &v)) goto bad;
            o.max_rows = v;
            break;
        case 'c':
            if (!parse_long(optarg, 0, 1 << 24, &v)) goto bad;
            o.max_candidates = (int)v;
            break;
        case 'a':
            if (!parse_long(optarg, 0, 1 << 24, &v)) goto bad;
            o.max_per_algo = (int)v;
            break;
        case 'r':
            if (!parse_long(optarg, 0, 100000, &v)) goto bad;
            o.time_reps = (int)v;
            break;
        case 't':
            if (!parse_long(optarg, 0, 86400, &v)) goto bad;
            o.max_seconds = (double)v;
            break;
        case 'd':
            if (!parse_long(optarg, 0, 1024, &device)) goto bad;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "gemm_qualify: --%s %s: not a number in range\n%s", longs[idx].name, optarg,
                usage);
        return 2;
    }
    if (optind != argc - 1) {
        fputs(usage, stderr);
        return 2;
    }
    const char *out_path = argv[optind];

    ls_error err;
    ls_error_clear(&err);
    if (ls_cuda_use_device((int)device, &err) != LS_OK) {
        fprintf(stderr, "gemm_qualify: %s\n", err.msg);
        return 2;
    }
    ls_gemm_lt *lt = NULL;
    if (ls_gemm_lt_create((size_t)32 << 20, &lt, &err) != LS_OK) {
        fprintf(stderr, "gemm_qualify: %s\n", err.msg);
        return 2;
    }
    ls_outfile f;
    if (ls_outfile_open(&f, out_path, &err) != LS_OK) {
        fprintf(stderr, "gemm_qualify: %s\n", err.msg);
        ls_gemm_lt_destroy(lt);
        return 2;
    }
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f.fp, "# Pinned cuBLASLt GEMM qualification\n\n");
    fprintf(f.fp, "Written by `harness/gemm_qualify` at %s. Command:\n\n```\n", when);
    for (int i = 0; i < argc; i++) fprintf(f.fp, "%s%s", i ? " " : "", argv[i]);
    fprintf(f.fp, "\n```\n\nA candidate qualifies when every row of every run (M over the set "
            "below, input row 0 first, in the middle and last) equals bit for bit the same input "
            "row's output at M = max rows (docs/tensor-core-tier.md §2). Configurations: "
            "`cublasLtMatmulAlgoConfigAttributes_t` values (tile: `cublasLtMatmulTile_t`, stages: "
            "`cublasLtMatmulStages_t`, cluster: `cublasLtClusterShape_t`, 0 = the library's "
            "choice).\n\n");
    int status = 0;
    char rec[512];
    for (int s = 0; s < n_shapes; s++) {
        ls_gemm_qual q;
        o.n = shapes[s][0];
        o.k = shapes[s][1];
        ls_status st = ls_gemm_qualify(lt, &o, &q, stderr, &err);
        if (st != LS_OK) {
            fprintf(stderr, "gemm_qualify: [%" PRId64 " x %" PRId64 "]: %s\n", o.n, o.k, err.msg);
            ls_gemm_qual_free(&q);
            ls_outfile_abort(&f);
            ls_gemm_lt_destroy(lt);
            return 2;
        }
        ls_gemm_qual_write_markdown(&q, f.fp);
        ls_gemm_pin pin;
        if (q.best >= 0 && ls_gemm_qual_pin(&q, q.best, &pin, &err) == LS_OK &&
            ls_gemm_pin_format(&pin, rec, sizeof rec, &err) == LS_OK) {
            fprintf(f.fp, "Pinned record:\n\n```json\n%s\n```\n\n", rec);
            fprintf(stderr, "gemm_qualify: [%" PRId64 " x %" PRId64 "]: pinned %s\n", o.n, o.k, rec);
        } else {
            fprintf(f.fp, "**No algorithm qualified for this shape.**\n\n");
            fprintf(stderr, "gemm_qualify: [%" PRId64 " x %" PRId64 "]: no algorithm qualified\n",
                    o.n, o.k);
            status = 1;
        }
        ls_gemm_qual_free(&q);
    }
    ls_gemm_lt_destroy(lt);
    if (ls_outfile_commit(&f, &err) != LS_OK) {
        fprintf(stderr, "gemm_qualify: %s\n", err.msg);
        return 2;
    }
    fprintf(stderr, "gemm_qualify: wrote %s\n", out_path);
    return status;
}
