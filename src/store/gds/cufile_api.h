/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The part of NVIDIA's cuFile API (GPUDirect Storage) that gds.c calls,
 * declared here because cufile.h is not installed where kvferry is built:
 * libcufile is loaded at run time. Layouts follow cufile.h of cuFile 1.x
 * (CUDA 12 and 13); tests/test_gds.c checks them against the real header
 * where one is installed. Internal: nothing here is part of the API.
 */
#ifndef KVF_GDS_H
#define KVF_GDS_H

#include <stddef.h>
#include <sys/types.h>

/* CUfileError_t: a cuFile status (CUfileOpError, 0 success, 5000 and up
 * errors) and the CUDA driver's (CUresult) where the failure was CUDA's. */
typedef struct kvf__cufile_error {
    int err;
    int cu_err;
} kvf__cufile_error;

#define KVF_CUFILE_SUCCESS 0
#define KVF_CUFILE_HANDLE_TYPE_OPAQUE_FD 1

/* CUfileDescr_t */
typedef struct kvf__cufile_descr {
    int type;
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} kvf__cufile_descr;

/* CUfileDrvProps_t */
typedef struct kvf__cufile_props {
    struct {
        unsigned int major_version;
        unsigned int minor_version;
        size_t poll_thresh_size;
        size_t max_direct_io_size;
        unsigned int dstatusflags;
        unsigned int dcontrolflags;
    } nvfs;
    unsigned int fflags;
    unsigned int max_device_cache_size;
    unsigned int per_buffer_cache_size;
    unsigned int max_device_pinned_mem_size;
    unsigned int max_batch_io_size;
    unsigned int max_batch_io_timeout_msecs;
} kvf__cufile_props;

/* CUfileDriverControlFlags_t: bit numbers of nvfs.dcontrolflags */
#define KVF_CUFILE_ALLOW_COMPAT_MODE_BIT 1
/* CUFileBoolConfigParameter_t (cuFileSetParameterBool, cuFile 1.9 on) */
#define KVF_CUFILE_PARAM_ALLOW_COMPAT_MODE 1

typedef void *kvf__cufile_handle;

#endif /* KVF_GDS_H */
