/* lockstep — provider registry tables. CPU rows follow docs/numerics.md; the
 * CUDA rows are added by the CUDA backend. */
#include "backend/providers.h"

#include <string.h>

#define CPU(op, kernel, tile, acc, order) \
    {op, "cpu-reference", kernel, tile, "none", acc, order, "portable", "strict"}

/* Strict CPU reference (docs/numerics.md §2-§6). */
static const ls_provider cpu_rows[] = {
    CPU("linear", "ls_cpu_linear", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("rmsnorm", "ls_cpu_rmsnorm", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("gated_rmsnorm", "ls_cpu_gated_rmsnorm", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("conv_silu", "ls_cpu_conv_silu", "-", "fp32", "sequential-taps"),
    CPU("gdn_gates", "ls_cpu_gdn_gates", "-", "fp32", "elementwise"),
    CPU("l2norm", "ls_cpu_l2norm", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("gdn_recurrent", "ls_cpu_gdn_recurrent", "1x32", "fp32", "gdn-recurrent-dot32"),
    CPU("rope", "ls_cpu_rope", "-", "fp32", "elementwise"),
    CPU("attention", "ls_cpu_attention", "1x32", "fp32", "online-softmax-block32"),
    CPU("router_softmax", "ls_cpu_router_softmax", "1x32", "fp32", "dot32-max-exp-sum32"),
    CPU("topk", "ls_cpu_topk", "-", "fp32", "sequential-topk-order"),
    CPU("renormalise", "ls_cpu_renormalise", "-", "fp32", "sequential-topk-order"),
    CPU("experts", "ls_cpu_experts", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("combine", "ls_cpu_combine", "-", "fp32", "sequential-topk-order"),
    CPU("shared_expert", "ls_cpu_shared_expert", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("lm_head", "ls_cpu_lm_head", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("logprobs", "ls_cpu_logprobs", "1x32", "fp32", "max-exp-sum32-log"),
    CPU("sampling", "ls_cpu_sampling", "-", "fp32", "greedy-lower-id-or-counter-rng"),
    CPU("digest", "ls_cpu_digest", "-", "none", "sha256-row-major"),
};

typedef struct backend_table {
    const char *name;
    const ls_provider *rows;
    size_t count;
} backend_table;

static const backend_table tables[] = {
    {"cpu", cpu_rows, sizeof cpu_rows / sizeof cpu_rows[0]},
    {"cuda", cpu_rows, 0}, /* rows registered by the CUDA backend; none yet */
};

const char *const ls_backend_names[] = {"cpu", "cuda", NULL};

const ls_provider *ls_backend_list_providers(const char *backend, size_t *count)
{
    *count = 0;
    if (!backend) return NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i].name, backend) == 0) {
            *count = tables[i].count;
            return tables[i].rows;
        }
    return NULL;
}

const ls_provider *ls_backend_find_provider(const char *backend, const char *op)
{
    size_t n;
    const ls_provider *rows = ls_backend_list_providers(backend, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].op, op) == 0) return &rows[i];
    return NULL;
}
