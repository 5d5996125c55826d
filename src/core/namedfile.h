/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Files a user names in a setting (KVF_CONFIG, KVF_LOG_FILE, KVF_TIMELINE),
 * opened as block files are (namedfile.c): typed before anything waits on
 * them, so a FIFO, a socket or a device under that name is refused with a
 * reason instead of hanging the open or the first read or write.
 */
#ifndef KVF_CORE_NAMEDFILE_H
#define KVF_CORE_NAMEDFILE_H

#include "common.h"

#include <stdio.h>

/*
 * Opens the regular file at `path` as a stream: for reading, or for
 * appending (created 0644 when missing). NULL on failure, with errno set
 * (EINVAL for a file that is not regular) and *why_p a phrase for a
 * message ("not a regular file (a FIFO)", or strerror's text).
 */
KVF_INTERNAL FILE *kvf__named_file_open(const char *path, bool append, const char **why_p);

#endif /* KVF_CORE_NAMEDFILE_H */
