/*
 * uid.c - colld-softroce-uid: print a new unique id from the daemon at SOCKET as hex (the form
 * colld-test-coll's --uid takes), for the Soft-RoCE guests (softroce.sh), which have no harness;
 * then stay connected HOLD seconds (a unique id is valid while the session that asked for it is).
 */
#include "proto/wire.h"

#include <colld/colld.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    colld_client_t *c = NULL;
    colld_unique_id_t id;
    colld_status_t s = colld_connect(argc > 1 ? argv[1] : NULL, &c);
    if (s == COLLD_OK)
        s = colld_get_unique_id(c, &id);
    if (s != COLLD_OK) {
        fprintf(stderr, "colld-softroce-uid: %s\n", colld_status_name(s));
        return 1;
    }
    for (int i = 0; i < COLLD_WIRE_UNIQUE_ID_BYTES; i++)
        printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
    fflush(stdout);
    if (argc > 2)
        sleep((unsigned)atoi(argv[2]));
    colld_disconnect(c);
    return 0;
}
