/* Strict JSON loading and the canonical form used for digests. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/json.h"
#include "testutil.h"

static char *canon_of(const char *text)
{
    json_t *j = NULL;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_json_load_buf("t", text, strlen(text), &j, &err) == LS_OK, "%s", err.msg);
    char *c = ls_json_canonical(j);
    ck_assert_ptr_nonnull(c);
    json_decref(j);
    return c;
}

static void expect_canon(const char *text, const char *want)
{
    char *c = canon_of(text);
    ck_assert_str_eq(c, want);
    /* Canonical text is a fixed point. */
    char *again = canon_of(c);
    ck_assert_str_eq(again, c);
    free(again);
    free(c);
}

START_TEST(test_canonical_form)
{
    expect_canon("{ \"b\" : [1, 2.5, true, null],\n \"a\": {\"z\": \"x\", \"y\": -0.0} }",
                 "{\"a\":{\"y\":-0.0,\"z\":\"x\"},\"b\":[1,2.5,true,null]}");
    expect_canon("[1.0, 0.1, 1e20, 1e-7, 100, 3.0e2]",
                 "[1.0,0.10000000000000001,1e20,9.9999999999999995e-8,100,300.0]");
    /* Byte order of UTF-8 keys; non-ASCII kept, control characters escaped,
     * '/' not escaped. */
    expect_canon("{\"\\u00e9\":1,\"Z\":2,\"a\":3,\"s\":\"a/b\\n\\u0001\\u00e9\"}",
                 "{\"Z\":2,\"a\":3,\"s\":\"a/b\\n\\u0001\xc3\xa9\",\"\xc3\xa9\":1}");
    expect_canon("\"top\"", "\"top\"");
    ck_assert_ptr_null(ls_json_canonical(NULL));
}
END_TEST

START_TEST(test_load_errors)
{
    json_t *j = (json_t *)0x1;
    ls_error err;
    const char *dup = "{\n  \"rope_theta\": 1,\n  \"rope_theta\": 2\n}";
    ck_assert_int_eq(ls_json_load_buf("config.json", dup, strlen(dup), &j, &err), LS_E_INPUT);
    ck_assert_ptr_null(j);
    ck_assert_ptr_nonnull(strstr(err.msg, "config.json: invalid JSON at line 3, column"));
    ck_assert_ptr_nonnull(strstr(err.msg, "byte offset"));
    ck_assert_ptr_nonnull(strstr(err.msg, "duplicate object key near '\"rope_theta\"'"));
    ck_assert_int_eq(ls_json_load_buf("x", "{\"a\":1}x", 8, &j, &err), LS_E_INPUT);
    ck_assert_int_eq(ls_json_load_buf("x", "\"\\u0000\"", 8, &j, &err), LS_E_INPUT);
    ck_assert_int_eq(ls_json_load_buf("x", "\"\xff\"", 3, &j, &err), LS_E_INPUT);
    ck_assert_int_eq(ls_json_load_buf("x", "", 0, &j, &err), LS_E_INPUT);
    ck_assert_int_eq(ls_json_load_buf("x", NULL, 0, &j, &err), LS_E_INPUT);
    /* Only len bytes are read: no NUL terminator needed. */
    ck_assert_int_eq(ls_json_load_buf("x", "[1]garbage", 3, &j, &err), LS_OK);
    ck_assert_int_eq(json_array_size(j), 1);
    json_decref(j);
}
END_TEST

/* A number jansson cannot hold fails the whole parse; the message names the
 * field it was the value of (jansson itself gives only the position). */
static void expect_number_field(const char *text, const char *reason, const char *field)
{
    json_t *j = (json_t *)0x1;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_json_load_buf("config.json", text, strlen(text), &j, &err), LS_E_INPUT);
    ck_assert_ptr_null(j);
    ck_assert_msg(strstr(err.msg, "config.json: invalid JSON at line") && strstr(err.msg, reason),
                  "'%s': %s", text, err.msg);
    char want[256];
    snprintf(want, sizeof want, "in field '%s'", field);
    ck_assert_msg(strstr(err.msg, want), "'%s': message does not name %s: %s", text, want, err.msg);
}

START_TEST(test_number_out_of_range_names_field)
{
    expect_number_field("{\"model_type\": \"qwen3_next\",\n  \"hidden_size\": 9999999999999999999999,\n"
                        "  \"vocab_size\": 300}", "too big integer", "hidden_size");
    expect_number_field("{\"a\": {\"b\\\"c\": [1, {\"x\": 2}], \"rope_parameters\": {\"rope_theta\": "
                        "-99999999999999999999999}}}", "too big negative integer",
                        "a.rope_parameters.rope_theta");
    expect_number_field("{\"eos_token_id\": [1, 2, 18446744073709551616]}", "too big integer",
                        "eos_token_id[2]");
    expect_number_field("{\"s\": \"[{,:\\\"\", \"rms_norm_eps\": 1e999}", "real number overflow",
                        "rms_norm_eps");
    expect_number_field("[0, [1, 99999999999999999999]]", "too big integer", "[1][1]");
    /* Other errors keep jansson's reason alone. */
    json_t *j = NULL;
    ls_error err;
    ck_assert_int_eq(ls_json_load_buf("x", "{\"a\": tru}", 11, &j, &err), LS_E_INPUT);
    ck_assert_ptr_null(strstr(err.msg, "in field"));
}
END_TEST

START_TEST(test_load_file)
{
    char *dir = ls_test_tmpdir("json");
    char path[4200];
    snprintf(path, sizeof path, "%s/c.json", dir);
    json_t *j = NULL;
    ls_error err;
    ck_assert_int_eq(ls_json_load_file(path, &j, &err), LS_E_IO);
    ls_test_write(path, "{\"k\": [1,2]}", 12);
    ck_assert_int_eq(ls_json_load_file(path, &j, &err), LS_OK);
    ck_assert_int_eq(json_array_size(json_object_get(j, "k")), 2);
    json_decref(j);
    ls_test_write(path, "{\"k\": [1,2}", 11);
    ck_assert_int_eq(ls_json_load_file(path, &j, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "c.json: invalid JSON at line 1"));
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("json");
    tcase_add_test(tc, test_canonical_form);
    tcase_add_test(tc, test_load_errors);
    tcase_add_test(tc, test_load_file);
    tcase_add_test(tc, test_number_out_of_range_names_field);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
