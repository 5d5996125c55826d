/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuFile probe (kvf_info_get, an engine's GDS choice) against a
 * stand-in libcufile (fake_cufile.c) whose driver open fails and is
 * counted: without a CUDA device the driver is never asked (a real
 * libcufile may not return from it there) and the probe says why; with
 * one it is asked once and its refusal reported. Its own program: the
 * library, once loaded, stays loaded for the process.
 */
#include "gds.h"
#include "testutil_cuda.h"

#include <dlfcn.h>

static int *driver_opens(void)
{
    void *h = dlopen(FAKE_CUFILE, RTLD_NOW | RTLD_NOLOAD);
    int *n = h ? dlsym(h, "fake_cufile_driver_opens") : NULL;
    if (h)
        dlclose(h);
    return n;
}

static int test_probe(void)
{
    setenv("KVF_CUFILE_LIB", FAKE_CUFILE, 1);
    bool gpu = test_have_gpu();
    for (int round = 0; round < 2; round++) {
        kvf_info info = KVF_INFO_INIT;
        CHECK_STATUS(kvf_info_get(&info), KVF_OK);
        CHECK_EQ_INT(info.gds_state, KVF_GDS_STATE_REFUSED);
        int *opens = driver_opens();
        REQUIRE(opens != NULL); /* the probe loaded the stand-in */
        if (gpu) {
            CHECK_EQ_INT(*opens, round + 1);
            CHECK_STR_HAS(info.gds_detail, "cuFileDriverOpen failed: error 5001");
        } else {
            CHECK_EQ_INT(*opens, 0);
            CHECK_STR_HAS(info.gds_detail, "no CUDA device");
        }
    }
    kvf__gds_probe p;
    CHECK_STATUS(kvf__gds_acquire(KVF_GDS_COMPAT_AUTO, &p), KVF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(p.found, KVF_GDS_STATE_REFUSED);
    CHECK_STR_HAS(kvf_last_error(), "cufile");
    CHECK_STR_HAS(kvf_last_error(), gpu ? "error 5001" : "no CUDA device");
    return 0;
}

int main(void)
{
    RUN(test_probe);
    return TEST_RESULT();
}
