/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A URL as every message, log line, listing and setting shows it
 * (redact.c): the password of its user part (scheme://user:PASS@host...)
 * written as "***", so that no output of kvferry carries it.
 */
#ifndef KVF_REDACT_H
#define KVF_REDACT_H

#include "common.h"

/* `url` (NULL: "(null)") into out[0..cap), its password "***". */
KVF_INTERNAL void kvf__url_redact(const char *url, char *out, size_t cap);

#endif /* KVF_REDACT_H */
