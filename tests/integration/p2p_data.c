/*
 * p2p_data.c - the send/receive rank programs' messages and checks (p2p_data.h).
 */
#include "tests/integration/p2p_data.h"

#include "tools/testdata/pattern.h"

#include <stdlib.h>
#include <string.h>

void p2p_message(colld_dtype_t dt, int from, int to, unsigned step, int k, size_t count, void *out)
{
    colld_cpu_pattern(dt, from, step * 1009u + (unsigned)to * 31u + (unsigned)k, 0, count, out);
}

unsigned char *p2p_slot(unsigned char *region, size_t at, size_t bytes)
{
    memset(region + at, P2P_SENTINEL, P2P_GUARD);
    memset(region + at + P2P_GUARD + bytes, P2P_SENTINEL, P2P_GUARD);
    return region + at + P2P_GUARD;
}

bool p2p_guards_intact(const unsigned char *buf, size_t bytes)
{
    for (size_t i = 0; i < P2P_GUARD; i++)
        if (buf[-(ptrdiff_t)P2P_GUARD + (ptrdiff_t)i] != P2P_SENTINEL || buf[bytes + i] != P2P_SENTINEL)
            return false;
    return true;
}

int p2p_message_matches(const void *buf, colld_dtype_t dt, int from, int to, unsigned step, int k, size_t count,
                        size_t *first_wrong)
{
    size_t bytes = count * colld_dtype_size(dt);
    unsigned char *want = malloc(bytes ? bytes : 1);
    if (!want)
        return -1;
    p2p_message(dt, from, to, step, k, count, want);
    int ok = memcmp(buf, want, bytes) == 0;
    if (!ok) {
        size_t i = 0;
        while (((const unsigned char *)buf)[i] == want[i])
            i++;
        *first_wrong = i;
    }
    free(want);
    return ok;
}
