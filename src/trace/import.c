/* lockstep — import entry points: format names and dispatch (trace/import.h). */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/checkpoint.h"
#include "trace/import_internal.h"

static const char *const format_names[LS_IMPORT_FORMAT_COUNT] = {"jsonl", "vllm", "vllm-offline", "sglang", "verl"};

const char *ls_import_format_name(ls_import_format f)
{
    return (unsigned)f < LS_IMPORT_FORMAT_COUNT ? format_names[f] : "?";
}

int ls_import_format_parse(const char *name)
{
    for (int i = 0; i < LS_IMPORT_FORMAT_COUNT; i++)
        if (!strcmp(name, format_names[i])) return i;
    return -1;
}

static ls_status import_text(ls_import_format fmt, const char *label, const char *data, size_t len,
                             const ls_import_opts *o, const char *out_path, ls_import_summary *sum, ls_error *err)
{
    ls_imp_text t = {data, len};
    switch (fmt) {
    case LS_IMPORT_VLLM: return ls_imp_run(fmt, label, ls_imp_walk_vllm, &t, o, out_path, sum, err);
    case LS_IMPORT_VLLM_OFFLINE: return ls_imp_run(fmt, label, ls_imp_walk_vllm_offline, &t, o, out_path, sum, err);
    case LS_IMPORT_SGLANG: return ls_imp_run(fmt, label, ls_imp_walk_sglang, &t, o, out_path, sum, err);
    case LS_IMPORT_JSONL: {
        uint64_t n = 0;
        LS_TRY(ls_import_jsonl(label, data, len, o, out_path, &n, err));
        if (sum) {
            memset(sum, 0, sizeof *sum);
            sum->records = n;
            sum->topk = o->topk ? o->topk : 5;
        }
        return LS_OK;
    }
    default: return ls_fail(err, LS_E_USAGE, "import: unknown format %d", (int)fmt);
    }
}

ls_status ls_import_mem(ls_import_format fmt, const char *label, const void *data, size_t len,
                        const ls_import_opts *o, const char *out_path, ls_import_summary *sum, ls_error *err)
{
    if (fmt != LS_IMPORT_VERL) return import_text(fmt, label, data, len, o, out_path, sum, err);
    ls_safetensors *st;
    LS_TRY(ls_safetensors_open_mem(label, data, len, &st, err));
    ls_status s = ls_import_verl_st(st, label, o, out_path, sum, err);
    ls_safetensors_close(st);
    return s;
}

ls_status ls_import_file(ls_import_format fmt, const char *in_path, const ls_import_opts *o,
                         const char *out_path, ls_import_summary *sum, ls_error *err)
{
    if (fmt == LS_IMPORT_VERL) {
        ls_safetensors *st;
        LS_TRY(ls_safetensors_open(in_path, &st, err));
        ls_status s = ls_import_verl_st(st, in_path, o, out_path, sum, err);
        ls_safetensors_close(st);
        return s;
    }
    char *data;
    size_t len;
    LS_TRY(ls_read_file(in_path, &data, &len, err));
    ls_status s = import_text(fmt, in_path, data, len, o, out_path, sum, err);
    free(data);
    return s;
}
