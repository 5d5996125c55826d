/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPUDirect Storage in a build without CUDA: never available.
 */
#include "blockfile.h"
#include "gds.h"
#include "status.h"

#include <stdio.h>

kvf_status kvf__gds_acquire(kvf_gds_compat compat, kvf__gds_probe *probe)
{
    (void)compat;
    probe->found = KVF_GDS_STATE_ABSENT;
    snprintf(probe->detail, sizeof probe->detail, "built without CUDA");
    return kvf__fail(KVF_ERR_UNSUPPORTED, "cufile: built without CUDA");
}

void kvf__gds_release(void) {}

bool kvf__gds_dir_usable(const char *root, char *why, size_t cap)
{
    snprintf(why, cap, "%s: built without CUDA", root);
    return false;
}

kvf_status kvf__gds_buf_create(int device, size_t slot_bytes, size_t slots, kvf__gds_buf **buf_p)
{
    (void)device;
    (void)slot_bytes;
    (void)slots;
    (void)buf_p;
    return kvf__fail(KVF_ERR_UNSUPPORTED, "gds: built without CUDA");
}

void kvf__gds_buf_destroy(kvf__gds_buf *buf)
{
    (void)buf;
}

uint8_t *kvf__gds_buf_slot(kvf__gds_buf *buf, size_t i)
{
    (void)buf;
    (void)i;
    return NULL;
}

size_t kvf__gds_buf_slots(const kvf__gds_buf *buf)
{
    (void)buf;
    return 0;
}

const kvf__image_ops *kvf__gds_image_ops(void)
{
    return NULL;
}
