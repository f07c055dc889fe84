/* CUDA digest of encoded spans (kernels/sha256.h ls_cuda_digest) against the
 * canonical bytes built on the host and hashed by OpenSSL: random spans of
 * fp32 values (including NaN, infinities, signed zeros, values that round
 * up), bf16 and raw encodings, one and two spans per job, odd lengths, empty
 * spans; every job hashed on the device, again with the long jobs hashed
 * on the host, and with every job on the host; the asynchronous digester on
 * a ring that wraps, and with many small calls sharing downloads (against
 * the synchronous path); digests in parts over several calls; and the
 * planner's choice of where (ls_cuda_digest_plan) for a decode step's rows,
 * a prefill's, and long states. */
#include "gpu_testutil.h"

#include "fingerprint/sha256.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime.h> /* cudaStreamPerThread: a second stream for the digester */

#include "sha256.h"

static uint64_t rng_state = 0x1234abcdu;
static uint64_t rnd(void)
{
    uint64_t x = (rng_state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t rnd_bits(void)
{
    switch (rnd() % 16) {
    case 0: return 0x7fc00001u;            /* NaN with payload */
    case 1: return 0x7f800000u;            /* +inf */
    case 2: return 0x80000000u;            /* -0 */
    case 3: return 0x3f80ffffu;            /* rounds up in bf16 */
    case 4: return 0x3f808000u;            /* tie, even */
    case 5: return 0x3f818000u;            /* tie, odd */
    default: return (uint32_t)rnd();
    }
}

/* Canonical bytes of one span appended at out; returns the bytes written. */
static size_t encode(const uint32_t *v0, size_t n, size_t row_len, size_t stride, int bf16,
                     uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x = v0[row_len ? (i / row_len) * stride + i % row_len : i];
        if (bf16) {
            uint16_t h = ls_f32_to_bf16(ls_f32_from_bits(x));
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        } else {
            for (int b = 0; b < 4; b++) out[4 * i + (size_t)b] = (uint8_t)(x >> (8 * b));
        }
    }
    return n * (bf16 ? 2 : 4);
}

static int host_sha(void *part, int first, const void *p, size_t len, uint8_t *out)
{
    ls_error err;
    ls_digest d;
    ls_status st = part ? ls_sha256_part((ls_sha256 *)part, first, p, len, out ? &d : NULL, &err)
                        : ls_sha256_buf(p, len, &d, &err);
    if (st != LS_OK) return 1;
    if (out) memcpy(out, d.bytes, 32);
    return 0;
}

/* Random jobs over device data, and the canonical bytes to check them by. */
typedef struct job_set {
    int n_jobs;
    size_t max_elems;
    uint32_t *h;               /* host copy of the device data */
    void *d;                   /* device data */
    ls_cuda_digest_job *jobs;  /* [n_jobs] */
    size_t *at;                /* [n_jobs][2] span starts in h */
} job_set;

static job_set make_jobs(int n_jobs, size_t max_elems);
static void check_jobs(const job_set *js, const uint8_t *got, const char *how);
static void free_jobs(job_set *js);

static void run_case(int n_jobs, size_t max_elems, size_t device_max)
{
    ls_error err;
    ls_error_clear(&err);
    job_set js = make_jobs(n_jobs, max_elems);
    ls_cuda_digest_job *jobs = js.jobs;
    size_t sb = ls_cuda_digest_scratch_bytes(jobs, n_jobs);
    void *scr = NULL;
    ck_assert_int_eq(ls_cuda_malloc(&scr, sb, &err), LS_OK);
    uint8_t *got = malloc((size_t)n_jobs * 32 + 1);
    ck_assert_int_eq(ls_cuda_digest(jobs, n_jobs, scr, sb, device_max,
                                    device_max == SIZE_MAX ? NULL : host_sha, got, NULL, &err),
                     LS_OK);
    check_jobs(&js, got, device_max == SIZE_MAX ? "all on the device" : device_max == 0 ? "all on the host"
                                                                                      : "long jobs on the host");
    free(got);
    free_jobs(&js);
    ls_cuda_free(scr);
}

static job_set make_jobs(int n_jobs, size_t max_elems)
{
    ls_error err;
    ls_error_clear(&err);
    size_t pool = (size_t)n_jobs * 2 * (3 * max_elems + 3) + 8;
    uint32_t *h = malloc(pool * 4);
    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < pool; i++) h[i] = rnd_bits();
    void *d = NULL;
    ck_assert_int_eq(ls_cuda_malloc(&d, pool * 4, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_upload(d, h, pool * 4, &err), LS_OK);
    ls_cuda_digest_job *jobs = calloc((size_t)n_jobs, sizeof *jobs);
    size_t *at = calloc((size_t)n_jobs * 2, sizeof *at);
    size_t cur = 0;
    for (int j = 0; j < n_jobs; j++) {
        int spans = 1 + (int)(rnd() % 2);
        for (int s = 0; s < spans; s++) {
            size_t n = (size_t)(rnd() % (max_elems + 1));
            size_t skew = (size_t)(rnd() % 3); /* start at any element, not only aligned ones */
            at[2 * j + s] = cur + skew;
            jobs[j].src[s] = (const uint32_t *)d + cur + skew;
            jobs[j].n[s] = n;
            jobs[j].bf16[s] = (uint8_t)(rnd() % 2);
            if (n > 3 && rnd() % 2) { /* strided rows: rows of len, stride len + gap */
                size_t len = 1 + (size_t)(rnd() % 7), rows = n / len;
                jobs[j].n[s] = rows * len;
                jobs[j].row_len[s] = len;
                jobs[j].stride[s] = len + (size_t)(rnd() % 3);
                n = rows * (size_t)jobs[j].stride[s];
            }
            cur += n + skew;
        }
    }
    ck_assert_uint_le(cur, pool);
    job_set js = {n_jobs, max_elems, h, d, jobs, at};
    return js;
}

static void check_jobs(const job_set *js, const uint8_t *got, const char *how)
{
    ls_error err;
    ls_error_clear(&err);
    int n_jobs = js->n_jobs;
    size_t max_elems = js->max_elems;
    const ls_cuda_digest_job *jobs = js->jobs;
    const uint32_t *h = js->h;
    const size_t *at = js->at;
    uint8_t *bytes = malloc(8 * max_elems + 8);
    for (int j = 0; j < n_jobs; j++) {
        size_t len = 0;
        for (int s = 0; s < 2; s++)
            len += encode(h + at[2 * j + s], jobs[j].n[s], jobs[j].row_len[s], jobs[j].stride[s],
                          jobs[j].bf16[s], bytes + len);
        ls_digest want;
        ck_assert_int_eq(ls_sha256_buf(bytes, len, &want, &err), LS_OK);
        if (memcmp(want.bytes, got + 32 * (size_t)j, 32) != 0) {
            char a[65], b[65];
            ls_digest g;
            memcpy(g.bytes, got + 32 * (size_t)j, 32);
            ls_digest_to_hex(&want, a);
            ls_digest_to_hex(&g, b);
            printf("MISMATCH digest job %d (spans %llu %s + %llu %s, %zu bytes): cpu %s gpu %s\n", j,
                   (unsigned long long)jobs[j].n[0], jobs[j].bf16[0] ? "bf16" : "raw",
                   (unsigned long long)jobs[j].n[1], jobs[j].bf16[1] ? "bf16" : "raw", len, a, b);
            ck_abort_msg("digest job %d differs", j);
        }
    }
    printf("  ok digest: %d jobs, up to %zu elements per span, %s\n", n_jobs, max_elems, how);
    free(bytes);
}

static void free_jobs(job_set *js)
{
    free(js->at);
    free(js->jobs);
    free(js->h);
    ls_cuda_free(js->d);
}

START_TEST(test_digest_small_spans)
{
    run_case(500, 40, SIZE_MAX);
}
END_TEST

START_TEST(test_digest_rows)
{
    run_case(200, 3000, SIZE_MAX);
}
END_TEST

START_TEST(test_digest_long_host_and_device)
{
    int quick = getenv("LS_GPU_QUICK") != NULL;
    run_case(quick ? 6 : 24, quick ? 20000 : 300000, 4096);
    run_case(quick ? 4 : 8, quick ? 20000 : 100000, SIZE_MAX);
}
END_TEST

/* A digester of n_threads on a ring of `ring` bytes of device memory
 * (*d_ring: the caller frees it after destroying the digester). */
static ls_cuda_digester *digester_on(size_t ring, int n_threads, void **d_ring)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_cuda_malloc(d_ring, ring, &err), LS_OK);
    ls_cuda_digester *dg = NULL;
    ck_assert_msg(ls_cuda_digester_create(*d_ring, ring, n_threads, host_sha, &dg, &err) == LS_OK, "%s", err.msg);
    return dg;
}

/* The asynchronous digester on a ring small enough to wrap and to make
 * submits wait: many calls of random jobs, one wait, every digest right. */
START_TEST(test_digester)
{
    ls_error err;
    ls_error_clear(&err);
    void *d_ring = NULL;
    ls_cuda_digester *dg = digester_on((size_t)1 << 20, 4, &d_ring);
    enum { CALLS = 40 };
    job_set js[CALLS];
    uint8_t *got[CALLS];
    for (int c = 0; c < CALLS; c++) {
        js[c] = make_jobs(1 + c % 17, c % 5 == 0 ? 20000 : 700); /* some calls span several chunks */
        got[c] = malloc((size_t)js[c].n_jobs * 32);
        uint8_t **outs = malloc(sizeof *outs * (size_t)js[c].n_jobs);
        for (int j = 0; j < js[c].n_jobs; j++) outs[j] = got[c] + 32 * (size_t)j;
        ck_assert_msg(ls_cuda_digester_submit(dg, js[c].jobs, outs, js[c].n_jobs, NULL, &err) == LS_OK, "%s",
                      err.msg);
        free(outs);
    }
    ck_assert_msg(ls_cuda_digester_wait(dg, &err) == LS_OK, "%s", err.msg);
    for (int c = 0; c < CALLS; c++) {
        check_jobs(&js[c], got[c], "asynchronous digester, 1 MiB ring");
        free(got[c]);
        free_jobs(&js[c]);
    }
    /* a job whose stage exceeds half the ring is refused, not truncated */
    job_set big = make_jobs(1, 200000);
    big.jobs[0].n[0] = 200000, big.jobs[0].n[1] = 0, big.jobs[0].row_len[0] = 0, big.jobs[0].bf16[0] = 0;
    uint8_t out[32], *outs1[1] = {out};
    ck_assert_int_eq(ls_cuda_digester_submit(dg, big.jobs, outs1, 1, NULL, &err), LS_E_UNSUPPORTED);
    printf("  ok digester refuses an 800 KB job on a 1 MiB ring: %s\n", err.msg);
    free_jobs(&big);
    ls_cuda_digester_destroy(dg);
    ls_cuda_free(d_ring);
}
END_TEST

/* Digests of the synchronous path (every job on the device). */
static uint8_t *digest_sync(const job_set *js)
{
    ls_error err;
    ls_error_clear(&err);
    size_t sb = ls_cuda_digest_scratch_bytes(js->jobs, js->n_jobs);
    void *scr = NULL;
    ck_assert_int_eq(ls_cuda_malloc(&scr, sb, &err), LS_OK);
    uint8_t *got = malloc((size_t)js->n_jobs * 32);
    ck_assert_msg(ls_cuda_digest(js->jobs, js->n_jobs, scr, sb, SIZE_MAX, NULL, got, NULL, &err) == LS_OK, "%s",
                  err.msg);
    ls_cuda_free(scr);
    return got;
}

/* Many small calls, as a decode step makes them: the digester shares one
 * download among adjacent calls and flushes it when the group is full, the
 * ring wraps or is half full, the stream changes, a call must wait for room
 * or slots (more calls than slots, several laps of a 256 KiB ring), and at
 * the wait. Calls of empty jobs only (nothing to download) and one call of
 * more jobs than a batch holds are among them. Every digest equals the
 * synchronous path's and the canonical bytes'. */
START_TEST(test_digester_many_small)
{
    ls_error err;
    ls_error_clear(&err);
    void *d_ring = NULL;
    ls_cuda_digester *dg = digester_on((size_t)256 << 10, 3, &d_ring);
    enum { CALLS = 400 };
    job_set *js = malloc(sizeof *js * CALLS);
    uint8_t **got = malloc(sizeof *got * CALLS);
    for (int round = 0; round < 2; round++) { /* the second reuses slots and events */
        for (int c = 0; c < CALLS; c++) { /* first the data, so that the calls come back to back */
            int n = c == 7 ? 600 : 1 + c % 3;
            js[c] = make_jobs(n, c % 50 == 3 ? 0 : c == 7 ? 30 : 1500);
            got[c] = malloc((size_t)n * 32);
        }
        for (int c = 0; c < CALLS; c++) {
            int n = js[c].n_jobs;
            uint8_t **outs = malloc(sizeof *outs * (size_t)n);
            for (int j = 0; j < n; j++) outs[j] = got[c] + 32 * (size_t)j;
            void *stream = (c / 40) % 2 ? (void *)cudaStreamPerThread : NULL;
            ck_assert_msg(ls_cuda_digester_submit(dg, js[c].jobs, outs, n, stream, &err) == LS_OK, "%s",
                          err.msg);
            free(outs);
        }
        ck_assert_msg(ls_cuda_digester_wait(dg, &err) == LS_OK, "%s", err.msg);
        for (int c = 0; c < CALLS; c++) {
            uint8_t *want = digest_sync(&js[c]);
            for (int j = 0; j < js[c].n_jobs; j++)
                ck_assert_msg(memcmp(want + 32 * (size_t)j, got[c] + 32 * (size_t)j, 32) == 0,
                              "round %d call %d job %d: the digester and the synchronous path differ",
                              round, c, j);
            if (c % 50 == 0 || c == 7) check_jobs(&js[c], got[c], "many small calls, 256 KiB ring");
            free(want);
            free(got[c]);
            free_jobs(&js[c]);
        }
    }
    /* one call alone: its download is flushed by the wait */
    job_set one = make_jobs(1, 100);
    uint8_t out[32], *outs1[1] = {out};
    ck_assert_msg(ls_cuda_digester_submit(dg, one.jobs, outs1, 1, NULL, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_cuda_digester_wait(dg, &err) == LS_OK, "%s", err.msg);
    check_jobs(&one, out, "one call, flushed by the wait");
    free_jobs(&one);
    free(js);
    free(got);
    ls_cuda_digester_destroy(dg);
    ls_cuda_free(d_ring);
}
END_TEST

/* Marks: wait_for(mark) completes the submits made before the mark (a mark
 * taken before any submit waits for nothing), and the later submits are
 * completed by a later wait. */
START_TEST(test_digester_marks)
{
    ls_error err;
    ls_error_clear(&err);
    void *d_ring = NULL;
    ls_cuda_digester *dg = digester_on((size_t)8 << 20, 4, &d_ring);
    uint64_t m0 = ls_cuda_digester_mark(dg);
    ck_assert_msg(ls_cuda_digester_wait_for(dg, m0, &err) == LS_OK, "%s", err.msg);
    job_set a = make_jobs(3, 200000), b = make_jobs(5, 3000);
    uint8_t ga[3 * 32], gb[5 * 32], *oa[3], *ob[5];
    for (int j = 0; j < 3; j++) oa[j] = ga + 32 * j;
    for (int j = 0; j < 5; j++) ob[j] = gb + 32 * j;
    ck_assert_msg(ls_cuda_digester_submit(dg, a.jobs, oa, 3, NULL, &err) == LS_OK, "%s", err.msg);
    uint64_t m1 = ls_cuda_digester_mark(dg);
    ck_assert_msg(m1 > m0, "mark %llu after a submit, %llu before", (unsigned long long)m1,
                  (unsigned long long)m0);
    ck_assert_msg(ls_cuda_digester_submit(dg, b.jobs, ob, 5, NULL, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_cuda_digester_wait_for(dg, m1, &err) == LS_OK, "%s", err.msg);
    check_jobs(&a, ga, "the submit before the mark, after wait_for(mark)");
    ck_assert_msg(ls_cuda_digester_wait(dg, &err) == LS_OK, "%s", err.msg);
    check_jobs(&b, gb, "the submit after the mark, after wait");
    free_jobs(&a);
    free_jobs(&b);
    ls_cuda_digester_destroy(dg);
    ls_cuda_free(d_ring);
}
END_TEST

/* Digests in parts (sha256.h, part): every job of many calls hashed as two
 * parts, its first span then its second, the parts of a call in two calls,
 * through the digester (a 256 KiB ring) and through the synchronous path
 * (where parts are hashed on the host even when every other job goes to the
 * device); each equal to the canonical bytes' digest. */
START_TEST(test_digest_parts)
{
    ls_error err;
    ls_error_clear(&err);
    void *d_ring = NULL;
    ls_cuda_digester *dg = digester_on((size_t)256 << 10, 3, &d_ring);
    enum { CALLS = 30 };
    for (int sync = 0; sync < 2; sync++) {
        job_set js[CALLS];
        ls_cuda_digest_job *parts[CALLS][2];
        ls_sha256 *run[CALLS];
        uint8_t *got[CALLS];
        for (int c = 0; c < CALLS; c++) {
            int n = 1 + c % 9;
            js[c] = make_jobs(n, c % 7 == 0 ? 20000 : 900);
            got[c] = malloc((size_t)n * 32);
            run[c] = calloc((size_t)n, sizeof *run[c]);
            for (int p = 0; p < 2; p++) {
                parts[c][p] = calloc((size_t)n, sizeof *parts[c][p]);
                for (int j = 0; j < n; j++) {
                    ls_cuda_digest_job *q = &parts[c][p][j], *w = &js[c].jobs[j];
                    q->src[0] = w->src[p], q->n[0] = w->n[p], q->row_len[0] = w->row_len[p];
                    q->stride[0] = w->stride[p], q->bf16[0] = w->bf16[p];
                    q->part = &run[c][j], q->first = p == 0, q->last = p == 1;
                }
            }
        }
        for (int p = 0; p < 2; p++)
            for (int c = 0; c < CALLS; c++) {
                int n = js[c].n_jobs;
                uint8_t **outs = calloc((size_t)n, sizeof *outs);
                for (int j = 0; p == 1 && j < n; j++) outs[j] = got[c] + 32 * (size_t)j;
                if (sync) {
                    size_t sb = ls_cuda_digest_scratch_bytes(parts[c][p], n);
                    void *scr = NULL;
                    uint8_t *dig = malloc((size_t)n * 32);
                    ck_assert_int_eq(ls_cuda_malloc(&scr, sb, &err), LS_OK);
                    ck_assert_msg(ls_cuda_digest(parts[c][p], n, scr, sb, SIZE_MAX, host_sha, dig, NULL, &err) ==
                                      LS_OK, "%s", err.msg);
                    if (p == 1) memcpy(got[c], dig, (size_t)n * 32);
                    free(dig);
                    ls_cuda_free(scr);
                } else {
                    ck_assert_msg(ls_cuda_digester_submit(dg, parts[c][p], outs, n, NULL, &err) == LS_OK, "%s",
                                  err.msg);
                }
                free(outs);
            }
        if (!sync) ck_assert_msg(ls_cuda_digester_wait(dg, &err) == LS_OK, "%s", err.msg);
        for (int c = 0; c < CALLS; c++) {
            check_jobs(&js[c], got[c], sync ? "two parts, synchronous" : "two parts, asynchronous digester");
            for (int j = 0; j < js[c].n_jobs; j++) ck_assert_ptr_null(run[c][j].evp); /* every hash ended */
            free(got[c]), free(run[c]), free(parts[c][0]), free(parts[c][1]);
            free_jobs(&js[c]);
        }
    }
    ls_cuda_digester_destroy(dg);
    ls_cuda_free(d_ring);
}
END_TEST

START_TEST(test_digest_all_host)
{
    run_case(40, 3000, 0);
    run_case(3, 2048, 0); /* a decode step's few rows */
}
END_TEST

/* n jobs of one contiguous bf16 span of `elems` elements each (the planner
 * reads only the lengths). */
static size_t plan_for(int n, uint64_t elems, size_t split)
{
    ls_cuda_digest_job *jobs = calloc((size_t)n, sizeof *jobs);
    ck_assert_ptr_nonnull(jobs);
    for (int j = 0; j < n; j++) {
        jobs[j].n[0] = elems;
        jobs[j].bf16[0] = 1;
    }
    size_t p = ls_cuda_digest_plan(jobs, n, split);
    free(jobs);
    return p;
}

START_TEST(test_digest_plan)
{
    /* decode, batch 1 and 32: hidden rows of 2048 bf16 (4 KB) -> the host */
    ck_assert_uint_eq(plan_for(1, 2048, 32768), 0);
    ck_assert_uint_eq(plan_for(32, 2048, 32768), 0);
    /* prefill of 1024 rows: the device hashes them in parallel */
    ck_assert_uint_ne(plan_for(1024, 2048, 32768), 0);
    /* a 2 MiB state alone: the host (the split or all-host plan) */
    size_t p = plan_for(1, 1 << 20, 32768);
    ck_assert_msg(p < ((size_t)2 << 20), "a 2 MiB state: plan %zu", p);
    /* a prefill's 1024 states of 2 MiB (state digests at every position):
     * 2 GiB is slower down the link than 1024 threads at once */
    ck_assert_uint_eq(plan_for(1024, 1 << 20, 32768), SIZE_MAX);
    printf("  ok digest planner: decode rows on the host, prefill rows on the device\n");
}
END_TEST

START_TEST(test_digest_empty)
{
    ls_error err;
    ls_error_clear(&err);
    ls_cuda_digest_job j;
    memset(&j, 0, sizeof j);
    size_t sb = ls_cuda_digest_scratch_bytes(&j, 1);
    void *scr = NULL;
    ck_assert_int_eq(ls_cuda_malloc(&scr, sb, &err), LS_OK);
    uint8_t got[32];
    ck_assert_int_eq(ls_cuda_digest(&j, 1, scr, sb, SIZE_MAX, NULL, got, NULL, &err), LS_OK);
    ls_digest want;
    ck_assert_int_eq(ls_sha256_buf("", 0, &want, &err), LS_OK);
    ck_assert_mem_eq(want.bytes, got, 32);
    /* too little scratch fails closed */
    ck_assert_int_eq(ls_cuda_digest(&j, 1, scr, 16, SIZE_MAX, NULL, got, NULL, &err), LS_E_UNSUPPORTED);
    ls_cuda_free(scr);
}
END_TEST
#endif

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
#ifdef LOCKSTEP_HAVE_CUDA
    Suite *s = suite_create("gpu_digest");
    TCase *tc = tcase_create("digest");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_digest_small_spans);
    tcase_add_test(tc, test_digest_rows);
    tcase_add_test(tc, test_digest_long_host_and_device);
    tcase_add_test(tc, test_digest_all_host);
    tcase_add_test(tc, test_digester);
    tcase_add_test(tc, test_digester_many_small);
    tcase_add_test(tc, test_digester_marks);
    tcase_add_test(tc, test_digest_parts);
    tcase_add_test(tc, test_digest_plan);
    tcase_add_test(tc, test_digest_empty);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
#else
    return LS_GPU_SKIP;
#endif
}
