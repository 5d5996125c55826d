/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The names of block files and the length rule.
 *
 * A block is stored as <16 lower-case hex digits of the key>.kvf; a write
 * in progress as .<key>.<pid>.<sequence>.tmp, a spare as the same with
 * .spare (blockfile_spare.c).
 *
 * Length rule. Files are written with O_DIRECT where the file system takes
 * it, which moves whole 4096-byte units: the writer pads the image with
 * zeros to round_up(64 + payload, 4096) when its buffer has room, and the
 * file keeps that length (no ftruncate: trimming a partial unit would read
 * it back and dirty it in the page cache, a buffered write per file). A
 * reader accepts a file of exactly 64 + payload bytes (a writer without
 * room to pad) or of the padded length, and nothing else: a file cut or
 * grown by even one byte is corrupt, the header's payload length says
 * where the data ends, and the checksum covers the payload, so padding is
 * never handed back as data.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "status.h"

#include <limits.h>
#include <string.h>

bool kvf__bf_parse_hex16(const char *s, uint64_t *key_p)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return false;
        v = v << 4 | d;
    }
    *key_p = v;
    return true;
}

bool kvf__bf_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parses ".<16 hex>.<pid>.<sequence>.tmp" (or ".spare"), the names
 * kvf__blockfile_write gives its temporary and spare files; false for any
 * other name. */
bool kvf__bf_parse_tmp_name(const char *n, pid_t *pid_p)
{
    uint64_t key;
    if (n[0] != '.' || !kvf__bf_parse_hex16(n + 1, &key) || n[17] != '.')
        return false;
    const char *p = n + 18;
    long long pid = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (++digits > 10)
            return false;
        pid = pid * 10 + (*p - '0');
    }
    if (digits == 0 || *p != '.' || pid <= 0 || pid > INT_MAX)
        return false;
    p++;
    digits = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (++digits > 20)
            return false;
    if (digits == 0 || (strcmp(p, ".tmp") != 0 && strcmp(p, ".spare") != 0))
        return false;
    *pid_p = (pid_t)pid;
    return true;
}

/* The length rule: a file holds the header and payload exactly, or padded
 * with zeros to the next multiple of KVF_FILE_ALIGN (the O_DIRECT image).
 * A claim over BLOCK_PAYLOAD_MAX is refused whatever the file's size: a
 * sparse file can match any claim, and a reader sizes its buffer by it. */
kvf_status kvf__bf_check_file_size(uint64_t size, uint64_t payload, const char *what)
{
    if (payload > BLOCK_PAYLOAD_MAX)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: header claims %llu payload bytes, more than any block holds "
                         "(%llu)",
                         what, (unsigned long long)payload, (unsigned long long)BLOCK_PAYLOAD_MAX);
    uint64_t exact = HDR + payload;
    uint64_t padded = (exact + KVF_FILE_ALIGN - 1) & ~(uint64_t)(KVF_FILE_ALIGN - 1);
    if (size == exact || size == padded)
        return KVF_OK;
    return kvf__fail(KVF_ERR_CORRUPT, "%s: file of %llu bytes, header says %u + %llu (%s)", what,
                     (unsigned long long)size, HDR, (unsigned long long)payload,
                     size < exact ? "truncated" : "extended, or its padding cut");
}
