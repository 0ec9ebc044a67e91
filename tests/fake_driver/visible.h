/* CUDA_VISIBLE_DEVICES as the real driver reads it, for both fakes (fake_cuda.c picks its devices by it,
 * fake_nvml.c, which like the real NVML sees every device, only to know which of its devices a CUDA
 * ordinal is): a comma-separated list of physical indices, full UUIDs (GPU-...) or unique UUID prefixes;
 * the list ends at the first entry that names no device, names one twice or is ambiguous. Used only when
 * FAKE_CUDA_ORDER is unset. */
#ifndef FAKE_VISIBLE_H
#define FAKE_VISIBLE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the UUID of physical device p, as both fakes give it */
static void fake_uuid_string(unsigned p, char *out, size_t len)
{
    static const unsigned char tmpl[16] = {0xfa, 0x4e, 0x00, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
    unsigned char b[16];
    memcpy(b, tmpl, sizeof b);
    b[3] = b[15] = (unsigned char)p;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* physical device of one entry (len bytes at s), -1 when it names none or several */
static int fake_visible_entry(const char *s, size_t len, int nphys)
{
    char e[96], u[96];
    size_t i;
    int found = -1;
    while (len && *s == ' ')
        s++, len--;
    while (len && s[len - 1] == ' ')
        len--;
    if (!len || len >= sizeof e)
        return -1;
    memcpy(e, s, len);
    e[len] = 0;
    for (i = 0; i < len && e[i] >= '0' && e[i] <= '9'; i++)
        ;
    if (i == len)
        return atoi(e) < nphys && len < 4 ? atoi(e) : -1;
    if (strncmp(e, "GPU-", 4) != 0)
        return -1;
    for (int p = 0; p < nphys; p++) {
        fake_uuid_string((unsigned)p, u, sizeof u);
        if (strncmp(u, e, len) == 0) {
            if (found >= 0)
                return -1; /* a prefix of two devices */
            found = p;
        }
    }
    return found;
}

/* the ordinal -> physical map of CUDA_VISIBLE_DEVICES in order[] (at most max), its length; -1 when unset */
static int fake_visible_order(int nphys, int *order, int max)
{
    const char *s = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (!s)
        return -1;
    while (*s && n < max) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        int p = fake_visible_entry(s, len, nphys), dup = 0;
        for (int i = 0; i < n; i++)
            dup |= order[i] == p;
        if (p < 0 || dup)
            break;
        order[n++] = p;
        if (!comma)
            break;
        s = comma + 1;
    }
    return n;
}
#endif
