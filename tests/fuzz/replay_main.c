/* SPDX-License-Identifier: Apache-2.0 */
/* Runs a fuzz target over files and directories of inputs (a committed
 * corpus), without libFuzzer: every build replays the corpora under ctest,
 * so inputs that once crashed a parser keep being tried with gcc and
 * without clang. Exit 0 when every input ran; a broken property aborts. */
#include "fuzz.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *data = NULL;
    size_t size = 0, cap = 0, got;
    do {
        if (size == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *grown = realloc(data, cap);
            if (!grown) {
                fprintf(stderr, "%s: out of memory\n", path);
                free(data);
                fclose(f);
                return -1;
            }
            data = grown;
        }
        got = fread(data + size, 1, cap - size, f);
        size += got;
    } while (got > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: read error\n", path);
        free(data);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

/* Every regular file of a directory (one level: corpora are flat). */
static int run_dir(const char *dir, unsigned *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (run_file(path))
            rc = -1;
        else
            (*count)++;
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    unsigned count = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(sb.st_mode) ? run_dir(argv[i], &count) : run_file(argv[i])) {
            rc = 1;
        } else if (!S_ISDIR(sb.st_mode)) {
            count++;
        }
    }
    /* an empty or misnamed corpus would pass while testing nothing */
    if (count == 0) {
        fprintf(stderr, "%s: no inputs found\n", argv[0]);
        return 1;
    }
    printf("%s: %u inputs, every property held\n", argv[0], count);
    return rc;
}
