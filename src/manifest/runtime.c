/* lockstep — live-system description for manifests. */
#include "manifest/runtime.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* CPU features whose presence can select a different code path; recorded in
 * this order when present. */
static const char *const cpu_flags_tracked[] = {
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "sha_ni",
    /* aarch64 */
    "asimd", "fphp", "asimdhp", "sve", "sve2", "bf16", "sha2", NULL};

static void read_cpuinfo(char *model, size_t model_len, json_t *flags)
{
    snprintf(model, model_len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    int have_model = 0, have_flags = 0;
    while (fgets(line, sizeof line, f) && !(have_model && have_flags)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *val = colon + 1;
        while (*val == ' ' || *val == '\t') val++;
        val[strcspn(val, "\n")] = '\0';
        if (!have_model && (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0)) {
            snprintf(model, model_len, "%s", val);
            have_model = 1;
        } else if (!have_flags && (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) {
            for (size_t i = 0; cpu_flags_tracked[i]; i++) {
                size_t n = strlen(cpu_flags_tracked[i]);
                for (const char *p = val; (p = strstr(p, cpu_flags_tracked[i])) != NULL; p += n) {
                    int start_ok = p == val || p[-1] == ' ';
                    int end_ok = p[n] == '\0' || p[n] == ' ';
                    if (start_ok && end_ok) {
                        json_array_append_new(flags, json_string(cpu_flags_tracked[i]));
                        break;
                    }
                }
            }
            have_flags = 1;
        }
    }
    fclose(f);
}

/* The NVIDIA kernel driver's release ("580.159.04"), from the first line of
 * /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
 * 580.159.04  <date>"); "" where that file is absent or says something else.
 * cudaDriverGetVersion only gives the CUDA API level the driver supports. */
static void kernel_driver_release(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f) return;
    char line[512];
    if (fgets(line, sizeof line, f)) {
        const char *key = "Kernel Module";
        char *p = strstr(line, key);
        if (p) {
            p += strlen(key);
            while (*p == ' ' || *p == '\t') p++;
            size_t n = strspn(p, "0123456789.");
            if (n > 0 && n < cap) {
                memcpy(out, p, n);
                out[n] = '\0';
            }
        }
    }
    fclose(f);
}

static json_t *gpu_json(const ls_gpu_info *g)
{
    char cc[16], release[64];
    snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
    kernel_driver_release(release, sizeof release);
    return json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:I, s:i, s:s, s:i, s:i, s:i}", "name", g->name,
                     "uuid", g->uuid, "device_index", g->device_index, "device_count",
                     g->device_count, "sm_count", g->sm_count,
                     "compute_capability", cc, "memory_bytes", (json_int_t)g->memory_bytes,
                     "driver_version", g->driver_version, "kernel_driver", release,
                     "cuda_runtime_version", g->runtime_version, "cublas_version",
                     g->cublas_version, "nccl_version", g->nccl_version);
}

ls_status ls_runtime_describe(const ls_gpu_info *gpu_info, void **out_json, ls_error *err)
{
    *out_json = NULL;
    struct utsname u;
    if (uname(&u) != 0) memset(&u, 0, sizeof u);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);

    char model[256];
    json_t *flags = json_array();
    if (!flags) return ls_fail(err, LS_E_NOMEM, "runtime: out of memory");
    read_cpuinfo(model, sizeof model, flags);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    json_t *gpu = gpu_info ? gpu_json(gpu_info) : json_null();
    json_t *rt = json_pack("{s:{s:s, s:s, s:s, s:s}, s:s, s:s, s:{s:s, s:I, s:o}, s:o}", "os",
                           "sysname", u.sysname, "release", u.release, "version", u.version,
                           "machine", u.machine, "host_name", host, "pinned_at", when, "cpu",
                           "model", model, "logical_cores", (json_int_t)cores, "flags", flags,
                           "gpu", gpu);
    if (!rt) return ls_fail(err, LS_E_NOMEM, "runtime: could not build the JSON object");
    *out_json = rt;
    return LS_OK;
}
