/* lockstep synth — write a synthetic Qwen3-Next or Qwen3.5 MoE checkpoint
 * (docs/synth.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "synth/synth.h"

static const char usage_text[] =
    "usage: lockstep synth (--preset NAME | --config FILE) --seed N --out DIR\n"
    "                      [--layers N] [--expert-layout L] [--fp8] [--config-only]\n"
    "                      [--max-shard-bytes B] [--force]\n"
    "\n"
    "Writes a Hugging Face Qwen3-Next (Qwen3NextForCausalLM) or Qwen3.5 MoE\n"
    "(Qwen3_5MoeForConditionalGeneration, text part) bf16 checkpoint with\n"
    "deterministic random weights: config.json plus model.safetensors, or shards\n"
    "model-0000i-of-0000n.safetensors and model.safetensors.index.json when the\n"
    "tensors exceed --max-shard-bytes. The same seed gives the same bytes on every\n"
    "machine. Weights are scaled so logits have a realistic spread (top-1\n"
    "log-probability around -1 on random tokens); see docs/synth.md.\n"
    "\n"
    "  --preset NAME        tiny (hidden 128, 4 layers, 8 experts, vocab 1000),\n"
    "                       small (hidden 512, 8 layers, 32 experts, vocab 8250),\n"
    "                       qwen3-next-80b-a3b (the released 80B config; ~160 GB\n"
    "                       in full, use --layers or --config-only),\n"
    "                       qwen3.5-tiny, qwen3.5-small (the same shapes as\n"
    "                       Qwen3.5 MoE), qwen3.5-35b-a3b, qwen3.5-122b-a10b,\n"
    "                       qwen3.5-397b-a17b (the release shapes; use --layers)\n"
    "  --config FILE        a config.json (model_type qwen3_next, qwen3_5_moe or\n"
    "                       qwen3_5_moe_text) instead of a preset; the fields synth\n"
    "                       uses are validated\n"
    "  --seed N             generator seed (unsigned 64-bit integer)\n"
    "  --out DIR, -o DIR    output directory; written as DIR.tmp.<pid> and renamed\n"
    "                       when complete\n"
    "  --layers N           keep only the first N decoder layers (config.json then\n"
    "                       says num_hidden_layers = N); the tensors written are\n"
    "                       identical to those of the full model\n"
    "  --expert-layout L    fused: experts.gate_up_proj [E, 2I, D] and\n"
    "                       experts.down_proj [E, D, I] (the Qwen3.5 BF16 release;\n"
    "                       the Qwen3.5 default); per-expert: experts.E.{gate,up,\n"
    "                       down}_proj.weight (the Qwen3-Next default). Both hold\n"
    "                       the same values\n"
    "  --fp8                the FP8 release layout: attention, GDN in/out and expert\n"
    "                       projections F8_E4M3 with a weight_scale_inv per 128 x 128\n"
    "                       block (the bf16 values of the same seed, quantised),\n"
    "                       experts one by one, and a quantization_config whose\n"
    "                       modules_to_not_convert lists what stays BF16 (lm_head,\n"
    "                       routers, shared expert gates, in_proj_a/b)\n"
    "  --config-only        write config.json alone\n"
    "  --max-shard-bytes B  tensor bytes per safetensors file before sharding\n"
    "                       (default 5000000000; suffixes KB MB GB KiB MiB GiB).\n"
    "                       Memory use is about one shard\n"
    "  --force              replace DIR if it exists and is not empty\n"
    "\n"
    "exit codes: 0 written, 2 could not (bad preset, bad config field, I/O)\n";

static int parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-') return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},           {"KB", 1000ull},    {"MB", 1000000ull},
                 {"GB", 1000000000ull}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20},
                 {"GiB", 1ull << 30}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            if (v > UINT64_MAX / units[i].mult) return -1;
            *out = (uint64_t)v * units[i].mult;
            return 0;
        }
    }
    return -1;
}

int ls_cmd_synth(int argc, char **argv)
{
    enum { OPT_PRESET = LS_CLI_LONG, OPT_CONFIG, OPT_SEED, OPT_LAYERS, OPT_CONFIG_ONLY, OPT_MAX_SHARD, OPT_FORCE,
           OPT_EXPERT_LAYOUT, OPT_FP8 };
    static const ls_cli_opt opts[] = {
        {"preset", OPT_PRESET, 1},
        {"config", OPT_CONFIG, 1},
        {"seed", OPT_SEED, 1},
        {"out", 'o', 1},
        {"layers", OPT_LAYERS, 1},
        {"config-only", OPT_CONFIG_ONLY, 0},
        {"max-shard-bytes", OPT_MAX_SHARD, 1},
        {"force", OPT_FORCE, 0},
        {"expert-layout", OPT_EXPERT_LAYOUT, 1},
        {"fp8", OPT_FP8, 0},
        {NULL, 0, 0},
    };
    const char *preset = NULL, *config = NULL, *out = NULL, *seed_s = NULL, *layers_s = NULL,
               *shard_s = NULL, *layout_s = NULL;
    ls_synth_options opt = ls_synth_options_default();
    int fp8 = 0;
    ls_error err;
    ls_error_clear(&err);

    ls_cli_args a = {.cmd = "synth", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_CONFIG_ONLY: opt.config_only = 1; break;
        case OPT_FORCE: opt.force = 1; break;
        case OPT_FP8: fp8 = 1; break;
        case OPT_PRESET: preset = a.arg; break;
        case OPT_CONFIG: config = a.arg; break;
        case OPT_SEED: seed_s = a.arg; break;
        case 'o': out = a.arg; break;
        case OPT_LAYERS: layers_s = a.arg; break;
        case OPT_MAX_SHARD: shard_s = a.arg; break;
        case OPT_EXPERT_LAYOUT: layout_s = a.arg; break;
        case LS_CLI_OPERAND: return ls_cli_usage_error("synth", "unexpected argument '%s'", a.arg);
        }
    }
    if (shard_s && (parse_u64(shard_s, &opt.max_shard_bytes) != 0 || opt.max_shard_bytes == 0)) {
        ls_fail(&err, LS_E_USAGE, "--max-shard-bytes '%s': expected a positive byte count", shard_s);
        return ls_cli_report("synth", &err);
    }

    if ((preset != NULL) == (config != NULL)) {
        ls_fail(&err, LS_E_USAGE, "give exactly one of --preset NAME or --config FILE");
        return ls_cli_report("synth", &err);
    }
    if (!out) {
        ls_fail(&err, LS_E_USAGE, "--out DIR is required");
        return ls_cli_report("synth", &err);
    }
    uint64_t seed = 0;
    if (!seed_s) {
        ls_fail(&err, LS_E_USAGE, "--seed N is required");
        return ls_cli_report("synth", &err);
    }
    if (parse_u64(seed_s, &seed) != 0 || strspn(seed_s, "0123456789") != strlen(seed_s)) {
        ls_fail(&err, LS_E_USAGE, "--seed '%s': expected an unsigned 64-bit integer", seed_s);
        return ls_cli_report("synth", &err);
    }

    ls_synth_config cfg;
    ls_status st = preset ? ls_synth_preset(preset, &cfg, &err)
                          : ls_synth_config_load(config, &cfg, &err);
    if (st != LS_OK) return ls_cli_report("synth", &err);
    if (layers_s) {
        uint64_t n = 0;
        if (parse_u64(layers_s, &n) != 0 || strspn(layers_s, "0123456789") != strlen(layers_s) ||
            n > (uint64_t)LS_SYNTH_MAX_LAYERS) {
            ls_fail(&err, LS_E_USAGE, "--layers '%s': expected a layer count", layers_s);
            return ls_cli_report("synth", &err);
        }
        if (ls_synth_config_truncate(&cfg, (int64_t)n, &err) != LS_OK)
            return ls_cli_report("synth", &err);
    }
    if (layout_s) {
        if (strcmp(layout_s, "fused") != 0 && strcmp(layout_s, "per-expert") != 0) {
            ls_fail(&err, LS_E_USAGE, "--expert-layout '%s': expected fused or per-expert", layout_s);
            return ls_cli_report("synth", &err);
        }
        cfg.fused_experts = strcmp(layout_s, "fused") == 0;
    }
    if (fp8) {
        if (layout_s && cfg.fused_experts) {
            ls_fail(&err, LS_E_USAGE, "--fp8 stores experts one by one (as the FP8 releases do); "
                    "--expert-layout fused does not apply");
            return ls_cli_report("synth", &err);
        }
        cfg.fp8 = 1;
        cfg.fused_experts = 0;
    }
    if (ls_synth_write(&cfg, seed, out, &opt, &err) != LS_OK) return ls_cli_report("synth", &err);
    ls_log_info("synth: wrote %s (%lld layers, seed %llu%s%s)", out,
                (long long)cfg.num_hidden_layers, (unsigned long long)seed, fp8 ? ", FP8" : "",
                opt.config_only ? ", config only" : "");
    return 0;
}
