/* Inputs that are not what they claim to be, and inputs read when memory
 * runs out (issue "Fail closed everywhere", defects 3, 9 and 13):
 *
 * - every input path (config.json, model.safetensors, the sharded index and
 *   its shards, prompts / tokens JSONL, traces, manifests, engine output to
 *   import) that is a FIFO, a device or a directory is refused with exit 2
 *   naming the path and what it is, at once: a FIFO never blocks the reader,
 *   /dev/zero is never read;
 * - files read whole are bounded (LS_READ_JSON_MAX_BYTES for JSON) before a
 *   byte is read;
 * - under an address-space limit (setrlimit RLIMIT_AS in the child), every
 *   failure says "out of memory" and, where lockstep asked, how much: never a
 *   corrupt-file message, never a crash;
 * - a trace truncated by another process while it is being read is an error
 *   naming the file and the offset, not SIGBUS. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "testutil.h"
#include "trace_synth.h"

/* The sanitizer build (LS_TEST_ASAN) reserves terabytes of shadow address
 * space at start, so an address-space limit cannot be applied to it. */

static char *g_dir;
static char g_path[4400];

static const char *at(const char *name)
{
    snprintf(g_path, sizeof g_path, "%s/%s", g_dir, name);
    return g_path;
}

static void setup(void)
{
    g_dir = ls_test_tmpdir("inputs");
    char cache[4400];
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    setenv("LOCKSTEP_CACHE_DIR", cache, 1);
}

static void teardown(void)
{
    ls_test_rm_tmpdir(g_dir);
    g_dir = NULL;
}

/* ---- running the CLI ----------------------------------------------------------- */

typedef struct cli_result {
    int code;                /* exit code, or 128 + signal */
    char *out;               /* stdout + stderr; owned */
} cli_result;

/* Runs lockstep with argv (NULL-terminated, without the program name) in a
 * child with RLIMIT_AS = as_bytes (0: unlimited) that SIGALRM kills after
 * timeout_s: a hang shows as 128 + SIGALRM. */
static cli_result cli_limited(rlim_t as_bytes, unsigned timeout_s, const char *const *argv)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        if (as_bytes) {
            struct rlimit rl = {as_bytes, as_bytes};
            if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(121);
        }
        alarm(timeout_s); /* survives exec */
        const char *args[32] = {"lockstep"};
        int n = 1;
        for (; argv[n - 1] && n < 31; n++) args[n] = argv[n - 1];
        args[n] = NULL;
        execv(LS_CLI_PATH, (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1024 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fds[0], buf + len, cap - len - 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    buf[len] = '\0';
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    cli_result r = {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), buf};
    return r;
}

#define CLI(...) cli_limited(0, 30, (const char *const[]){__VA_ARGS__, NULL})

/* Exit 2, within the time limit, naming `path` and `what`. */
static void expect_refused(cli_result r, const char *path, const char *what, const char *label)
{
    ck_assert_msg(r.code != 128 + SIGALRM, "%s: still running after 30 s (blocked on the input?)\n%s", label, r.out);
    ck_assert_msg(r.code == 2, "%s: exit %d, expected 2:\n%s", label, r.code, r.out);
    ck_assert_msg(strstr(r.out, path), "%s: message does not name %s:\n%s", label, path, r.out);
    ck_assert_msg(strstr(r.out, what), "%s: message does not say '%s':\n%s", label, what, r.out);
    free(r.out);
}

/* ---- inputs on disk -------------------------------------------------------------- */

/* A safetensors file with one F32 tensor "w" of 2 elements and, when
 * pad_bytes > 0, a __metadata__ string of that many bytes (a large header). */
static void write_st(const char *path, size_t pad_bytes)
{
    static const char tensor[] = "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    size_t cap = pad_bytes + 256;
    char *h = malloc(cap);
    ck_assert_ptr_nonnull(h);
    size_t n = 0;
    if (pad_bytes) {
        n += (size_t)snprintf(h, cap, "{\"__metadata__\":{\"pad\":\"");
        memset(h + n, 'x', pad_bytes);
        n += pad_bytes;
        n += (size_t)snprintf(h + n, cap - n, "\"},%s}", tensor);
    } else {
        n += (size_t)snprintf(h, cap, "{%s}", tensor);
    }
    while (n % 8) h[n++] = ' ';
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)n >> (8 * i));
    static const uint8_t data[8] = {0, 0, 128, 63, 0, 0, 0, 64}; /* 1.0f, 2.0f */
    ck_assert_uint_eq(fwrite(len8, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(h, 1, n, f), n);
    ck_assert_uint_eq(fwrite(data, 1, 8, f), 8);
    ck_assert_int_eq(fclose(f), 0);
    free(h);
}

/* DIR/NAME: a checkpoint with config.json "{}" and a one-tensor model.safetensors. */
static void make_checkpoint(const char *name)
{
    char d[4400], p[4500];
    snprintf(d, sizeof d, "%s/%s", g_dir, name);
    ck_assert_int_eq(mkdir(d, 0755), 0);
    ls_test_write_text(d, "config.json", "{}");
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_st(p, 0);
}

static void replace_with_fifo(const char *path)
{
    unlink(path);
    ck_assert_msg(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
}

static void replace_with_link(const char *path, const char *target)
{
    unlink(path);
    ck_assert_msg(symlink(target, path) == 0, "symlink %s: %s", path, strerror(errno));
}

/* A file of `bytes` bytes that takes no disk space (a hole). */
static void write_sparse(const char *path, off_t bytes)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, bytes), 0);
    close(fd);
}

/* ---- defect 3: FIFOs, devices and directories as inputs ------------------------- */

START_TEST(test_checkpoint_inputs_not_regular)
{
    char ck[4400], p[4500];
    /* config.json, model.safetensors: a FIFO (blocked forever before), a
     * device (/dev/zero read until memory ran out before), a directory. */
    static const char *const names[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        for (int kind = 0; kind < 3; kind++) {
            char name[64];
            snprintf(name, sizeof name, "ck%d%d", i, kind);
            make_checkpoint(name);
            snprintf(ck, sizeof ck, "%s", at(name));
            snprintf(p, sizeof p, "%s/%s", ck, names[i]);
            const char *what = kind == 0 ? "is a FIFO" : kind == 1 ? "is a character device" : "is a directory";
            if (kind == 0) replace_with_fifo(p);
            if (kind == 1) replace_with_link(p, "/dev/zero");
            if (kind == 2) {
                unlink(p);
                ck_assert_int_eq(mkdir(p, 0755), 0);
            }
            /* /dev/zero must be refused, not read: the limit keeps a failing
             * run from taking the machine's memory (not under ASan). */
            cli_result r = cli_limited(LS_TEST_ASAN ? 0 : (rlim_t)2 << 30, 30,
                                       (const char *const[]){"fingerprint", "--checkpoint", ck, NULL});
            char label[256];
            snprintf(label, sizeof label, "fingerprint, %s %s", names[i], what);
            expect_refused(r, p, what, label);
        }
    }

    /* The sharded layout: the index, then a shard. */
    make_checkpoint("sh");
    snprintf(ck, sizeof ck, "%s", at("sh"));
    snprintf(p, sizeof p, "%s/model.safetensors", ck);
    char shard[4500];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", ck);
    ck_assert_int_eq(rename(p, shard), 0);
    ls_test_write_text(ck, "model.safetensors.index.json",
                       "{\"weight_map\": {\"w\": \"model-00001-of-00001.safetensors\"}}");
    cli_result ok = CLI("fingerprint", "--checkpoint", ck);
    ck_assert_msg(ok.code == 0, "sharded checkpoint: exit %d\n%s", ok.code, ok.out);
    free(ok.out);
    replace_with_fifo(shard);
    expect_refused(CLI("fingerprint", "--checkpoint", ck), shard, "is a FIFO", "fingerprint, shard FIFO");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", ck);
    replace_with_fifo(p);
    expect_refused(CLI("fingerprint", "--checkpoint", ck), p, "is a FIFO", "fingerprint, index FIFO");
}
END_TEST

START_TEST(test_other_inputs_not_regular)
{
    /* A real checkpoint and trace, so that only the input under test is wrong. */
    cli_result r = CLI("synth", "--preset", "tiny", "--seed", "7", "--out", at("tiny"));
    ck_assert_msg(r.code == 0, "synth: exit %d\n%s", r.code, r.out);
    free(r.out);
    char tiny[4400], trace[4400], fifo[4400];
    snprintf(tiny, sizeof tiny, "%s", at("tiny"));
    snprintf(trace, sizeof trace, "%s", at("good.trace"));
    syn_opts so = {.n_seqs = 2, .prompt_len = 4, .gen_len = 4};
    ck_assert_int_eq(syn_write(trace, &so), 0);
    snprintf(fifo, sizeof fifo, "%s", at("in.fifo"));
    replace_with_fifo(fifo);
    char out[4400];
    snprintf(out, sizeof out, "%s", at("out.trace"));
    static const char fp[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    expect_refused(CLI("run", "--checkpoint", tiny, "--mode", "rollout", "--prompts", fifo, "--max-new-tokens", "2",
                       "-o", out),
                   fifo, "is a FIFO", "run --prompts FIFO");
    expect_refused(CLI("run", "--checkpoint", tiny, "--mode", "replay", "--tokens", fifo, "-o", out), fifo,
                   "is a FIFO", "run --tokens FIFO");
    expect_refused(CLI("run", "--checkpoint", tiny, "--mode", "replay", "--from", fifo, "-o", out), fifo,
                   "is a FIFO", "run --from FIFO");
    expect_refused(CLI("compare", fifo, trace), fifo, "is a FIFO", "compare A=FIFO");
    expect_refused(CLI("compare", trace, fifo), fifo, "is a FIFO", "compare B=FIFO");
    expect_refused(CLI("trace", "dump", fifo), fifo, "is a FIFO", "trace dump FIFO");
    expect_refused(CLI("manifest", "diff", fifo, fifo), fifo, "is a FIFO", "manifest diff FIFO");
    expect_refused(CLI("manifest", "verify", fifo, "--checkpoint", tiny), fifo, "is a FIFO", "manifest verify FIFO");
    expect_refused(CLI("import", "jsonl", fifo, "-o", out, "--model-fingerprint", fp), fifo, "is a FIFO",
                   "import FIFO");
    ck_assert_msg(access(out, F_OK) != 0, "an output was written from a FIFO input");

    /* Devices: refused without reading (the limit guards a regression). */
    rlim_t lim = LS_TEST_ASAN ? 0 : (rlim_t)2 << 30;
    expect_refused(cli_limited(lim, 30, (const char *const[]){"run", "--checkpoint", tiny, "--mode", "rollout",
                                                              "--prompts", "/dev/zero", "-o", out, NULL}),
                   "/dev/zero", "is a character device", "run --prompts /dev/zero");
    expect_refused(cli_limited(lim, 30, (const char *const[]){"compare", "/dev/zero", trace, NULL}), "/dev/zero",
                   "is a character device", "compare /dev/zero");
    expect_refused(cli_limited(lim, 30, (const char *const[]){"import", "jsonl", "/dev/zero", "-o", out,
                                                              "--model-fingerprint", fp, NULL}),
                   "/dev/zero", "is a character device", "import /dev/zero");
    expect_refused(CLI("trace", "dump", g_dir), g_dir, "is a directory", "trace dump DIR");
}
END_TEST

START_TEST(test_read_file_refuses_fifo_and_device)
{
    /* The library reader itself: at once, naming the kind. */
    char fifo[4400];
    snprintf(fifo, sizeof fifo, "%s", at("x.fifo"));
    replace_with_fifo(fifo);
    char *text = NULL;
    size_t len = 0;
    ls_error err;
    ls_error_clear(&err);
    alarm(20); /* a regression blocks in open(): fail instead of hanging */
    ck_assert_int_eq(ls_read_file(fifo, &text, &len, &err), LS_E_IO);
    alarm(0);
    ck_assert_msg(strstr(err.msg, fifo) && strstr(err.msg, "is a FIFO, not a regular file"), "%s", err.msg);
    ck_assert_int_eq(ls_read_file("/dev/null", &text, &len, &err), LS_E_IO);
    ck_assert_msg(strstr(err.msg, "/dev/null: is a character device"), "%s", err.msg);
    ck_assert_int_eq(ls_read_file("/dev/zero", &text, &len, &err), LS_E_IO);
    ck_assert_msg(strstr(err.msg, "/dev/zero: is a character device"), "%s", err.msg);
    ck_assert_int_eq(ls_read_file(g_dir, &text, &len, &err), LS_E_IO);
    ck_assert_msg(strstr(err.msg, "is a directory"), "%s", err.msg);
    ck_assert_ptr_null(text);
}
END_TEST

/* ---- defect 3: size bounds --------------------------------------------------------- */

START_TEST(test_json_inputs_bounded)
{
    /* One byte over the bound: refused before reading, naming size and limit. */
    char over[64];
    snprintf(over, sizeof over, "%llu bytes", (unsigned long long)LS_READ_JSON_MAX_BYTES + 1);
    char *text = NULL;
    size_t len = 0;
    ls_error err;
    ls_error_clear(&err);
    write_sparse(at("big.json"), (off_t)LS_READ_JSON_MAX_BYTES + 1);
    ck_assert_int_eq(ls_read_file(at("big.json"), &text, &len, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, over) && strstr(err.msg, "limit of 67108864 bytes (64 MiB)"), "%s", err.msg);
    ck_assert_ptr_null(text);

    make_checkpoint("ck");
    char cfg[4500];
    snprintf(cfg, sizeof cfg, "%s/config.json", at("ck"));
    write_sparse(cfg, (off_t)LS_READ_JSON_MAX_BYTES + 1);
    char ck[4400];
    snprintf(ck, sizeof ck, "%s", at("ck"));
    cli_result r = cli_limited(LS_TEST_ASAN ? 0 : (rlim_t)2 << 30, 30,
                               (const char *const[]){"fingerprint", "--checkpoint", ck, NULL});
    expect_refused(r, cfg, over, "fingerprint, config.json over the bound");
}
END_TEST

START_TEST(test_read_file_max)
{
    char *text = NULL;
    size_t len = 0;
    ls_error err;
    ls_error_clear(&err);
    ls_test_write_text(g_dir, "a.txt", "0123456789");
    ck_assert_int_eq(ls_read_file_max(at("a.txt"), 10, &text, &len, &err), LS_OK);
    ck_assert_uint_eq(len, 10);
    ck_assert_str_eq(text, "0123456789");
    free(text);
    text = NULL;
    ck_assert_int_eq(ls_read_file_max(at("a.txt"), 9, &text, &len, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "a.txt: 10 bytes, more than the limit of 9 bytes"), "%s", err.msg);
    ck_assert_ptr_null(text);
    /* Files whose size says 0 but which have content (procfs) are read whole. */
    ck_assert_int_eq(ls_read_file_max("/proc/self/status", 1 << 20, &text, &len, &err), LS_OK);
    ck_assert_msg(len > 0 && strstr(text, "Name:"), "read %zu bytes of /proc/self/status", len);
    free(text);
    text = NULL;
    ck_assert_int_eq(ls_read_file_max("/proc/self/status", 16, &text, &len, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "more than the limit of 16 bytes"), "%s", err.msg);
    ck_assert_ptr_null(text);
}
END_TEST

/* ---- defect 9: out of memory says so, and how much -------------------------------- */

/* Lowest address-space limit (in steps of 2 MiB) at which the CLI starts at all. */
static rlim_t startup_limit(void)
{
    static rlim_t found; /* one search per test process */
    if (found) return found;
    for (rlim_t lim = (rlim_t)8 << 20; lim < (rlim_t)1 << 30; lim += (rlim_t)2 << 20) {
        cli_result r = cli_limited(lim, 30, (const char *const[]){"version", NULL});
        free(r.out);
        if (r.code == 0) return found = lim;
    }
    ck_abort_msg("lockstep version does not run under a 1 GiB address-space limit");
    return 0;
}

/* Runs argv under limits from the startup limit upwards, `step` apart, until
 * it succeeds. Every failure before that must be exit 2 saying "out of
 * memory" (with `sized`, also "bytes asked)"); `expect` must appear in at
 * least one of them. Returns how many limits failed. */
static int oom_sweep(const char *const *argv, rlim_t step, int sized, const char *expect, const char *label)
{
    rlim_t base = startup_limit();
    int failures = 0, seen = 0, ok = 0;
    for (rlim_t lim = base; lim < base + ((rlim_t)1 << 30); lim += step) {
        cli_result r = cli_limited(lim, 60, argv);
        if (r.code == 0) {
            free(r.out);
            ok = 1;
            break;
        }
        ck_assert_msg(r.code == 2, "%s under a %llu-byte address-space limit: exit %d (expected 0 or 2):\n%s", label,
                      (unsigned long long)lim, r.code, r.out);
        ck_assert_msg(strstr(r.out, "out of memory") && (!sized || strstr(r.out, "bytes asked)")),
                      "%s under a %llu-byte address-space limit: the failure does not say out of memory%s:\n%s", label,
                      (unsigned long long)lim, sized ? " and how much was asked" : "", r.out);
        if (strstr(r.out, expect)) seen = 1;
        failures++;
        free(r.out);
    }
    ck_assert_msg(ok, "%s never succeeded within 1 GiB above the startup limit", label);
    ck_assert_msg(seen, "%s: no failure mentioned '%s' (%d failures)", label, expect, failures);
    return failures;
}

/* One case for the three sweeps: the sanitizer build skips it as a whole. */
START_TEST(test_out_of_memory)
{
    if (LS_TEST_ASAN) {
        fprintf(stderr, "SKIP test_out_of_memory: the sanitizer build reserves its shadow memory at start and "
                        "cannot run under RLIMIT_AS; the normal build runs this case\n");
        return;
    }
    char ck[4400], st[4500];

    /* A 24 MiB safetensors header: past the file mapping, parsing it needs
     * ~50 MiB more. Before: "header is not valid JSON", or SIGSEGV inside
     * jansson. */
    make_checkpoint("big_header");
    snprintf(ck, sizeof ck, "%s", at("big_header"));
    snprintf(st, sizeof st, "%s/model.safetensors", ck);
    write_st(st, (size_t)24 << 20);
    oom_sweep((const char *const[]){"fingerprint", "--checkpoint", ck, "--threads", "1", NULL}, (rlim_t)4 << 20, 1,
              "header JSON", "fingerprint of a 24 MiB safetensors header");

    /* A 20 MiB config.json (under the 64 MiB bound): read whole, then parsed. */
    make_checkpoint("big_config");
    snprintf(ck, sizeof ck, "%s", at("big_config"));
    size_t pad = (size_t)20 << 20;
    char *cfg = malloc(pad + 32);
    ck_assert_ptr_nonnull(cfg);
    int n = snprintf(cfg, 32, "{\"pad\": \"");
    memset(cfg + n, 'x', pad);
    memcpy(cfg + n + pad, "\"}", 3);
    ls_test_write_text(ck, "config.json", cfg);
    free(cfg);
    oom_sweep((const char *const[]){"fingerprint", "--checkpoint", ck, "--threads", "1", NULL}, (rlim_t)4 << 20, 1,
              "config.json", "fingerprint of a 20 MiB config.json");

    /* A whole rollout, in 1 MiB steps: every allocation on the way (mapping,
     * headers, engine, OpenSSL, zstd, manifest) fails as out of memory, never
     * as a crash (before: SIGSEGV inside OpenSSL) or a misread input. Sizes
     * are not required here: OpenSSL and jansson's builders do not say what
     * they asked for. */
    cli_result r = CLI("synth", "--preset", "tiny", "--seed", "7", "--out", at("tiny"));
    ck_assert_msg(r.code == 0, "synth: exit %d\n%s", r.code, r.out);
    free(r.out);
    ls_test_write_text(g_dir, "prompts.jsonl",
                       "{\"id\": 0, \"tokens\": [1, 2, 3, 4, 5]}\n{\"id\": 3, \"tokens\": [9, 8, 7, 6, 5, 4, 3]}\n");
    char tiny[4400], prompts[4400], out[4400];
    snprintf(tiny, sizeof tiny, "%s", at("tiny"));
    snprintf(prompts, sizeof prompts, "%s", at("prompts.jsonl"));
    snprintf(out, sizeof out, "%s", at("r.trace"));
    int failures = oom_sweep((const char *const[]){"run", "--checkpoint", tiny, "--mode", "rollout", "--prompts",
                                                   prompts, "--max-new-tokens", "4", "-o", out, NULL},
                             (rlim_t)1 << 20, 0, "out of memory", "run (rollout, tiny)");
    ck_assert_int_gt(failures, 3);
}
END_TEST

/* ---- defect 13: a trace that shrinks while it is read ------------------------------ */

START_TEST(test_trace_truncated_while_read)
{
    /* Many frames, so the cut lands well inside the file. */
    char trace[4400];
    snprintf(trace, sizeof trace, "%s", at("t.trace"));
    syn_opts so = {.n_seqs = 4, .prompt_len = 16, .gen_len = 400, .dumps = 1};
    ck_assert_int_eq(syn_write(trace, &so), 0);
    struct stat sb;
    ck_assert_int_eq(stat(trace, &sb), 0);
    /* Cut at a page boundary: every byte from there on is on a page wholly
     * past the end, which a mapping turns into SIGBUS. */
    off_t page = (off_t)sysconf(_SC_PAGESIZE);
    off_t half = sb.st_size / 2 / page * page;

    /* The streaming reader: opened (header and trailer checked), then cut. */
    ls_trace_reader *r = NULL;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_trace_reader_open(trace, &r, &err), LS_OK);
    ck_assert_int_eq(truncate(trace, half), 0);
    const ls_trace_record *rec;
    ls_status st;
    long n = 0;
    while ((st = ls_trace_reader_next(r, &rec, &err)) == LS_OK && rec) n++;
    /* Not a checksum mismatch either: nothing in the file is damaged. */
    ck_assert_msg(st == LS_E_IO, "reader: status %d after %ld records: %s", st, n, err.msg);
    ck_assert_msg(strstr(err.msg, trace) && strstr(err.msg, "offset ") && strstr(err.msg, "shrank"), "%s", err.msg);
    ls_trace_reader_close(r);

    /* The index (compare's B side): built, then cut, then every frame loaded. */
    ck_assert_int_eq(syn_write(trace, &so), 0);
    ls_trace_index *ix = NULL;
    ck_assert_int_eq(ls_trace_index_open(trace, &ix, &err), LS_OK);
    ck_assert_int_eq(truncate(trace, half), 0);
    st = ls_trace_index_verify(ix, &err);
    ck_assert_msg(st == LS_E_IO, "index: status %d: %s", st, err.msg);
    ck_assert_msg(strstr(err.msg, trace) && strstr(err.msg, "offset ") && strstr(err.msg, "shrank"), "%s", err.msg);
    ls_trace_index_close(ix);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("inputs");
    TCase *tc = tcase_create("inputs");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_checkpoint_inputs_not_regular);
    tcase_add_test(tc, test_other_inputs_not_regular);
    tcase_add_test(tc, test_read_file_refuses_fifo_and_device);
    tcase_add_test(tc, test_json_inputs_bounded);
    tcase_add_test(tc, test_read_file_max);
    tcase_add_test(tc, test_out_of_memory);
    tcase_add_test(tc, test_trace_truncated_while_read);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
