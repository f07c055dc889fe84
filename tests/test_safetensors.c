/* safetensors header validation: one test per rule (each asserts the status
 * and a piece of the message, so removing a rule fails its test), plus valid
 * files read back through the file and memory entry points. */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/status.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "st_image.h"
#include "testutil.h"

/* Opens header + data_len pattern bytes from memory; expects LS_E_INPUT with
 * every one of the NULL-terminated substrings in the message. */
static void expect_bad_image(const unsigned char *img, size_t len, const char *const *subs)
{
    ls_safetensors *st = (ls_safetensors *)0x1;
    ls_error err;
    ls_error_clear(&err);
    ls_status rc = ls_safetensors_open_mem("bad.safetensors", img, len, &st, &err);
    ck_assert_msg(rc == LS_E_INPUT, "expected input error, got %s (%s)", ls_status_name(rc), err.msg);
    ck_assert_ptr_null(st);
    ck_assert_msg(strncmp(err.msg, "bad.safetensors: ", 17) == 0, "message lacks file: %s", err.msg);
    ck_assert_msg(strstr(err.msg, "byte offset ") != NULL, "message lacks offset: %s", err.msg);
    for (; *subs; subs++) ck_assert_msg(strstr(err.msg, *subs) != NULL, "'%s' not in: %s", *subs, err.msg);
}

#define EXPECT_BAD(header, data_len, ...)                                       \
    do {                                                                        \
        size_t len_;                                                            \
        unsigned char *img_ = st_image((header), NULL, (data_len), &len_);      \
        const char *subs_[] = {__VA_ARGS__, NULL};                              \
        expect_bad_image(img_, len_, subs_);                                    \
        free(img_);                                                             \
    } while (0)

/* A well-formed entry for a 2x2 F32 tensor at [b, b+16). */
#define T16(b, e) "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[" #b "," #e "]}"

START_TEST(test_dtype_table)
{
    static const struct { const char *n; size_t sz; } want[] = {
        {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"I16", 2}, {"I32", 4}, {"I64", 8}, {"F16", 2},
        {"BF16", 2}, {"F32", 4}, {"F64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ls_dtype dt;
        ck_assert_int_eq(ls_dtype_parse(want[i].n, &dt), 0);
        ck_assert_str_eq(ls_dtype_name(dt), want[i].n);
        ck_assert_uint_eq(ls_dtype_size(dt), want[i].sz);
    }
    ls_dtype dt;
    ck_assert_int_eq(ls_dtype_parse("F8_E4M3FN", &dt), -1);
    ck_assert_int_eq(ls_dtype_parse("bf16", &dt), -1);
    ck_assert_int_eq(ls_dtype_parse(NULL, &dt), -1);
    ck_assert_uint_eq(ls_dtype_size(LS_DTYPE_COUNT), 0);
}
END_TEST

START_TEST(test_rule_file_too_short)
{
    const unsigned char img[5] = {1, 0, 0, 0, 0};
    const char *subs[] = {"5 bytes, too short", "byte offset 0", NULL};
    expect_bad_image(img, sizeof img, subs);
    const char *subs0[] = {"0 bytes, too short", NULL};
    expect_bad_image(NULL, 0, subs0);
}
END_TEST

START_TEST(test_rule_header_too_large)
{
    unsigned char img[16] = {0};
    uint64_t n = 100000001ull;
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)(n >> (8 * i));
    const char *subs[] = {"header length 100000001 exceeds the limit", NULL};
    expect_bad_image(img, sizeof img, subs);
    /* The maximum 64-bit length must not wrap 8 + N. */
    memset(img, 0xff, 8);
    const char *subs2[] = {"exceeds the limit", NULL};
    expect_bad_image(img, sizeof img, subs2);
}
END_TEST

START_TEST(test_rule_header_past_end)
{
    unsigned char img[12] = {5, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    const char *subs[] = {"header length 5 runs past the end of the 12-byte file", NULL};
    expect_bad_image(img, sizeof img, subs);
}
END_TEST

START_TEST(test_rule_header_json)
{
    EXPECT_BAD("{\"a\":", 0, "header is not valid JSON", "line 1");
    /* Invalid UTF-8 inside a string. */
    EXPECT_BAD("{\"\xff\":" T16(0, 16) "}", 16, "header is not valid JSON");
    /* Trailing garbage after the object. */
    EXPECT_BAD("{} x", 0, "header is not valid JSON");
    EXPECT_BAD("", 0, "header is not valid JSON");
}
END_TEST

START_TEST(test_rule_header_duplicate_key)
{
    EXPECT_BAD("{\"w\":" T16(0, 16) ",\"w\":" T16(0, 16) "}", 16, "duplicate object key", "\"w\"");
}
END_TEST

START_TEST(test_rule_header_not_object)
{
    EXPECT_BAD("[1,2]", 0, "header is not a JSON object", "byte offset 8");
}
END_TEST

START_TEST(test_rule_entry_not_object)
{
    /* Key "w" starts at position 1 of the header -> file offset 9. */
    EXPECT_BAD("{\"w\":[1]}", 0, "tensor 'w': entry is not a JSON object", "byte offset 9");
    /* Offset of a later key, and one written with an escape. */
    const char *h = "{\"a\":" T16(0, 16) ", \"\\u0062\":3}";
    char want[64];
    snprintf(want, sizeof want, "byte offset %zu", 8 + (size_t)(strstr(h, "\"\\u0062") - h));
    EXPECT_BAD(h, 16, "tensor 'b'", want);
}
END_TEST

START_TEST(test_rule_unknown_key)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4,
               "tensor 'w': unknown key 'extra'");
}
END_TEST

START_TEST(test_rule_missing_key)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': missing key 'data_offsets'");
    EXPECT_BAD("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing key 'dtype'");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "missing key 'shape'");
}
END_TEST

START_TEST(test_rule_dtype)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': unknown dtype 'F7'");
    EXPECT_BAD("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string");
}
END_TEST

START_TEST(test_rule_shape)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12, "shape is not an array");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not a non-negative integer");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8,
               "shape[1] is not a non-negative integer");
    EXPECT_BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
               "shape has 9 dimensions, at most 8");
}
END_TEST

START_TEST(test_rule_offsets)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
               "data_offsets is not a [begin, end] pair");
    EXPECT_BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
               "data_offsets are not non-negative integers");
    EXPECT_BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
               "data_offsets begin 4 > end 0");
}
END_TEST

START_TEST(test_rule_size_mismatch)
{
    EXPECT_BAD("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': shape x dtype BF16 is 6 bytes but data_offsets span 4 bytes");
    /* 2^62 * 2^62 elements overflows 64 bits: reported, not wrapped. */
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
               "\"data_offsets\":[0,0]}}", 0, "is more than");
    /* numel fits but numel * 4 does not. */
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
               "is more than");
}
END_TEST

START_TEST(test_rule_zero_dim_is_empty)
{
    /* A zero dimension makes the tensor empty even if other dims are huge. */
    size_t len;
    unsigned char *img = st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904,0],"
                                  "\"data_offsets\":[0,0]}}", NULL, 0, &len);
    ls_safetensors *st = NULL;
    ls_error err;
    ck_assert_int_eq(ls_safetensors_open_mem("z", img, len, &st, &err), LS_OK);
    ck_assert_uint_eq(ls_safetensors_at(st, 0)->numel, 0);
    ck_assert_uint_eq(ls_safetensors_at(st, 0)->size_bytes, 0);
    ls_safetensors_close(st);
    free(img);
}
END_TEST

START_TEST(test_rule_offsets_past_data)
{
    /* Header "{"w":...}" ; data region is 8 bytes but the tensor ends at 16. */
    EXPECT_BAD("{\"w\":" T16(0, 16) "}", 8, "tensor 'w': data_offsets [0, 16) run past the data region of 8 bytes");
}
END_TEST

START_TEST(test_rule_gap)
{
    /* Header length: count it to check the absolute offset 8 + N + begin. */
    const char *h = "{\"a\":" T16(0, 16) ",\"b\":" T16(20, 36) "}";
    char want[64];
    snprintf(want, sizeof want, "byte offset %zu", 8 + strlen(h) + 20);
    EXPECT_BAD(h, 36, "tensor 'b': gap of 4 bytes after tensor 'a'", want);
}
END_TEST

START_TEST(test_rule_first_not_zero)
{
    EXPECT_BAD("{\"a\":" T16(4, 20) "}", 20, "tensor 'a': data starts at offset 4, not 0");
}
END_TEST

START_TEST(test_rule_overlap)
{
    const char *h = "{\"a\":" T16(0, 16) ",\"b\":" T16(8, 24) "}";
    char want[64];
    snprintf(want, sizeof want, "byte offset %zu", 8 + strlen(h) + 8);
    EXPECT_BAD(h, 24, "tensor 'b': data [8, 24) overlaps tensor 'a' which ends at 16", want);
    /* Identical spans are an overlap too. */
    EXPECT_BAD("{\"a\":" T16(0, 16) ",\"b\":" T16(0, 16) "}", 16, "overlaps tensor 'a'");
}
END_TEST

START_TEST(test_rule_trailing_bytes)
{
    EXPECT_BAD("{\"a\":" T16(0, 16) "}", 20, "data region is 20 bytes but tensors cover only 16",
               "4 trailing bytes");
    EXPECT_BAD("{}", 3, "data region is 3 bytes but tensors cover only 0");
}
END_TEST

START_TEST(test_rule_metadata)
{
    EXPECT_BAD("{\"__metadata__\":[1]}", 0, "__metadata__ is not a JSON object", "byte offset 9");
    EXPECT_BAD("{\"__metadata__\":{\"format\":\"pt\",\"n\":3}}", 0, "__metadata__ value of 'n' is not a string");
}
END_TEST

START_TEST(test_valid_file)
{
    static const uint16_t w_data[6] = {1, 2, 3, 4, 5, 6};
    const st_spec ts[] = {
        {"b.weight", "BF16", 2, {2, 3}, 2, w_data},
        {"a.bias", "F32", 1, {3}, 4, NULL},
        {"scalar", "I64", 0, {0}, 8, NULL},
        {"empty", "F16", 2, {0, 5}, 2, NULL},
    };
    size_t len;
    unsigned char *img = st_image_of(ts, 4, "{\"format\":\"pt\",\"a\":\"b\"}", &len);
    char *dir = ls_test_tmpdir("st");
    char path[4200];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    ls_test_write(path, img, len);

    for (int from_file = 0; from_file < 2; from_file++) {
        ls_safetensors *st = NULL;
        ls_error err;
        ls_error_clear(&err);
        ls_status rc = from_file ? ls_safetensors_open(path, &st, &err)
                                 : ls_safetensors_open_mem("mem", img, len, &st, &err);
        ck_assert_msg(rc == LS_OK, "%s", err.msg);
        ck_assert_str_eq(ls_safetensors_label(st), from_file ? path : "mem");
        ck_assert_uint_eq(ls_safetensors_count(st), 4);
        /* Data order: b.weight at 0, a.bias at 12, the 8-byte scalar at 24,
         * then the empty tensor at [32, 32). */
        ck_assert_str_eq(ls_safetensors_at(st, 0)->name, "b.weight");
        ck_assert_str_eq(ls_safetensors_at(st, 1)->name, "a.bias");
        ck_assert_str_eq(ls_safetensors_at(st, 2)->name, "scalar");
        ck_assert_str_eq(ls_safetensors_at(st, 3)->name, "empty");
        ck_assert_ptr_null(ls_safetensors_at(st, 4));
        const ls_tensor *t = ls_safetensors_find(st, "b.weight");
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->dtype, LS_DTYPE_BF16);
        ck_assert_int_eq(t->ndim, 2);
        ck_assert_int_eq(t->shape[0], 2);
        ck_assert_int_eq(t->shape[1], 3);
        ck_assert_uint_eq(t->numel, 6);
        ck_assert_uint_eq(t->size_bytes, 12);
        ck_assert_int_eq(memcmp(t->data, w_data, 12), 0);
        size_t hl = (size_t)img[0] | (size_t)img[1] << 8;
        ck_assert_uint_eq(t->file_offset_bytes, 8 + hl);
        const ls_tensor *s = ls_safetensors_find(st, "scalar");
        ck_assert_int_eq(s->ndim, 0);
        ck_assert_uint_eq(s->numel, 1);
        ck_assert_uint_eq(s->size_bytes, 8);
        ck_assert_uint_eq(s->file_offset_bytes, 8 + hl + 24);
        ck_assert_uint_eq(ls_safetensors_find(st, "empty")->numel, 0);
        ck_assert_ptr_null(ls_safetensors_find(st, "missing"));
        ck_assert_ptr_null(ls_safetensors_find(st, "a"));
        ck_assert_uint_eq(ls_safetensors_metadata_count(st), 2);
        const char *k, *v;
        ls_safetensors_metadata_at(st, 0, &k, &v);
        ck_assert_str_eq(k, "a");
        ck_assert_str_eq(v, "b");
        ls_safetensors_metadata_at(st, 1, &k, &v);
        ck_assert_str_eq(k, "format");
        ck_assert_str_eq(v, "pt");
        ls_safetensors_close(st);
    }
    free(img);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_open_missing_and_empty_file)
{
    char *dir = ls_test_tmpdir("st");
    char path[4200];
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    ls_safetensors *st = NULL;
    ls_error err;
    ck_assert_int_eq(ls_safetensors_open(path, &st, &err), LS_E_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "none.safetensors: cannot open"));
    ls_test_write(path, "", 0);
    ck_assert_int_eq(ls_safetensors_open(path, &st, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "0 bytes, too short"));
    ck_assert_int_eq(ls_safetensors_open(dir, &st, &err), LS_E_IO);
    ck_assert_ptr_null(st);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_header_padding_and_empty)
{
    /* Trailing spaces in the header are accepted (writers pad to 8). */
    size_t len;
    unsigned char *img = st_image("{}      ", NULL, 0, &len);
    ls_safetensors *st = NULL;
    ls_error err;
    ck_assert_int_eq(ls_safetensors_open_mem("e", img, len, &st, &err), LS_OK);
    ck_assert_uint_eq(ls_safetensors_count(st), 0);
    ls_safetensors_close(st);
    free(img);
}
END_TEST


/* ---- a mapped file cut short by another process (issue 16, ckpt-sigbus) ---- */

/* Runs body in a child whose stderr goes to a pipe, under the CLI's signal
 * handlers, with one registered temporary "<dir>/out.tmp.<pid>". Returns the
 * wait status; *said receives what the child wrote to stderr (caller frees). */
static int run_child(const char *dir, void (*body)(const char *), const char *arg, char **said)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        ls_signals_install();
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s/out.tmp.%ld", dir, (long)getpid());
        ls_temp_register(tmp, LS_TEMP_FILE);
        ls_test_write(tmp, "partial", 7);
        body(arg);
        _exit(0); /* body returned: the read did not fault */
    }
    close(fds[1]);
    size_t cap = 8192, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (ssize_t k; (k = read(fds[0], buf + n, cap - 1 - n)) > 0;) n += (size_t)k;
    buf[n] = '\0';
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    *said = buf;
    /* the temporary is gone whatever happened */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/out.tmp.%ld", dir, (long)pid);
    ck_assert_msg(access(tmp, F_OK) != 0, "temporary %s left behind", tmp);
    return status;
}

static volatile unsigned char sink;

/* Opens path through the reader, cuts the file to its first page and reads
 * the last byte of its data, which now lies past the end. */
static void read_after_truncate(const char *path)
{
    ls_safetensors *st = NULL;
    ls_error err;
    if (ls_safetensors_open(path, &st, &err) != LS_OK) _exit(3);
    const ls_tensor *t = ls_safetensors_at(st, 0);
    if (truncate(path, 4096) != 0) _exit(4);
    sink = ((const unsigned char *)t->data)[t->size_bytes - 1];
    ls_safetensors_close(st);
}

/* The same fault on a mapping nobody registered. */
static void read_unregistered(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) _exit(3);
    const unsigned char *m = mmap(NULL, 65536, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) _exit(3);
    close(fd); /* the mapping stays */
    if (truncate(path, 4096) != 0) _exit(4);
    sink = m[65535];
}

START_TEST(test_truncated_while_mapped)
{
    /* One F32 [16384] tensor: 64 KiB of data, far past the first page. */
    const st_spec ts[] = {{"w", "F32", 1, {16384}, 4, NULL}};
    size_t len;
    unsigned char *img = st_image_of(ts, 1, NULL, &len);
    char *dir = ls_test_tmpdir("stbus");
    char path[4200];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    ls_test_write(path, img, len);

    char *said = NULL;
    int status = run_child(dir, read_after_truncate, path, &said);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2,
                  "expected exit 2, got status 0x%x; stderr: %s", (unsigned)status, said);
    /* The byte read is the file's last; its page starts at a page boundary. */
    long page = sysconf(_SC_PAGESIZE);
    char want[4400];
    snprintf(want, sizeof want, "lockstep: %s: the file shrank while it was being read (mapped page at "
             "byte offset %llu is gone); was it modified during the run?\n", path,
             (unsigned long long)((len - 1) / (size_t)page * (size_t)page));
    ck_assert_str_eq(said, want);
    free(said);

    /* A SIGBUS on a mapping the reader did not make is not ours to explain:
     * the process dies of it, as without the handler (the temporary still
     * goes: run_child checks). */
    ls_test_write(path, img, len);
    status = run_child(dir, read_unregistered, path, &said);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS,
                  "expected death by SIGBUS, got status 0x%x; stderr: %s", (unsigned)status, said);
    ck_assert_msg(strstr(said, "shrank") == NULL, "unregistered mapping named: %s", said);
    free(said);
    free(img);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_rule_file_too_short);
    tcase_add_test(tc, test_rule_header_too_large);
    tcase_add_test(tc, test_rule_header_past_end);
    tcase_add_test(tc, test_rule_header_json);
    tcase_add_test(tc, test_rule_header_duplicate_key);
    tcase_add_test(tc, test_rule_header_not_object);
    tcase_add_test(tc, test_rule_entry_not_object);
    tcase_add_test(tc, test_rule_unknown_key);
    tcase_add_test(tc, test_rule_missing_key);
    tcase_add_test(tc, test_rule_dtype);
    tcase_add_test(tc, test_rule_shape);
    tcase_add_test(tc, test_rule_offsets);
    tcase_add_test(tc, test_rule_size_mismatch);
    tcase_add_test(tc, test_rule_zero_dim_is_empty);
    tcase_add_test(tc, test_rule_offsets_past_data);
    tcase_add_test(tc, test_rule_gap);
    tcase_add_test(tc, test_rule_first_not_zero);
    tcase_add_test(tc, test_rule_overlap);
    tcase_add_test(tc, test_rule_trailing_bytes);
    tcase_add_test(tc, test_rule_metadata);
    tcase_add_test(tc, test_valid_file);
    tcase_add_test(tc, test_open_missing_and_empty_file);
    tcase_add_test(tc, test_header_padding_and_empty);
    tcase_add_test(tc, test_truncated_while_mapped);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
