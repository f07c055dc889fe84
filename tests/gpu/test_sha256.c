/* GPU SHA-256 against OpenSSL (ls_sha256_buf): every length 0..300 at aligned
 * and unaligned addresses, equal-length rows, large buffers, and the Merkle
 * digest against a host computation of the same definition (kernels/sha256.h). */
#include "gpu_testutil.h"

#include "fingerprint/sha256.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "sha256.h"

static void hex32(const uint8_t *d, char out[65])
{
    ls_digest x;
    memcpy(x.bytes, d, 32);
    ls_digest_to_hex(&x, out);
}

/* Checks n device digests (already downloaded) against OpenSSL over the spans. */
static void check_digests(const char *what, const uint8_t *host_data, const uint64_t *offs,
                          const uint64_t *lens, int n, const uint8_t *got)
{
    ls_error err;
    for (int i = 0; i < n; i++) {
        ls_digest want;
        ck_assert_int_eq(ls_sha256_buf(host_data + offs[i], lens[i], &want, &err), LS_OK);
        if (memcmp(want.bytes, got + 32 * (size_t)i, 32) != 0) {
            char a[65], b[65];
            hex32(want.bytes, a);
            hex32(got + 32 * (size_t)i, b);
            printf("MISMATCH %s: message %d (offset %" PRIu64 ", %" PRIu64 " bytes): openssl %s gpu %s\n",
                   what, i, offs[i], lens[i], a, b);
            ck_abort_msg("%s: digest %d differs", what, i);
        }
    }
}

START_TEST(test_sha256_spans_every_length)
{
    ls_error err;
    ls_error_clear(&err);
    enum { MAXLEN = 300, N = 2 * (MAXLEN + 1) };
    size_t buf_bytes = 4096;
    uint8_t *host = malloc(buf_bytes);
    uint64_t seed = 1;
    for (size_t i = 0; i < buf_bytes; i++) host[i] = (uint8_t)ls_gpu_rand_u64(&seed);
    uint64_t offs[N], lens[N];
    for (int len = 0; len <= MAXLEN; len++) {
        offs[2 * len] = 16 * (uint64_t)(len % 200);         /* aligned start */
        lens[2 * len] = (uint64_t)len;
        offs[2 * len + 1] = 1 + 3 * (uint64_t)(len % 997);  /* odd start: byte loads */
        lens[2 * len + 1] = (uint64_t)len;
    }
    ls_cuda_arena a;
    ck_assert_int_eq(ls_cuda_arena_init(&a, 1 << 20, &err), LS_OK);
    uint8_t *d_buf = ls_cuda_arena_alloc(&a, buf_bytes, &err);
    uint64_t *d_offs = ls_cuda_arena_alloc(&a, sizeof offs, &err);
    uint64_t *d_lens = ls_cuda_arena_alloc(&a, sizeof lens, &err);
    uint8_t *d_dig = ls_cuda_arena_alloc(&a, 32 * N, &err);
    ck_assert_ptr_nonnull(d_dig);
    ck_assert_int_eq(ls_cuda_upload(d_buf, host, buf_bytes, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_upload(d_offs, offs, sizeof offs, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_upload(d_lens, lens, sizeof lens, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_sha256_spans(d_buf, d_offs, d_lens, N, d_dig, NULL, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_sync(&err), LS_OK);
    uint8_t *got = malloc(32 * N);
    ck_assert_int_eq(ls_cuda_download(got, d_dig, 32 * N, &err), LS_OK);
    check_digests("spans", host, offs, lens, N, got);
    free(got);
    free(host);
    ls_cuda_arena_free(&a);
}
END_TEST

START_TEST(test_sha256_rows_and_large)
{
    ls_error err;
    ls_error_clear(&err);
    /* 1000 rows of 4096 bytes (a bf16 hidden row of width 2048) at stride 4160,
     * then three single large messages. */
    enum { ROWS = 1000 };
    size_t row = 4096, stride = 4160;
    size_t big = 5 * 1000 * 1000 + 13;
    size_t total = stride * ROWS + big;
    uint8_t *host = malloc(total);
    uint64_t seed = 7;
    for (size_t i = 0; i < total; i++) host[i] = (uint8_t)ls_gpu_rand_u64(&seed);
    ls_cuda_arena a;
    ck_assert_int_eq(ls_cuda_arena_init(&a, total + (1 << 20), &err), LS_OK);
    uint8_t *d_buf = ls_cuda_arena_alloc(&a, total, &err);
    uint8_t *d_dig = ls_cuda_arena_alloc(&a, 32 * ROWS, &err);
    ck_assert_ptr_nonnull(d_dig);
    ck_assert_int_eq(ls_cuda_upload(d_buf, host, total, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_sha256_rows(d_buf, row, stride, ROWS, d_dig, NULL, &err), LS_OK);
    uint8_t *got = malloc(32 * ROWS);
    ck_assert_int_eq(ls_cuda_sync(&err), LS_OK);
    ck_assert_int_eq(ls_cuda_download(got, d_dig, 32 * ROWS, &err), LS_OK);
    uint64_t offs[ROWS], lens[ROWS];
    for (int r = 0; r < ROWS; r++) {
        offs[r] = (uint64_t)r * stride;
        lens[r] = row;
    }
    check_digests("rows", host, offs, lens, ROWS, got);

    /* Large: the FIPS one-million-'a' vector, a 5 MB random message at an
     * aligned start and the same less one byte at an odd start. */
    memset(host, 'a', 1000000);
    ck_assert_int_eq(ls_cuda_upload(d_buf, host, 1000000, &err), LS_OK);
    uint64_t boffs[3] = {0, stride * ROWS, stride * ROWS + 1};
    uint64_t blens[3] = {1000000, big, big - 1};
    uint64_t *d_offs = ls_cuda_arena_alloc(&a, sizeof boffs, &err);
    uint64_t *d_lens = ls_cuda_arena_alloc(&a, sizeof blens, &err);
    ck_assert_ptr_nonnull(d_lens);
    ck_assert_int_eq(ls_cuda_upload(d_offs, boffs, sizeof boffs, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_upload(d_lens, blens, sizeof blens, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_sha256_spans(d_buf, d_offs, d_lens, 3, d_dig, NULL, &err), LS_OK);
    ck_assert_int_eq(ls_cuda_sync(&err), LS_OK);
    ck_assert_int_eq(ls_cuda_download(got, d_dig, 96, &err), LS_OK);
    char hex[65];
    hex32(got, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    check_digests("large", host, boffs, blens, 3, got);
    free(got);
    free(host);
    ls_cuda_arena_free(&a);
}
END_TEST

/* Host computation of the Merkle definition in kernels/sha256.h. */
static void merkle_host(const uint8_t *data, size_t n, size_t leaf, uint8_t root[32])
{
    size_t n_leaves = n == 0 ? 1 : (n + leaf - 1) / leaf;
    uint8_t *leaves = malloc(32 * n_leaves);
    ls_error err;
    for (size_t i = 0; i < n_leaves; i++) {
        size_t start = i * leaf, len = n - start < leaf ? n - start : leaf;
        ls_digest d;
        ck_assert_int_eq(ls_sha256_buf(data + start, len, &d, &err), LS_OK);
        memcpy(leaves + 32 * i, d.bytes, 32);
    }
    ls_digest r;
    ck_assert_int_eq(ls_sha256_buf(leaves, 32 * n_leaves, &r, &err), LS_OK);
    memcpy(root, r.bytes, 32);
    free(leaves);
}

START_TEST(test_sha256_merkle)
{
    ls_error err;
    ls_error_clear(&err);
    /* GDN state of one layer (32 x 128 x 128 fp32) plus odd sizes. */
    size_t sizes[] = {0, 1, 64, 4095, 4096, 4097, 2u * 1024 * 1024, 2u * 1024 * 1024 + 17};
    size_t leafs[] = {64, 4096, 65536};
    size_t maxn = 2u * 1024 * 1024 + 17;
    uint8_t *host = malloc(maxn);
    uint64_t seed = 99;
    for (size_t i = 0; i < maxn; i++) host[i] = (uint8_t)ls_gpu_rand_u64(&seed);
    ls_cuda_arena a;
    ck_assert_int_eq(ls_cuda_arena_init(&a, maxn + 2 * 1024 * 1024, &err), LS_OK);
    uint8_t *d_buf = ls_cuda_arena_alloc(&a, maxn, &err);
    uint8_t *d_scratch = ls_cuda_arena_alloc(&a, ls_cuda_merkle_scratch_bytes(maxn, 64), &err);
    uint8_t *d_root = ls_cuda_arena_alloc(&a, 32, &err);
    ck_assert_ptr_nonnull(d_root);
    ck_assert_int_eq(ls_cuda_upload(d_buf, host, maxn, &err), LS_OK);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (size_t li = 0; li < sizeof leafs / sizeof leafs[0]; li++) {
            uint8_t want[32], got[32];
            merkle_host(host, sizes[si], leafs[li], want);
            ck_assert_int_eq(ls_cuda_merkle_sha256(d_buf, sizes[si], leafs[li], d_scratch, d_root,
                                                   NULL, &err), LS_OK);
            ck_assert_int_eq(ls_cuda_sync(&err), LS_OK);
            ck_assert_int_eq(ls_cuda_download(got, d_root, 32, &err), LS_OK);
            if (memcmp(want, got, 32) != 0) {
                char x[65], y[65];
                hex32(want, x);
                hex32(got, y);
                printf("MISMATCH merkle: %zu bytes, leaf %zu: host %s gpu %s\n", sizes[si], leafs[li], x, y);
                ck_abort_msg("merkle digest differs");
            }
        }
    }
    /* A leaf size the definition forbids fails closed. */
    ck_assert_int_eq(ls_cuda_merkle_sha256(d_buf, 100, 100, d_scratch, d_root, NULL, &err),
                     LS_E_UNSUPPORTED);
    free(host);
    ls_cuda_arena_free(&a);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("gpu_sha256");
    TCase *tc = tcase_create("sha256");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_sha256_spans_every_length);
    tcase_add_test(tc, test_sha256_rows_and_large);
    tcase_add_test(tc, test_sha256_merkle);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
#else
int main(void)
{
    (void)ls_gpu_available();
    return LS_GPU_SKIP;
}
#endif
