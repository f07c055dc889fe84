/* Core services: status messages, SHA-256 test vectors, atomic output, arena,
 * bf16 rounding and the canonical LS_DOT32 order. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "core/util.h"
#include "fingerprint/sha256.h"
#include "numerics/reduce.h"
#include "testutil.h"

START_TEST(test_fail_formats_one_line)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_fail(&err, LS_E_INPUT, "%s: bad\nthing at %d", "f.json", 7), LS_E_INPUT);
    ck_assert_str_eq(err.msg, "f.json: bad thing at 7");
    ls_error_prefix(&err, "reading %s", "dir");
    ck_assert_str_eq(err.msg, "reading dir: f.json: bad thing at 7");
    ck_assert_int_eq(ls_status_exit_code(LS_E_INPUT), 2);
    ck_assert_int_eq(ls_status_exit_code(LS_OK), 0);
}
END_TEST

static void check_vector(const char *msg, size_t len, const char *want)
{
    ls_digest d;
    ls_error err;
    ck_assert_int_eq(ls_sha256_buf(msg, len, &d, &err), LS_OK);
    char hex[65];
    ls_digest_to_hex(&d, hex);
    ck_assert_str_eq(hex, want);
}

/* FIPS 180-2 / NIST CAVS published vectors. */
START_TEST(test_sha256_vectors)
{
    check_vector("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_vector("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_vector(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    check_vector(million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
    ls_digest d;
    ls_error err;
    ck_assert_int_eq(ls_digest_from_hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015AD", &d, &err), LS_OK);
    ck_assert_int_eq(ls_digest_from_hex("zz", &d, &err), LS_E_INPUT);
}
END_TEST

START_TEST(test_atomic_output)
{
    char *dir = ls_test_tmpdir("core");
    char path[4200];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    ls_outfile o;
    ls_error err;
    ck_assert_int_eq(ls_outfile_open(&o, path, &err), LS_OK);
    fputs("partial", o.fp);
    ck_assert_int_eq(access(path, F_OK), -1); /* nothing visible before commit */
    ls_outfile_abort(&o);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(access(o.tmp_path, F_OK), -1);
    ck_assert_int_eq(ls_write_file_atomic(path, "done", 4, &err), LS_OK);
    size_t n;
    char *back = ls_test_read(path, &n);
    ck_assert_uint_eq(n, 4);
    ck_assert_mem_eq(back, "done", 4);
    free(back);
    unlink(path);
    rmdir(dir);
    free(dir);
}
END_TEST

START_TEST(test_arena)
{
    ls_arena a;
    ls_arena_init(&a);
    ls_error err;
    unsigned char *p = ls_arena_alloc(&a, 100, &err);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 64, 0);
    for (int i = 0; i < 100; i++) ck_assert_uint_eq(p[i], 0);
    ck_assert_ptr_nonnull(ls_arena_alloc(&a, 1, &err));
    ck_assert_uint_ge(a.bytes_total, 128);
    ls_arena_free(&a);
    ck_assert_uint_eq(a.bytes_total, 0);
}
END_TEST

START_TEST(test_bf16_rounding)
{
    ck_assert_uint_eq(ls_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1. */
    ck_assert_uint_eq(ls_f32_to_bf16(ls_f32_from_bits(0x3f808000u)), 0x3f80);
    /* just above halfway rounds up */
    ck_assert_uint_eq(ls_f32_to_bf16(ls_f32_from_bits(0x3f808001u)), 0x3f81);
    /* halfway with odd lower neighbour rounds up to even */
    ck_assert_uint_eq(ls_f32_to_bf16(ls_f32_from_bits(0x3f818000u)), 0x3f82);
    ck_assert_uint_eq(ls_f32_to_bf16(ls_f32_from_bits(0x7f7fffffu)), 0x7f80); /* overflow -> inf */
    uint16_t nan = ls_f32_to_bf16(ls_f32_from_bits(0x7f800001u));
    ck_assert_uint_eq(nan & 0x7f80, 0x7f80);
    ck_assert_uint_ne(nan & 0x7f, 0);
}
END_TEST

START_TEST(test_dot32_order)
{
    /* The canonical order differs from a sequential sum on this input: prove
     * the implementation follows the documented lanes + butterfly order. */
    enum { N = 70 };
    float a[N], b[N];
    for (int k = 0; k < N; k++) {
        a[k] = k == 0 ? 1e8f : 1.0f; /* a sequential sum loses every 1 */
        b[k] = 1.0f;
    }
    float p[32] = {0};
    for (int k = 0; k < N; k++) p[k % 32] = p[k % 32] + a[k] * b[k];
    for (int s = 16; s >= 1; s >>= 1)
        for (int l = 0; l < s; l++) p[l] = p[l] + p[l + s];
    ck_assert_uint_eq(ls_f32_bits(ls_dot32_f32(a, b, N)), ls_f32_bits(p[0]));
    float seq = 0.0f;
    for (int k = 0; k < N; k++) seq = seq + a[k] * b[k];
    ck_assert_uint_ne(ls_f32_bits(seq), ls_f32_bits(p[0]));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_fail_formats_one_line);
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_atomic_output);
    tcase_add_test(tc, test_arena);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_dot32_order);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
