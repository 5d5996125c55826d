/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The names of block files and the length rule.
 *
 * A block is stored as <32 lower-case hex digits of the key>.kvf
 * (KVF_KEY_FMT); a write in progress as .<key>.<pid>.<sequence>.tmp, a
 * spare as the same with .spare (blockfile_spare.c). Format version 1
 * named files by a 64-bit key, <16 hex digits>.kvf: recognised here only
 * so that fsck can report them and kvf_dir_upgrade rewrite them.
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
#include "checksum.h"
#include "status.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

void kvf__bf_block_file_name(kvf_key key, char *buf, size_t cap)
{
    snprintf(buf, cap, KVF_KEY_FMT ".kvf", KVF_KEY_ARGS(key));
}

bool kvf__bf_block_name(const char *n, kvf_key *key_p)
{
    kvf_key k;
    if (strlen(n) != KEY_DIGITS + 4 || !kvf__bf_ends_with(n, ".kvf") || !kvf__key_from_name(n, &k))
        return false;
    *key_p = k;
    return true;
}

bool kvf__bf_old_block_name(const char *n, uint64_t *key_p)
{
    return strlen(n) == OLD_KEY_DIGITS + 4 && kvf__bf_ends_with(n, ".kvf") &&
           kvf__hex_u64(n, OLD_KEY_DIGITS, false, key_p);
}

bool kvf__bf_torn_name(const char *n, kvf_key *key_p)
{
    kvf_key k;
    if (n[0] != '.' || strlen(n) <= KEY_DIGITS + 2 || n[KEY_DIGITS + 1] != '.' ||
        !kvf__bf_ends_with(n, ".tmp") || !kvf__key_from_name(n + 1, &k))
        return false;
    *key_p = k;
    return true;
}

bool kvf__bf_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parses ".<32 hex>.<pid>.<sequence>.tmp" (or ".spare"), the names
 * kvf__blockfile_write gives its temporary and spare files, or the same
 * with 16 hex digits (format version 1's writers); false for any other
 * name. */
bool kvf__bf_parse_tmp_name(const char *n, pid_t *pid_p)
{
    kvf_key key;
    uint64_t old;
    int digits_key = n[0] == '.' && kvf__key_from_name(n + 1, &key) ? KEY_DIGITS
                     : n[0] == '.' && kvf__hex_u64(n + 1, OLD_KEY_DIGITS, false, &old)
                         ? OLD_KEY_DIGITS
                         : 0;
    if (!digits_key || n[digits_key + 1] != '.')
        return false;
    const char *p = n + digits_key + 2;
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
kvf_status kvf__bf_check_file_size(uint64_t size, uint32_t hdr, uint64_t payload, const char *what)
{
    if (payload > BLOCK_PAYLOAD_MAX)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: header claims %llu payload bytes, more than any block holds "
                         "(%llu)",
                         what, (unsigned long long)payload, (unsigned long long)BLOCK_PAYLOAD_MAX);
    uint64_t exact = hdr + payload;
    uint64_t padded = (exact + KVF_FILE_ALIGN - 1) & ~(uint64_t)(KVF_FILE_ALIGN - 1);
    if (size == exact || size == padded)
        return KVF_OK;
    return kvf__fail(KVF_ERR_CORRUPT, "%s: file of %llu bytes, header says %u + %llu (%s)", what,
                     (unsigned long long)size, hdr, (unsigned long long)payload,
                     size < exact ? "truncated" : "extended, or its padding cut");
}

/* The padding after the payload is zeros: any byte of the file changed is
 * caught, not only those the checksums cover. */
kvf_status kvf__bf_check_padding(const uint8_t *pad, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (pad[i] != 0)
            return kvf__fail(KVF_ERR_CORRUPT, "%s: padding byte %zu is 0x%02x, not 0", what, i,
                             pad[i]);
    return KVF_OK;
}
