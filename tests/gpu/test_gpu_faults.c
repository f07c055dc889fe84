/* GPU faults fail closed and leave the card as they found it:
 *  - a model larger than the card (Qwen3-Next-80B-A3B's shapes, all 48
 *    layers, ~150 GB of synthetic weights) fails engine creation with
 *    LS_E_NOMEM and a message saying out of GPU memory, the bytes asked and
 *    the arena's and the device's bytes; after it the device's free memory
 *    (cudaMemGetInfo, the driver's count) is what it was before;
 *  - a device index the machine does not have (count, count + 98, -1) is
 *    refused with LS_E_USAGE naming the devices it has, allocating nothing,
 *    by the backend, the run layer and `lockstep run --backend cuda --gpu N`
 *    (exit 2, one line, no trace);
 *  - a run on the last device (--gpu count-1) gives the trace a run on
 *    device 0 gives, and the manifest records the device it ran on.
 *
 * LS_GPU_QUICK=1 (the sanitizer runs) keeps the out-of-memory path but on a
 * 1 GiB arena with the 80B model's first 2 layers (~6 GB), so the sanitized
 * fill covers a gigabyte, not the card. Under a sanitizer
 * (LS_GPU_SANITIZER=TOOL, set by harness/gpu_check) the free-memory
 * differences are printed, not asserted: the tool allocates device memory
 * of its own (initcheck keeps one shadow bit per byte of every allocation:
 * 128 MiB for the 1 GiB arena, measured on the H200), so the driver's count
 * says nothing about lockstep there; the unsanitized run (ctest -L gpu)
 * asserts it. */
#include "gpu_testutil.h"

#include <stdint.h>

#include "backend/backend_cuda.h"
#include "compare/compare.h"
#include "engine/engine.h"
#include "model/model.h"
#include "run/run.h"
#include "synth_models.h"
#include "testutil.h"

#ifdef LOCKSTEP_HAVE_CUDA

/* The free memory a failed run may leave behind on the device: none of the
 * arena (a leak would be gigabytes). The measurement before is taken after a
 * warm-up engine on the same device, so the CUDA context and every kernel
 * module the creation path loads lazily already exist then; what remains is
 * the driver's accounting granularity (2 MiB pages for large allocations),
 * with room for a few such pages. */
#define LS_FAULTS_FREE_TOLERANCE_BYTES ((size_t)16 << 20)

static int g_quick;

/* Engine on a synthetic model, the CUDA backend generating its weights on
 * `device` in an arena of arena_bytes (0: 90 % of the free memory). */
static ls_status open_synthetic(const ls_model *m, int device, size_t arena_bytes, ls_engine **e,
                                ls_error *err)
{
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.device = device;
    co.arena_bytes = arena_bytes;
    co.synthetic_weights_seed = 0x1234567;
    ls_backend *be = NULL;
    LS_TRY(ls_backend_cuda_create_opts(&co, &be, err));
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    return ls_engine_create(m, be, &o, 1, 64, e, err); /* owns be, success or not */
}

static size_t free_bytes(int device)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_cuda_use_device(device, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_cuda_sync(&err) == LS_OK, "%s", err.msg);
    size_t f, t;
    ck_assert_msg(ls_cuda_mem_info(&f, &t, &err) == LS_OK, "%s", err.msg);
    return f;
}

static void expect_free_back(const char *what, int device, size_t before)
{
    size_t after = free_bytes(device);
    size_t diff = after > before ? after - before : before - after;
    printf("  %s: device %d free %zu bytes before, %zu after (|diff| %zu, tolerance %zu)\n", what,
           device, before, after, diff, LS_FAULTS_FREE_TOLERANCE_BYTES);
    fflush(stdout);
    const char *tool = getenv("LS_GPU_SANITIZER");
    if (tool && *tool) {
        printf("  %s: not asserted under %s (the tool's own device memory)\n", what, tool);
        return;
    }
    ck_assert_msg(diff <= LS_FAULTS_FREE_TOLERANCE_BYTES,
                  "%s: device %d free memory %zu bytes before, %zu after: the failed run left %zu "
                  "bytes allocated", what, device, before, after, before - after);
}

START_TEST(test_model_larger_than_the_card)
{
    ls_error err;
    ls_error_clear(&err);
    /* warm-up: context and lazily loaded modules of the creation path */
    ls_model_config tiny;
    ls_test_preset_config("tiny", 0, 0, &tiny);
    ls_model *mt;
    ck_assert_msg(ls_model_synthetic(&tiny, 3, &mt, &err) == LS_OK, "%s", err.msg);
    ls_engine *e = NULL;
    ck_assert_msg(open_synthetic(mt, 0, (size_t)256 << 20, &e, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    ls_model_close(mt);

    size_t before = free_bytes(0);
    ls_model_config big;
    ls_test_preset_config("qwen3-next-80b-a3b", g_quick ? 2 : 0, 0, &big);
    ls_model *m;
    ck_assert_msg(ls_model_synthetic(&big, 1, &m, &err) == LS_OK, "%s", err.msg);
    size_t arena = g_quick ? (size_t)1 << 30 : 0;
    e = NULL;
    ls_status st = open_synthetic(m, 0, arena, &e, &err);
    printf("  %s layers of qwen3-next-80b-a3b, arena %s: %s\n", g_quick ? "2" : "all 48",
           g_quick ? "1 GiB" : "90 % of the free memory", err.msg);
    ck_assert_msg(st == LS_E_NOMEM, "status %s, expected nomem (%s)", ls_status_name(st), err.msg);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err.msg, "out of GPU memory: ") && strstr(err.msg, " bytes asked") &&
                      strstr(err.msg, "the run's arena has ") && strstr(err.msg, "CUDA device 0"),
                  "message lacks out of GPU memory / bytes asked / arena and device: %s", err.msg);
    ls_model_close(m);
    expect_free_back("after the failed engine creation", 0, before);

    /* an arena larger than the card fails at once, with the device's bytes */
    size_t f, t;
    ck_assert_msg(ls_cuda_mem_info(&f, &t, &err) == LS_OK, "%s", err.msg);
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = t + ((size_t)1 << 30);
    ls_backend *be = NULL;
    st = ls_backend_cuda_create_opts(&co, &be, &err);
    ck_assert_msg(st == LS_E_NOMEM && !be, "status %s (%s)", ls_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, "out of GPU memory: the run's arena of ") &&
                      strstr(err.msg, "does not fit on CUDA device 0"), "%s", err.msg);
    printf("  arena larger than the card: %s\n", err.msg);
    expect_free_back("after the arena that did not fit", 0, before);
}
END_TEST

/* ls_backend_cuda_arena_usage: the arena's high-water mark, within its
 * capacity, covering the weights once the engine exists and growing (never
 * shrinking) with a step's scratch; harness/long_context reports it. */
START_TEST(test_arena_usage)
{
    ls_model_config cfg;
    ls_test_preset_config("small", 0, 0, &cfg);
    ls_model *m = NULL;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_model_synthetic(&cfg, 1, &m, &err) == LS_OK, "%s", err.msg);
    size_t arena = (size_t)512 << 20;
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = arena;
    co.synthetic_weights_seed = 0x1234567;
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cuda_create_opts(&co, &be, &err) == LS_OK, "%s", err.msg);
    size_t used0, cap;
    ls_backend_cuda_arena_usage(be, &used0, &cap);
    ck_assert_msg(cap == arena && used0 <= cap, "fresh backend: %zu of %zu bytes, arena %zu", used0, cap, arena);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    ls_engine *e = NULL;
    ck_assert_msg(ls_engine_create(m, be, &o, 1, 64, &e, &err) == LS_OK, "%s", err.msg);
    size_t used1;
    ls_backend_cuda_arena_usage(be, &used1, &cap);
    /* the expert matrices alone: layers x experts x 3 x I x D bf16 */
    size_t experts = (size_t)cfg.n_layers * (size_t)cfg.n_experts * 3 * (size_t)cfg.moe_inter * (size_t)cfg.hidden * 2;
    ck_assert_msg(used1 >= used0 + experts && used1 <= cap, "after the engine: %zu bytes used (before %zu, expert "
                  "weights %zu, arena %zu)", used1, used0, experts, cap);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = i + 1;
    ck_assert_msg(ls_engine_join(e, 0, 1, 16, &err) == LS_OK, "%s", err.msg);
    ls_engine_item it = {0, tok, 16, 1, 0};
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    size_t used2;
    ls_backend_cuda_arena_usage(be, &used2, &cap);
    ck_assert_msg(used2 >= used1 && used2 <= cap, "after a step: %zu bytes used (before %zu, arena %zu)", used2,
                  used1, cap);
    printf("  arena of %zu bytes: %zu used fresh, %zu with the engine, %zu after a step of 16 rows\n", cap, used0,
           used1, used2);
    ls_engine_destroy(e);
    ls_model_close(m);
}
END_TEST

START_TEST(test_device_that_does_not_exist)
{
    ls_error err;
    ls_error_clear(&err);
    int count = ls_cuda_device_count();
    size_t before = free_bytes(0);
    const int bad[] = {count, count + 98, -1};
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "no CUDA device %d: this machine has %d (0: ", bad[i], count);
        ls_backend_cuda_opts co;
        ls_backend_cuda_opts_default(&co);
        co.device = bad[i];
        ls_backend *be = NULL;
        ls_status st = ls_backend_cuda_create_opts(&co, &be, &err);
        ck_assert_msg(st == LS_E_USAGE && !be && strstr(err.msg, want), "device %d: status %s: %s",
                      bad[i], ls_status_name(st), err.msg);
        printf("  backend, device %d: %s\n", bad[i], err.msg);
        st = ls_run_backend_create("cuda", 1, bad[i], &be, &err);
        ck_assert_msg(st == LS_E_USAGE && !be && strstr(err.msg, want), "run layer, device %d: %s",
                      bad[i], err.msg);
        ck_assert_msg(!strchr(err.msg, '\n'), "not one line: %s", err.msg);
    }
    expect_free_back("after refusing devices that do not exist", 0, before);
}
END_TEST

/* `lockstep run` / `gate` on the synth tiny checkpoint in a scratch dir. */
static char *g_dir;

static void cli_setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("gpu-faults");
    char *o = NULL;
    int rc = ls_test_cli(&o, "synth --preset tiny --seed 7 --out %s/ck", g_dir);
    ck_assert_msg(rc == 0, "synth: %s", o ? o : "");
    free(o);
    ls_test_write_text(g_dir, "p.jsonl", "{\"id\": 0, \"tokens\": [1, 2, 3, 4]}\n"
                                         "{\"id\": 5, \"tokens\": [9, 8]}\n");
}

START_TEST(test_cli_gpu_that_does_not_exist)
{
    cli_setup();
    int count = ls_cuda_device_count();
    char want[64], trace[4200];
    snprintf(want, sizeof want, "no CUDA device 99: this machine has %d (0: ", count);
    snprintf(trace, sizeof trace, "%s/x.trace", g_dir);
    char *o = NULL;
    int rc = ls_test_cli(&o, "run --checkpoint %s/ck --mode rollout --prompts %s/p.jsonl -o %s "
                         "--backend cuda --gpu 99", g_dir, g_dir, trace);
    int lines = 0;
    for (const char *c = o; c && *c; c++) lines += *c == '\n';
    printf("  lockstep run --backend cuda --gpu 99: exit %d: %s", rc, o ? o : "");
    ck_assert_msg(rc == 2 && lines == 1 && strstr(o, want), "exit %d, %d lines:\n%s", rc, lines, o);
    free(o);
    FILE *f = fopen(trace, "rb");
    ck_assert_msg(!f, "a failed run left %s", trace);
    rc = ls_test_cli(&o, "manifest pin --checkpoint %s/ck --backend cuda --gpu 99 -o -", g_dir);
    ck_assert_msg(rc == 2 && strstr(o, want), "manifest pin --gpu 99: exit %d:\n%s", rc, o);
    free(o);
}
END_TEST

START_TEST(test_run_on_the_last_device)
{
    cli_setup();
    int last = ls_cuda_device_count() - 1;
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/dev0.trace", g_dir);
    snprintf(b, sizeof b, "%s/devlast.trace", g_dir);
    char *o = NULL;
    int rc = ls_test_cli(&o, "run --checkpoint %s/ck --mode rollout --prompts %s/p.jsonl "
                         "--max-new-tokens 4 -o %s --backend cuda", g_dir, g_dir, a);
    ck_assert_msg(rc == 0, "run on device 0: %s", o);
    free(o);
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --mode rollout --prompts %s/p.jsonl "
                     "--max-new-tokens 4 -o %s --backend cuda --gpu %d", g_dir, g_dir, b, last);
    ck_assert_msg(rc == 0, "run on device %d: %s", last, o);
    free(o);
    ls_error err;
    ls_error_clear(&err);
    ls_compare_result c;
    ck_assert_msg(ls_compare_files(a, b, NULL, &c, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(c.equal, "device 0 and device %d traces differ", last);
    ls_compare_result_free(&c);
    printf("  rollout on device %d equals the one on device 0\n", last);
    /* the manifest names the chosen device */
    ls_manifest_opts mo = ls_manifest_opts_default();
    ls_run_facts facts;
    ls_gpu_info want;
    ck_assert_msg(ls_run_manifest_facts("cuda", last, &mo, &facts, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_cuda_query_device(last, &want, &err) == LS_OK, "%s", err.msg);
    const ls_gpu_info *info = &facts.gpu;
    ck_assert_msg(mo.gpu == info && info->device_index == last && !strcmp(info->uuid, want.uuid),
                  "manifest gpu: device_index %d uuid %s, expected %d %s", info->device_index, info->uuid,
                  last, want.uuid);
    rc = ls_test_cli(&o, "manifest pin --checkpoint %s/ck --backend cuda --gpu %d -o -", g_dir, last);
    char key[64];
    snprintf(key, sizeof key, "\"device_index\": %d", last);
    ck_assert_msg(rc == 0 && strstr(o, key) && strstr(o, want.uuid), "manifest pin --gpu %d:\n%s",
                  last, o);
    free(o);
}
END_TEST

#endif

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
#ifdef LOCKSTEP_HAVE_CUDA
    g_quick = getenv("LS_GPU_QUICK") != NULL;
    Suite *s = suite_create("gpu_faults");
    TCase *tc = tcase_create("gpu_faults");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_model_larger_than_the_card);
    tcase_add_test(tc, test_arena_usage);
    tcase_add_test(tc, test_device_that_does_not_exist);
    tcase_add_test(tc, test_cli_gpu_that_does_not_exist);
    tcase_add_test(tc, test_run_on_the_last_device);
    suite_add_tcase(s, tc);
    int rc = ls_gpu_run_suite(s);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return rc;
#endif
}
