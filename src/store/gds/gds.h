/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPUDirect Storage (gds.c; gds_none.c in builds without CUDA): libcufile
 * is loaded with dlopen at the first use ($KVF_CUFILE_LIB, else
 * libcufile.so.0, else libcufile.so) and its driver opened once per
 * process while any engine uses it.
 */
#ifndef KVF_STORE_GDS_H
#define KVF_STORE_GDS_H

#include "blockfile.h"

typedef struct kvf__gds_probe {
    kvf_gds_state found; /* kvferry.h says what each means */
    char detail[160];    /* what was found, or why not */
} kvf__gds_probe;

/* The compat mode asked for: `c`, or env KVF_GDS_COMPAT=on|off|auto over AUTO. */
KVF_INTERNAL kvf_gds_compat kvf__gds_compat_of(kvf_gds_compat c);
/* Whether an engine whose probe found `probe` takes the GDS path for
 * file.io `io` (see kvf_gds_compat). When it does not, *why says why, for
 * the one warning file.io GDS gets (gds_mode.c). */
KVF_INTERNAL bool kvf__gds_choose(kvf_file_io io, kvf_gds_compat compat,
                                  const kvf__gds_probe *probe, char *why, size_t cap);
/* Loads cuFile and opens its driver (once per process), telling it first
 * whether its compatibility mode is allowed (OFF: no; ON: yes; AUTO: as
 * its configuration says). KVF_OK with a reference held (found COMPAT or
 * P2P) or an error (found ABSENT or REFUSED, detail saying why). */
KVF_INTERNAL kvf_status kvf__gds_acquire(kvf_gds_compat compat, kvf__gds_probe *probe);
/* Drops a reference; the last closes the driver. */
KVF_INTERNAL void kvf__gds_release(void);
/* Whether cuFile takes a file of directory `root` (a scratch file is
 * created, registered and removed): some file systems it refuses outright,
 * where every file would go through host memory. *why says why not. A
 * reference must be held. */
KVF_INTERNAL bool kvf__gds_dir_usable(const char *root, char *why, size_t cap);

/* Device staging for cuFile: `slots` images of slot_bytes (a multiple of
 * KVF_FILE_ALIGN) on `device`, 4096-aligned and registered with
 * cuFileBufRegister (used unregistered, said once, where that fails). */
typedef struct kvf__gds_buf kvf__gds_buf;
KVF_INTERNAL kvf_status kvf__gds_buf_create(int device, size_t slot_bytes, size_t slots,
                                            kvf__gds_buf **buf_p);
KVF_INTERNAL void kvf__gds_buf_destroy(kvf__gds_buf *buf);
KVF_INTERNAL uint8_t *kvf__gds_buf_slot(kvf__gds_buf *buf, size_t i);
KVF_INTERNAL size_t kvf__gds_buf_slots(const kvf__gds_buf *buf);
/* The image ops for a buffer's slots (arg: the kvf__gds_buf); NULL in a
 * build without CUDA. */
KVF_INTERNAL const kvf__image_ops *kvf__gds_image_ops(void);

#endif /* KVF_STORE_GDS_H */
