/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Failure detail for kvf_last_error() and the mapping of errno values to
 * statuses (status.c).
 */
#ifndef KVF_CORE_STATUS_H
#define KVF_CORE_STATUS_H

#include "common.h"

/* Records a failure's detail for kvf_last_error() and returns `status`, so
 * error paths read `return kvf__fail(KVF_ERR_RANGE, "pool %u: ...", p);`. */
KVF_INTERNAL kvf_status kvf__fail(kvf_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
KVF_INTERNAL void kvf__clear_error(void);
/* Maps an errno value to a status: ENOSPC/EDQUOT -> NO_SPACE, ENOMEM ->
 * NOMEM, EMFILE/ENFILE/EAGAIN/ENOBUFS -> RESOURCE, ENOENT -> NOT_FOUND,
 * anything else -> IO. */
KVF_INTERNAL kvf_status kvf__errno_status(int err);
/* Whether a failed read of a stored block is evidence against the block
 * itself (its checksum, header or layout, or its file missing, or the write
 * it depends on failed): only then may the block be dropped or its file
 * removed. A resource, I/O or device failure leaves the block where it is. */
KVF_INTERNAL bool kvf__status_condemns_block(kvf_status status);

#endif /* KVF_CORE_STATUS_H */
