/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the two walks of a block directory from outside an engine share
 * (dir_scan.c: kvf_dir_check and kvf_dir_list; dir_upgrade.c:
 * kvf_dir_upgrade): opening a namespace without creating it, reading its
 * names, counting verdicts. For src/store/file/ only.
 */
#ifndef KVF_STORE_DIR_WALK_H
#define KVF_STORE_DIR_WALK_H

#include "blockfile.h"

#include <dirent.h>

/* Opens <dir>/<ns> for reading with the layout of `g` (NULL: any),
 * without creating it (kvf__blockfile_open_dir would); buffered reads. */
KVF_INTERNAL kvf_status kvf__dir_open_namespace(const char *dir, const char *ns,
                                                const kvf_geometry *g, size_t n_pools,
                                                kvf__blockfile_dir *d);
/* A walk of the namespace on a description of its own. */
KVF_INTERNAL kvf_status kvf__dir_open_walk(const kvf__blockfile_dir *d, DIR **w_p);
/* The next name, NULL at the end; a readdir failure in *st_p. */
KVF_INTERNAL const char *kvf__dir_walk_next(const kvf__blockfile_dir *d, DIR *w, kvf_status *st_p);
/* Adds one entry of `kind` to *c. */
KVF_INTERNAL void kvf__dir_count_entry(kvf_dir_counts *c, kvf_dir_entry_kind kind);

#endif /* KVF_STORE_DIR_WALK_H */
