/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for libcufile (loaded through $KVF_CUFILE_LIB by
 * test_gds_probe): every entry point kvferry resolves, each failing, and a
 * count of driver opens the test reads back, so it can tell whether the
 * probe asked the driver at all.
 */
#include "cufile_api.h"

#define FAKE_ERR 5001 /* CU_FILE_DRIVER_NOT_INITIALIZED */
#define FAKE_FAIL ((kvf__cufile_error){FAKE_ERR, 0})
#define FAKE_EXPORT __attribute__((visibility("default")))

FAKE_EXPORT int fake_cufile_driver_opens;

FAKE_EXPORT kvf__cufile_error cuFileDriverOpen(void)
{
    fake_cufile_driver_opens++;
    return FAKE_FAIL;
}
FAKE_EXPORT kvf__cufile_error cuFileDriverClose(void)
{
    return FAKE_FAIL;
}
FAKE_EXPORT kvf__cufile_error cuFileDriverGetProperties(kvf__cufile_props *props)
{
    (void)props;
    return FAKE_FAIL;
}
FAKE_EXPORT kvf__cufile_error cuFileHandleRegister(kvf__cufile_handle *fh, kvf__cufile_descr *d)
{
    (void)fh;
    (void)d;
    return FAKE_FAIL;
}
FAKE_EXPORT void cuFileHandleDeregister(kvf__cufile_handle fh)
{
    (void)fh;
}
FAKE_EXPORT kvf__cufile_error cuFileBufRegister(const void *base, size_t length, int flags)
{
    (void)base;
    (void)length;
    (void)flags;
    return FAKE_FAIL;
}
FAKE_EXPORT kvf__cufile_error cuFileBufDeregister(const void *base)
{
    (void)base;
    return FAKE_FAIL;
}
/* the I/O calls fail as cuFile's do: minus the error */
FAKE_EXPORT ssize_t cuFileRead(kvf__cufile_handle fh, void *base, size_t size, off_t off,
                               off_t base_off)
{
    (void)fh, (void)base, (void)size, (void)off, (void)base_off;
    return -FAKE_ERR;
}
FAKE_EXPORT ssize_t cuFileWrite(kvf__cufile_handle fh, const void *base, size_t size, off_t off,
                                off_t base_off)
{
    return cuFileRead(fh, (void *)base, size, off, base_off);
}
