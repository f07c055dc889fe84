/* lockstep CLI — option parsing shared by every subcommand; see opts.h. */
#include "cli/opts.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int ls_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    ls_error err;
    ls_error_clear(&err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    err.status = LS_E_USAGE;
    return ls_cli_report(cmd, &err);
}

static int stop(ls_cli_args *a, int exit_code)
{
    a->exit_code = exit_code;
    a->state_ = 3;
    return LS_CLI_EXIT;
}

/* Builds getopt's optstring and option table from a->opts. The optstring
 * starts with '-' (operands come back in order as option 1, even under
 * POSIXLY_CORRECT) or '+' (stop at the first operand), then ':' so a missing
 * value is told apart from an unknown option. */
static int setup(ls_cli_args *a)
{
    size_t n = 0, k = 0;
    a->optstring_[k++] = a->stop_at_operand ? '+' : '-';
    a->optstring_[k++] = ':';
    for (const ls_cli_opt *o = a->opts; o && o->name; o++, n++) {
        if (n == LS_CLI_MAX_OPTS)
            return ls_cli_usage_error(a->cmd, "internal error: more than %d options", LS_CLI_MAX_OPTS);
        a->longopts_[n] = (struct option){o->name, o->takes_value ? required_argument : no_argument, NULL, o->key};
        if (o->key > 0 && o->key < LS_CLI_LONG) {
            a->optstring_[k++] = (char)o->key;
            if (o->takes_value) a->optstring_[k++] = ':';
        }
    }
    if (a->usage) {
        a->longopts_[n++] = (struct option){"help", no_argument, NULL, 'h'};
        a->optstring_[k++] = 'h';
    }
    a->optstring_[k] = '\0';
    a->longopts_[n] = (struct option){NULL, 0, NULL, 0};
    return 0;
}

/* The long option name the user typed in `elem` ("--name" or "--name=v"),
 * without the value, into a->opt_buf_. */
static const char *typed_long(ls_cli_args *a, const char *elem)
{
    size_t len = strcspn(elem, "=");
    snprintf(a->opt_buf_, sizeof a->opt_buf_, "%.*s", (int)len, elem);
    return a->opt_buf_;
}

/* Explains a '?' from getopt_long for the argument elem (unknown option,
 * ambiguous prefix, or a value given to a flag) and stops. */
static int bad_option(ls_cli_args *a, const char *elem)
{
    if (strncmp(elem, "--", 2) != 0) {
        if (optopt > 0 && optopt < LS_CLI_LONG)
            return stop(a, ls_cli_usage_error(a->cmd, "unknown option '-%c'", optopt));
        return stop(a, ls_cli_usage_error(a->cmd, "unknown option '%s'", elem));
    }
    const char *typed = typed_long(a, elem);
    size_t len = strlen(typed) - 2;
    const struct option *first = NULL;
    int distinct = 0;
    char names[200] = "";
    for (const struct option *o = a->longopts_; o->name; o++) {
        if (strncmp(o->name, typed + 2, len) != 0) continue;
        if (strlen(o->name) == len) { /* exact: the only way this fails is a value given to a flag */
            first = o;
            distinct = 1;
            break;
        }
        if (!first || o->val != first->val) distinct++;
        if (!first) first = o;
        size_t l = strlen(names);
        snprintf(names + l, sizeof names - l, "%s--%s", l ? ", " : "", o->name);
    }
    if (!first) return stop(a, ls_cli_usage_error(a->cmd, "unknown option '%s'", typed));
    if (distinct > 1)
        return stop(a, ls_cli_usage_error(a->cmd, "ambiguous option '%s' (%s)", typed, names));
    return stop(a, ls_cli_usage_error(a->cmd, "option '--%s' takes no value", first->name));
}

int ls_cli_next(ls_cli_args *a)
{
    a->arg = NULL;
    a->opt = NULL;
    if (a->state_ == 0) {
        if (setup(a)) return stop(a, 2);
        optind = 0; /* glibc: full reinitialisation, including the ordering mode */
        opterr = 0; /* our own messages, one line each */
        a->state_ = 1;
    }
    if (a->state_ == 2) { /* the operands after "--" */
        if (a->index < a->argc) {
            a->arg = a->argv[a->index++];
            return LS_CLI_OPERAND;
        }
        a->state_ = 3;
    }
    if (a->state_ == 3) return LS_CLI_END;

    int at = optind ? optind : 1; /* the argument getopt looks at next */
    const char *elem = at < a->argc ? a->argv[at] : "";
    int li = -1;
    int c = getopt_long(a->argc, a->argv, a->optstring_, a->longopts_, &li);
    if (c == -1) {
        a->index = optind;
        a->state_ = a->stop_at_operand ? 3 : 2;
        return a->stop_at_operand ? LS_CLI_END : ls_cli_next(a);
    }
    if (c == 1) {
        a->arg = optarg;
        return LS_CLI_OPERAND;
    }
    if (c == ':') {
        const char *name = strncmp(elem, "--", 2) == 0 ? typed_long(a, elem) : NULL;
        if (name) /* getopt names the option a prefix completed to only through optopt here */
            for (const struct option *o = a->longopts_; o->name; o++)
                if (o->val == optopt && strncmp(o->name, name + 2, strlen(name + 2)) == 0) {
                    snprintf(a->opt_buf_, sizeof a->opt_buf_, "--%s", o->name);
                    break;
                }
        if (name) return stop(a, ls_cli_usage_error(a->cmd, "option '%s' needs a value", a->opt_buf_));
        return stop(a, ls_cli_usage_error(a->cmd, "option '-%c' needs a value", optopt));
    }
    if (c == '?') return bad_option(a, elem);
    if (c == 'h' && a->usage) {
        fputs(a->usage, stdout);
        return stop(a, 0);
    }
    if (li >= 0) snprintf(a->opt_buf_, sizeof a->opt_buf_, "--%s", a->longopts_[li].name);
    else snprintf(a->opt_buf_, sizeof a->opt_buf_, "-%c", c);
    a->opt = a->opt_buf_;
    a->arg = optarg;
    return c;
}
