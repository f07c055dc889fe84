/* Corruption campaign: truncation at every frame boundary and inside every
 * frame, byte flips in the header, every frame and the trailer. Each must be
 * an error naming the right byte offset with exit code 2 (both for 'trace
 * dump' and 'compare'); a prefix ending at a frame boundary is incomplete. */
#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "trace_synth.h"

static uint32_t rd32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static char *dir, src[4200], bad[4200];
static unsigned char *file;
static size_t file_len;
static uint64_t bounds[64];  /* bounds[0] = first frame, ..., bounds[n] = trailer */
static int n_frames;

static void setup(void)
{
    dir = ls_test_tmpdir("corrupt");
    snprintf(src, sizeof src, "%s/good.trace", dir);
    snprintf(bad, sizeof bad, "%s/bad.trace", dir);
    syn_opts o = {.n_seqs = 2, .prompt_len = 4, .gen_len = 5, .dumps = 1};
    ck_assert_int_eq(syn_write(src, &o), 0);
    file = (unsigned char *)ls_test_read(src, &file_len);
    /* walk the layout as docs/trace-format.md describes it */
    uint64_t off = 16 + rd32(file + 12) + 32;
    n_frames = 0;
    while (memcmp(file + off, "LSFR", 4) == 0) {
        bounds[n_frames++] = off;
        off += 40 + 12 * (uint64_t)rd32(file + off + 16) + 32 + rd64(file + off + 32);
    }
    bounds[n_frames] = off;
    ck_assert(memcmp(file + off, "LSEN", 4) == 0);
    ck_assert_uint_eq(off + 96, file_len);
    ck_assert_int_eq(n_frames, 6);
}

static void teardown(void)
{
    free(file);
    ls_test_rm_tmpdir(dir);
}

/* Runs dump and compare on bad; both must exit 2 and mention want. */
static void expect_error(const char *want, const char *what)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump '%s'", bad);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "%s: dump rc %d, wanted '%s' in: %.600s", what, rc, want,
                  out ? out + (strlen(out) > 600 ? strlen(out) - 600 : 0) : "");
    free(out);
    rc = ls_test_cli(&out, "compare '%s' '%s'", src, bad);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "%s: compare(B) rc %d, wanted '%s' in: %s", what, rc, want, out);
    free(out);
    rc = ls_test_cli(&out, "compare '%s' '%s'", bad, src);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "%s: compare(A) rc %d, wanted '%s' in: %s", what, rc, want, out);
    free(out);
}

START_TEST(test_truncate_at_boundaries)
{
    for (int f = 0; f <= n_frames; f++) {
        ls_test_write(bad, file, bounds[f]);
        char *out = NULL;
        int rc = ls_test_cli(&out, "trace dump '%s'", bad);
        ck_assert_msg(rc == 2 && strstr(out, "INCOMPLETE") && strstr(out, "incomplete trace"), "boundary %d: %s", f, out);
        free(out);
        rc = ls_test_cli(&out, "compare '%s' '%s'", bad, bad);
        ck_assert_msg(rc == 2 && strstr(out, "incomplete"), "boundary %d: %s", f, out);
        free(out);
        /* the valid prefix is comparable on request: equal to itself */
        rc = ls_test_cli(&out, "compare --allow-incomplete '%s' '%s'", bad, bad);
        ck_assert_msg(rc == 0, "boundary %d: rc %d: %s", f, rc, out);
        free(out);
        /* and against the complete trace, the missing positions are a drift */
        if (f < n_frames) {
            rc = ls_test_cli(&out, "compare --allow-incomplete '%s' '%s'", bad, src);
            ck_assert_msg(rc == 1 && strstr(out, "only in trace B"), "boundary %d: rc %d: %s", f, rc, out);
            free(out);
        }
    }
}
END_TEST

START_TEST(test_truncate_inside)
{
    char want[64];
    for (int f = 0; f < n_frames; f++) {
        uint64_t len = bounds[f + 1] - bounds[f];
        uint64_t cuts[] = {bounds[f] + 2, bounds[f] + 20, bounds[f] + 60, bounds[f] + len / 2, bounds[f + 1] - 1};
        for (int c = 0; c < 5; c++) {
            ls_test_write(bad, file, cuts[c]);
            snprintf(want, sizeof want, "offset %" PRIu64, bounds[f]);
            char what[64];
            snprintf(what, sizeof what, "frame %d cut at %" PRIu64, f, cuts[c]);
            expect_error(want, what);
        }
    }
    /* inside the trailer */
    ls_test_write(bad, file, bounds[n_frames] + 50);
    snprintf(want, sizeof want, "offset %" PRIu64 ": trailer truncated", bounds[n_frames]);
    expect_error(want, "trailer cut");
    /* inside the header */
    ls_test_write(bad, file, 40);
    expect_error("truncated header", "header cut");
    ls_test_write(bad, file, 5);
    expect_error("offset 0", "magic cut");
}
END_TEST

START_TEST(test_flips)
{
    char want[96];
    unsigned char *c = malloc(file_len);
    /* header: JSON byte and the checksum */
    uint64_t hdr_flips[] = {20, 60, bounds[0] - 1};
    for (int i = 0; i < 3; i++) {
        memcpy(c, file, file_len);
        c[hdr_flips[i]] ^= 0x01;
        ls_test_write(bad, c, file_len);
        expect_error("offset 0: header checksum mismatch", "header flip");
    }
    /* frames: magic, counts, segment table, checksum, payload start and end */
    for (int f = 0; f < n_frames; f++) {
        uint64_t b = bounds[f], e = bounds[f + 1];
        uint64_t at[] = {b, b + 12, b + 41, b + 40 + 12 * rd32(file + b + 16) + 3, e - 20, e - 1};
        for (int i = 0; i < 6; i++) {
            memcpy(c, file, file_len);
            c[at[i]] ^= 0x40;
            ls_test_write(bad, c, file_len);
            snprintf(want, sizeof want, "offset %" PRIu64 ":", b);
            char what[64];
            snprintf(what, sizeof what, "frame %d flip at %" PRIu64, f, at[i]);
            expect_error(want, what);
        }
    }
    /* trailer */
    for (int i = 0; i < 96; i += 19) {
        memcpy(c, file, file_len);
        c[bounds[n_frames] + i] ^= 0x01;
        ls_test_write(bad, c, file_len);
        snprintf(want, sizeof want, "offset %" PRIu64 ":", bounds[n_frames]);
        expect_error(want, "trailer flip");
    }
    /* garbage after the trailer */
    memcpy(c, file, file_len);
    FILE *fp = fopen(bad, "wb");
    fwrite(c, 1, file_len, fp);
    fputs("xx", fp);
    fclose(fp);
    snprintf(want, sizeof want, "offset %zu: 2 unexpected bytes", file_len);
    expect_error(want, "trailing bytes");
    free(c);
}
END_TEST

/* A header whose content_checksum no longer matches its payload, with the
 * header checksum recomputed so that only the header-payload binding fails. */
START_TEST(test_content_checksum_binding)
{
    char want[96];
    unsigned char *c = malloc(file_len);
    for (int f = 0; f < n_frames; f++) {
        uint64_t b = bounds[f], hb = 40 + 12 * (uint64_t)rd32(file + b + 16);
        memcpy(c, file, file_len);
        c[b + 20] ^= 0x01;
        ls_digest d;
        ck_assert_int_eq(ls_sha256_buf(c + b, hb, &d, NULL), LS_OK);
        memcpy(c + b + hb, d.bytes, 32);
        ls_test_write(bad, c, file_len);
        snprintf(want, sizeof want, "offset %" PRIu64 ": frame %d checksum mismatch", b, f);
        expect_error(want, "content checksum");
    }
    free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_corrupt");
    TCase *tc = tcase_create("corrupt");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_truncate_at_boundaries);
    tcase_add_test(tc, test_truncate_inside);
    tcase_add_test(tc, test_flips);
    tcase_add_test(tc, test_content_checksum_binding);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
