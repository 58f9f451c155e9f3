/*
 * fuzz_metrics_http.c - libFuzzer harness: the metrics endpoint's HTTP request parser
 * (server/observability/metrics.c: colld_metrics_http_header_end, colld_metrics_http_request), fed as the
 * endpoint feeds it: the request arrives in reads of varying size into a buffer of
 * COLLD_METRICS_HTTP_REQUEST_MAX bytes, the end of the headers is looked for from a little before
 * each read (a terminator may straddle two), and a complete request is parsed.
 *
 * Checked: the incremental search finds the same end as a search over everything read; the
 * parser answers only 200, 400, 404, 405 or 505, and 200 only for GET or HEAD of the path it
 * names (/metrics, /healthz, /readyz).
 */
#include "server/observability/metrics.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned chunk = data[0] % 64 + 1; /* bytes per read; 64: one read for short requests */
    data++;
    size--;
    char *buf = calloc(1, COLLD_METRICS_HTTP_REQUEST_MAX); /* heap: ASan sees any read past it */
    if (!buf)
        return 0;
    size_t len = 0, end = 0;
    while (len < size && len < COLLD_METRICS_HTTP_REQUEST_MAX && !end) {
        size_t n = chunk == 64 ? size - len : chunk;
        if (n > size - len)
            n = size - len;
        if (n > COLLD_METRICS_HTTP_REQUEST_MAX - len)
            n = COLLD_METRICS_HTTP_REQUEST_MAX - len;
        memcpy(buf + len, data + len, n);
        size_t from = len > 3 ? len - 3 : 0;
        len += n;
        size_t e = colld_metrics_http_header_end(buf + from, len - from);
        if (e)
            end = from + e;
    }
    if (colld_metrics_http_header_end(buf, len) != end)
        abort(); /* the incremental search disagrees with the whole one */
    if (end) {
        if (end > len)
            abort();
        bool head = false;
        colld_http_route_t route;
        int code = colld_metrics_http_request(buf, end, &route, &head);
        if (code != 200 && code != 400 && code != 404 && code != 405 && code != 505)
            abort();
        static const char *const paths[] = { "/metrics", "/healthz", "/readyz" };
        if (code == 200 && ((unsigned)route > COLLD_HTTP_READYZ ||
                            !memmem(buf, end, paths[route], strlen(paths[route])) ||
                            (head ? !memmem(buf, end, "HEAD ", 5) : !memmem(buf, end, "GET ", 4))))
            abort();
    }
    free(buf);
    return 0;
}
