/*
 * replay_main.c - runs a fuzz harness over files and folders of inputs, for builds without
 * libFuzzer (gcc, the sanitizer builds): every harness compiles in every build and its checked-in
 * corpus is replayed as a regression test. libFuzzer builds link its own main instead.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Run one file; returns 0, or -1 when it cannot be read. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        if (n == 0)
            break;
        len += n;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int runs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "%s: cannot read %s\n", argv[0], argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]) < 0;
            runs++;
            continue;
        }
        DIR *dir = opendir(argv[i]);
        struct dirent *e;
        while (dir && (e = readdir(dir))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            bad += run_file(path) < 0;
            runs++;
        }
        if (dir)
            closedir(dir);
    }
    /* An empty corpus proves nothing: the empty input at least exercises set-up and tear-down. */
    LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
    printf("%s: %d input(s) replayed, %d unreadable\n", argv[0], runs, bad);
    return bad ? 1 : 0;
}
