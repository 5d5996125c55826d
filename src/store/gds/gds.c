/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPUDirect Storage: cuFile, loaded at run time.
 *
 * libcufile is opened with dlopen at the first engine that asks for it
 * (never at load time: most machines have none), the few entry points used
 * are resolved by name, and its driver is opened once and closed when the
 * last engine using it is destroyed. Nothing here includes cufile.h: the
 * declarations are gds.h's.
 *
 * What "real" GDS means. cuFileDriverOpen succeeds without the nvidia-fs
 * kernel module whenever cuFile's configuration allows its compatibility
 * mode (the default), and then every read and write is a POSIX call into
 * cuFile's own host bounce buffers followed by a copy to the GPU: correct,
 * but no faster than kvferry's POSIX path, which keeps more calls in
 * flight. The probe calls it P2P when the driver is open and nvidia-fs is
 * loaded (/proc/driver/nvidia-fs or /sys/module/nvidia_fs) or cuFile
 * reports P2P support in its feature flags (P2P DMA without nvidia-fs,
 * cuFile 1.14 on); otherwise compat. A file system cuFile cannot drive
 * directly (say, a virtio disk) still takes compat mode per file.
 *
 * Data path (the engine's staging, the file store's images). A block
 * image (header, payload, zero padding to 4096) is built in a device
 * staging slot the engine owns: slot regions gathered into it
 * by device-to-device copies, its CRC-32C computed by a kernel, the header
 * packed on the host and copied in front. cuFileWrite writes the image into
 * the temporary file that blockfile_write.c opened, so renames, spares and
 * durability are the POSIX path's. Reads are cuFileRead into a slot, the
 * header and padding fetched to the host and the payload's CRC computed on
 * the GPU, all checked before the engine scatters the payload.
 *
 * A file cuFile refuses to register (a descriptor without O_DIRECT where
 * compat mode is not allowed, say) is moved through host memory instead,
 * said once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "gds.h"
#include "blockfile.h"
#include "checksum.h"
#include "fileio.h"
#include "log.h"
#include "status.h"

#include "cuda_kernels.h"
#include "cufile_api.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the library --------------------------------------------------------- */

typedef struct cufile_api {
    kvf__cufile_error (*driver_open)(void);
    kvf__cufile_error (*driver_close)(void);
    kvf__cufile_error (*driver_get_properties)(kvf__cufile_props *props);
    kvf__cufile_error (*set_parameter_bool)(int param, _Bool value); /* optional */
    kvf__cufile_error (*handle_register)(kvf__cufile_handle *fh, kvf__cufile_descr *descr);
    void (*handle_deregister)(kvf__cufile_handle fh);
    kvf__cufile_error (*buf_register)(const void *base, size_t length, int flags);
    kvf__cufile_error (*buf_deregister)(const void *base);
    ssize_t (*read)(kvf__cufile_handle fh, void *base, size_t size, off_t file_offset,
                    off_t base_offset);
    ssize_t (*write)(kvf__cufile_handle fh, const void *base, size_t size, off_t file_offset,
                     off_t base_offset);
} cufile_api;

static pthread_mutex_t gds_mu = PTHREAD_MUTEX_INITIALIZER;
static void *lib;           /* kept loaded once loaded: cuFile's threads may outlive a close */
static cufile_api api;      /* resolved with lib */
static unsigned refs;       /* engines holding the driver open */
static kvf__gds_probe last; /* what the last open found */
static atomic_bool bounce_logged, unregistered_logged;

/* Loads the library and resolves the entry points; gds_mu held. */
static bool load_lib(kvf__gds_probe *p)
{
    if (lib)
        return true;
    const char *env = getenv("KVF_CUFILE_LIB");
    const char *names[] = {env && *env ? env : "libcufile.so.0",
                           env && *env ? NULL : "libcufile.so"};
    const char *err = "not found";
    void *h = NULL;
    for (size_t i = 0; i < 2 && !h && names[i]; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            err = e ? e : "not found";
        }
    }
    if (!h) {
        snprintf(p->detail, sizeof p->detail, "libcufile not loaded (%s)", err);
        return false;
    }
    struct {
        const char *name;
        void **slot;
        bool optional;
    } syms[] = {
        {"cuFileDriverOpen", (void **)&api.driver_open, false},
        {"cuFileDriverClose", (void **)&api.driver_close, false},
        {"cuFileDriverGetProperties", (void **)&api.driver_get_properties, false},
        {"cuFileSetParameterBool", (void **)&api.set_parameter_bool, true},
        {"cuFileHandleRegister", (void **)&api.handle_register, false},
        {"cuFileHandleDeregister", (void **)&api.handle_deregister, false},
        {"cuFileBufRegister", (void **)&api.buf_register, false},
        {"cuFileBufDeregister", (void **)&api.buf_deregister, false},
        {"cuFileRead", (void **)&api.read, false},
        {"cuFileWrite", (void **)&api.write, false},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional) {
            snprintf(p->detail, sizeof p->detail, "libcufile has no %s", syms[i].name);
            memset(&api, 0, sizeof api);
            dlclose(h);
            return false;
        }
    }
    lib = h;
    return true;
}

static bool nvfs_loaded(void)
{
    return access("/proc/driver/nvidia-fs/version", F_OK) == 0 ||
           access("/sys/module/nvidia_fs", F_OK) == 0;
}

/* Whether CUDA sees a device. cuFile drives none without one, and its
 * driver open may then never return (seen with the libcufile that PyTorch's
 * wheels ship, on a machine without a GPU), so it is not asked. */
static bool have_device(kvf__gds_probe *p)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        snprintf(p->detail, sizeof p->detail,
                 "libcufile loaded, driver not opened: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        p->found = KVF_GDS_STATE_REFUSED;
        return false;
    }
    return true;
}

/* Opens the driver and says what it offers; gds_mu held, lib loaded. */
static bool open_driver(kvf_gds_compat compat, kvf__gds_probe *p)
{
    if (!have_device(p))
        return false;
    if (compat != KVF_GDS_COMPAT_AUTO) {
        if (api.set_parameter_bool) {
            kvf__cufile_error e = api.set_parameter_bool(KVF_CUFILE_PARAM_ALLOW_COMPAT_MODE,
                                                         compat == KVF_GDS_COMPAT_ON);
            if (e.err != KVF_CUFILE_SUCCESS)
                KVF_LOG(KVF_LOG_INFO, "cufile: cuFileSetParameterBool(allow_compat_mode): error %d",
                        e.err);
        } else {
            KVF_LOG(KVF_LOG_INFO, "cufile: no cuFileSetParameterBool: compat mode as configured "
                                  "($CUFILE_ENV_PATH_JSON)");
        }
    }
    kvf__cufile_error e = api.driver_open();
    if (e.err != KVF_CUFILE_SUCCESS) {
        snprintf(p->detail, sizeof p->detail,
                 "libcufile loaded, cuFileDriverOpen failed: error %d (cuda %d)%s", e.err, e.cu_err,
                 nvfs_loaded() ? "" : "; nvidia-fs not loaded");
        p->found = KVF_GDS_STATE_REFUSED;
        return false;
    }
    /* more room than the struct: a newer library may write more */
    union {
        kvf__cufile_props props;
        unsigned char room[1024];
    } u;
    memset(&u, 0, sizeof u);
    bool have_props = api.driver_get_properties(&u.props).err == KVF_CUFILE_SUCCESS;
    /* P2P needs the nvidia-fs kernel module (or a driver that reports its
     * own nvfs version); cuFile 1.15's header (CUDA 13.0) has no feature
     * bit for P2P, so none is read */
    bool nvfs = nvfs_loaded() || (have_props && u.props.nvfs.major_version > 0);
    bool compat_allowed =
        have_props && (u.props.nvfs.dcontrolflags >> KVF_CUFILE_ALLOW_COMPAT_MODE_BIT & 1u);
    p->found = nvfs ? KVF_GDS_STATE_P2P : KVF_GDS_STATE_COMPAT;
    snprintf(p->detail, sizeof p->detail,
             "driver open, %s (nvidia-fs %s, nvfs %u.%u, compat mode %s)",
             p->found == KVF_GDS_STATE_P2P ? "p2p" : "compatibility mode",
             nvfs ? "loaded" : "not loaded", u.props.nvfs.major_version, u.props.nvfs.minor_version,
             !have_props      ? "unknown"
             : compat_allowed ? "allowed"
                              : "not allowed");
    return true;
}

kvf_status kvf__gds_acquire(kvf_gds_compat compat, kvf__gds_probe *probe)
{
    kvf__gds_probe p = {KVF_GDS_STATE_ABSENT, ""};
    kvf_status st = KVF_OK;
    pthread_mutex_lock(&gds_mu);
    if (refs) {
        p = last;
        refs++;
    } else if (!load_lib(&p)) {
        st = KVF_ERR_UNSUPPORTED;
    } else if (!open_driver(compat, &p)) {
        st = KVF_ERR_UNSUPPORTED;
    } else {
        last = p;
        refs = 1;
    }
    pthread_mutex_unlock(&gds_mu);
    *probe = p;
    if (st != KVF_OK)
        return kvf__fail(st, "cufile: %s", p.detail);
    return KVF_OK;
}

bool kvf__gds_dir_usable(const char *root, char *why, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.gds-probe.%ld.tmp", root, (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0)
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, cap, "cannot create %s: %s", path, strerror(errno));
        return false;
    }
    kvf__cufile_descr d;
    memset(&d, 0, sizeof d);
    d.type = KVF_CUFILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    kvf__cufile_handle fh = NULL;
    kvf__cufile_error e = api.handle_register(&fh, &d);
    bool ok = e.err == KVF_CUFILE_SUCCESS;
    if (ok)
        api.handle_deregister(fh);
    else
        snprintf(why, cap, "cuFile does not take files on %s (cuFileHandleRegister: error %d)",
                 root, e.err);
    close(fd);
    unlink(path);
    return ok;
}

void kvf__gds_release(void)
{
    pthread_mutex_lock(&gds_mu);
    if (refs && --refs == 0) {
        kvf__cufile_error e = api.driver_close();
        if (e.err != KVF_CUFILE_SUCCESS)
            KVF_LOG(KVF_LOG_WARN, "cufile: cuFileDriverClose: error %d", e.err);
    }
    pthread_mutex_unlock(&gds_mu);
}

/* ---- device staging ------------------------------------------------------- */

struct kvf__gds_buf {
    int device;
    void *alloc;   /* cudaMalloc's */
    uint8_t *base; /* 4096-aligned inside alloc */
    size_t slot_bytes, slots;
    uint32_t *crc; /* device: one CRC register per slot */
    bool registered;
};

static kvf_status cuda_status(cudaError_t err, const char *call, const char *what)
{
    (void)cudaGetLastError(); /* clear the sticky error */
    return kvf__fail(err == cudaErrorMemoryAllocation ? KVF_ERR_NOMEM : KVF_ERR_DEVICE,
                     "gds: %s: %s: %s", what, call, cudaGetErrorString(err));
}

#define GDS_CUDA(expr, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_status(e_, #expr, what);                                                   \
    } while (0)

/* The buffer's device made current on this thread (the I/O runner's
 * threads never chose one), the previous one restored by dev_leave. */
static kvf_status dev_enter(int device, int *prev_p)
{
    int cur = -1;
    *prev_p = -1;
    GDS_CUDA(cudaGetDevice(&cur), "device");
    if (cur != device) {
        GDS_CUDA(cudaSetDevice(device), "device");
        *prev_p = cur;
    }
    return KVF_OK;
}

static void dev_leave(int prev)
{
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess)
        (void)cudaGetLastError();
}

kvf_status kvf__gds_buf_create(int device, size_t slot_bytes, size_t slots, kvf__gds_buf **buf_p)
{
    size_t bytes;
    if (slots == 0 || slot_bytes == 0 || slot_bytes % KVF_FILE_ALIGN ||
        kvf__mul_overflows(slot_bytes, slots, &bytes) || bytes > SIZE_MAX - 2 * KVF_FILE_ALIGN)
        return kvf__fail(KVF_ERR_INVALID, "gds: staging of %zu slots of %zu bytes", slots,
                         slot_bytes);
    kvf__gds_buf *g = calloc(1, sizeof *g);
    if (!g)
        return kvf__fail(KVF_ERR_NOMEM, "gds: out of memory");
    g->device = device;
    g->slot_bytes = slot_bytes;
    g->slots = slots;
    int prev;
    kvf_status st = dev_enter(device, &prev);
    if (st != KVF_OK) {
        free(g);
        return st;
    }
    cudaError_t err = cudaMalloc(&g->alloc, bytes + KVF_FILE_ALIGN);
    if (err == cudaSuccess)
        err = cudaMalloc((void **)&g->crc, slots * sizeof *g->crc);
    if (err != cudaSuccess) {
        st = cuda_status(err, "cudaMalloc", "staging");
        goto fail;
    }
    g->base =
        (uint8_t *)(((uintptr_t)g->alloc + KVF_FILE_ALIGN - 1) & ~(uintptr_t)(KVF_FILE_ALIGN - 1));
    pthread_mutex_lock(&gds_mu);
    bool driver_open = lib && refs;
    pthread_mutex_unlock(&gds_mu);
    if (driver_open) {
        kvf__cufile_error e = api.buf_register(g->base, bytes, 0);
        g->registered = e.err == KVF_CUFILE_SUCCESS;
        if (!g->registered && !atomic_exchange(&unregistered_logged, true))
            KVF_LOG(KVF_LOG_WARN,
                    "cufile: cuFileBufRegister of %zu bytes: error %d (cuda %d): staging used "
                    "unregistered",
                    bytes, e.err, e.cu_err);
    }
    dev_leave(prev);
    *buf_p = g;
    return KVF_OK;
fail:
    if (g->alloc && cudaFree(g->alloc) != cudaSuccess)
        (void)cudaGetLastError();
    if (g->crc && cudaFree(g->crc) != cudaSuccess)
        (void)cudaGetLastError();
    dev_leave(prev);
    free(g);
    return st;
}

void kvf__gds_buf_destroy(kvf__gds_buf *g)
{
    if (!g)
        return;
    int prev;
    if (dev_enter(g->device, &prev) != KVF_OK)
        prev = -1;
    if (g->registered) {
        kvf__cufile_error e = api.buf_deregister(g->base);
        if (e.err != KVF_CUFILE_SUCCESS)
            KVF_LOG(KVF_LOG_WARN, "cufile: cuFileBufDeregister: error %d", e.err);
    }
    if (cudaFree(g->alloc) != cudaSuccess || cudaFree(g->crc) != cudaSuccess) {
        (void)cudaGetLastError();
        KVF_LOG(KVF_LOG_WARN, "gds: cudaFree of the staging failed");
    }
    dev_leave(prev);
    free(g);
}

uint8_t *kvf__gds_buf_slot(kvf__gds_buf *g, size_t i)
{
    return g->base + i * g->slot_bytes;
}

size_t kvf__gds_buf_slots(const kvf__gds_buf *g)
{
    return g->slots;
}

/* ---- the image ops -------------------------------------------------------- */

/* A call through host memory, for a file cuFile will not take. */
static long long bounce(kvf__gds_buf *g, kvf__fio_op *op, size_t len)
{
    void *h = NULL;
    if (posix_memalign(&h, KVF_FILE_ALIGN, len ? len : 1) != 0)
        return -ENOMEM;
    long long r;
    uint8_t *img = op->buf + op->done;
    off_t off = (off_t)(op->off + op->done);
    if (op->kind == KVF_FIO_WRITE) {
        if (cudaMemcpy(h, img, len, cudaMemcpyDeviceToHost) != cudaSuccess) {
            (void)cudaGetLastError();
            r = -EIO;
        } else {
            ssize_t n = pwrite(op->fd, h, len, off);
            r = n < 0 ? -(long long)errno : n;
        }
    } else {
        ssize_t n = pread(op->fd, h, len, off);
        r = n < 0 ? -(long long)errno : n;
        if (r > 0 && cudaMemcpy(img, h, (size_t)r, cudaMemcpyHostToDevice) != cudaSuccess) {
            (void)cudaGetLastError();
            r = -EIO;
        }
    }
    (void)g;
    free(h);
    return r;
}

static long long gds_xfer(kvf__fio_op *op, size_t len)
{
    kvf__gds_buf *g = op->xfer_arg;
    int prev;
    if (dev_enter(g->device, &prev) != KVF_OK)
        return -EIO;
    long long r;
    kvf__cufile_descr d;
    memset(&d, 0, sizeof d);
    d.type = KVF_CUFILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = op->fd;
    kvf__cufile_handle fh = NULL;
    kvf__cufile_error e = api.handle_register(&fh, &d);
    if (e.err != KVF_CUFILE_SUCCESS) {
        if (!atomic_exchange(&bounce_logged, true))
            KVF_LOG(KVF_LOG_WARN,
                    "cufile: cuFileHandleRegister of %s: error %d (cuda %d); such files go "
                    "through host memory",
                    op->path, e.err, e.cu_err);
        r = bounce(g, op, len);
        dev_leave(prev);
        return r;
    }
    uint8_t *img = op->buf + op->done;
    const void *base = g->registered ? (const void *)g->base : (const void *)img;
    off_t boff = g->registered ? (off_t)(img - g->base) : 0;
    off_t foff = (off_t)(op->off + op->done);
    ssize_t n = op->kind == KVF_FIO_WRITE ? api.write(fh, base, len, foff, boff)
                                          : api.read(fh, (void *)base, len, foff, boff);
    api.handle_deregister(fh);
    if (n >= 0) {
        r = n;
    } else if (n == -1) {
        r = -(long long)(errno ? errno : EIO);
    } else {
        KVF_LOG(KVF_LOG_WARN, "cufile: %s of %s: error %lld",
                op->kind == KVF_FIO_WRITE ? "cuFileWrite" : "cuFileRead", op->path, (long long)-n);
        r = -EIO;
    }
    dev_leave(prev);
    return r;
}

static kvf_status gds_get(void *arg, const uint8_t *img, void *dst, size_t n)
{
    kvf__gds_buf *g = arg;
    int prev;
    kvf_status st = dev_enter(g->device, &prev);
    if (st != KVF_OK)
        return st;
    cudaError_t err = cudaMemcpyAsync(dst, img, n, cudaMemcpyDeviceToHost, cudaStreamPerThread);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess)
        st = cuda_status(err, "cudaMemcpyAsync", "image to host");
    dev_leave(prev);
    return st;
}

static kvf_status gds_put(void *arg, uint8_t *img, const void *src, size_t n)
{
    kvf__gds_buf *g = arg;
    int prev;
    kvf_status st = dev_enter(g->device, &prev);
    if (st != KVF_OK || n == 0) {
        dev_leave(prev);
        return st;
    }
    cudaError_t err =
        src ? cudaMemcpyAsync(img, src, n, cudaMemcpyHostToDevice, cudaStreamPerThread)
            : cudaMemsetAsync(img, 0, n, cudaStreamPerThread);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess)
        st = cuda_status(err, src ? "cudaMemcpyAsync" : "cudaMemsetAsync", "host to image");
    dev_leave(prev);
    return st;
}

static kvf_status gds_crc(void *arg, const uint8_t *img, size_t n, uint32_t *crc_p)
{
    kvf__gds_buf *g = arg;
    if (img < g->base || img >= g->base + g->slots * g->slot_bytes)
        return kvf__fail(KVF_ERR_INVALID, "gds: %p is not in the staging", (const void *)img);
    uint32_t *out = g->crc + (size_t)(img - g->base) / g->slot_bytes;
    int prev;
    kvf_status st = dev_enter(g->device, &prev);
    if (st != KVF_OK)
        return st;
    uint32_t raw = 0;
    cudaError_t err = kvf__cuda_crc32c_launch(img, n, out, cudaStreamPerThread);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(&raw, out, sizeof raw, cudaMemcpyDeviceToHost, cudaStreamPerThread);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess)
        st = cuda_status(err, "crc32c kernel", "checksum");
    else
        *crc_p = kvf__crc32c_from_raw(0, n, raw);
    dev_leave(prev);
    return st;
}

static const kvf__image_ops gds_ops = {gds_xfer, gds_get, gds_put, gds_crc};

const kvf__image_ops *kvf__gds_image_ops(void)
{
    return &gds_ops;
}
