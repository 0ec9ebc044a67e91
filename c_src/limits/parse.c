/* Strict limit parser; no libc number parsing (strtoul accepts signs, spaces, octal, hex). */
#include <stddef.h>

#include "limits/parse.h"

static int unit_shift(char c)
{
    switch (c | 0x20) { /* ASCII lower-case; only letters reach here */
    case 'k': return 10;
    case 'm': return 20;
    case 'g': return 30;
    case 't': return 40;
    default: return -1;
    }
}

static int is_letter(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* the leading decimal number; *end after it. -1 (and *why) when empty, not a digit or > 2^64-1 */
static int parse_number(const char *s, uint64_t *out, const char **end, const char **why)
{
    uint64_t v = 0;
    const char *p = s;

    if (!s || !*s) {
        *why = "empty value";
        return -1;
    }
    if (*p < '0' || *p > '9') {
        *why = "must start with a decimal number";
        return -1;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) {
            *why = "number too large";
            return -1;
        }
        v = v * 10 + d;
    }
    *out = v;
    *end = p;
    return 0;
}

__attribute__((visibility("hidden"))) int vgpu_sm_parse(const char *s, uint64_t *pct, const char **why)
{
    uint64_t v;
    const char *p;

    if (parse_number(s, &v, &p, why) != 0)
        return -1;
    if (*p) {
        *why = "expected a whole percent in decimal digits (no sign, space or %)";
        return -1;
    }
    *pct = v;
    return 0;
}

__attribute__((visibility("hidden"))) int vgpu_limit_parse(const char *s, uint64_t *bytes, const char **why)
{
    uint64_t v = 0;
    const char *p = s;
    int shift = 0;

    if (parse_number(s, &v, &p, why) != 0)
        return -1;
    if (is_letter(*p) && unit_shift(*p) >= 0)
        shift = unit_shift(*p++);
    if (*p == 'i' || *p == 'I')
        p++;
    if (*p == 'b' || *p == 'B')
        p++;
    if (*p) {
        *why = "expected <number>[k|m|g|t][i][b]";
        return -1;
    }
    if (shift && v > (UINT64_MAX >> shift)) {
        *why = "number too large";
        return -1;
    }
    *bytes = v << shift;
    return 0;
}
