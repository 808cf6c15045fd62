/* recording_driver.c: a recording stand-in for the CUDA driver library (libcuda.so.1), dlopened by
 * CPU-only tests. */
/*
 * Why this exists: the native launcher resolves driver entry points with
 * dlopen/dlsym.  On a machine without a GPU we point it at this library
 * instead.  It behaves like the driver where tests care about it (device
 * queries, contexts, loading a real cubin, reading the kernel's parameter
 * layout from the cubin, validating launches) and it records every launch,
 * including the exact parameter bytes the real driver would copy into the
 * kernel's constant bank, so tests can check what the launcher passed.
 *
 * All recorded state lives here, in the shared object: the test's ctypes
 * handle and the launcher's dlopen handle for the same path are the same
 * loaded object, so both see one copy of it.
 *
 * Build: cc -shared -fPIC -O1 -Wall -Wextra -Werror -o librecording_driver.so recording_driver.c
 * -lpthread
 *
 * No CUDA header is included on purpose: the project must build without a
 * CUDA toolkit, so the few types needed are declared below with the layout
 * of cuda.h (12.x and 13.x), checked by _Static_assert.
 */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Minimal driver API types (same ABI as cuda.h, declared here on purpose).  */

typedef int CUresult;
typedef int CUdevice;
typedef struct fk_ctx* CUcontext;
typedef struct fk_mod* CUmodule;
typedef struct fk_func* CUfunction;
typedef void* CUstream;
typedef unsigned long long CUdeviceptr;

typedef struct {
  unsigned int id;
  char pad[4];
  union {
    char raw[64];
    struct {
      unsigned int x, y, z;
    } clusterDim;
    int cooperative;
    int programmaticStreamSerializationAllowed;
    int clusterSchedulingPolicyPreference;
    int sharedMemoryMode;
  } value;
} CUlaunchAttribute; /* 72 bytes */

typedef struct {
  unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

/* cuda.h's value union also holds pointers, so there it is 8-byte aligned;
 * ours is 4-byte aligned.  Size and member offsets are what matter for
 * reading arrays the caller built, and those must match exactly. */
_Static_assert(sizeof(void*) == 8, "the stand-in assumes an LP64 target, as the CUDA driver does");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute must be 72 bytes as in cuda.h");
_Static_assert(offsetof(CUlaunchAttribute, value) == 8,
               "CUlaunchAttribute.value must be at offset 8");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig must be 56 bytes as in cuda.h");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream offset");
_Static_assert(offsetof(CUlaunchConfig, attrs) == 40, "CUlaunchConfig.attrs offset");
_Static_assert(offsetof(CUlaunchConfig, numAttrs) == 48, "CUlaunchConfig.numAttrs offset");

#define FK_EXPORT __attribute__((visibility("default")))

/* CUresult values used here (values from cuda.h). */
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

/* Function attribute ids (CUfunction_attribute) with special handling. */
enum {
  FK_FUNC_MAX_THREADS_PER_BLOCK = 0,
  FK_FUNC_SHARED_SIZE_BYTES = 1,
  FK_FUNC_LOCAL_SIZE_BYTES = 3,
  FK_FUNC_NUM_REGS = 4,
  FK_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  FK_FUNC_SHARED_MEMORY_MODE = 17,
};

/* Limits of the pretend device (an H100-like sm_90 part). */
#define FK_DEFAULT_DEVICES 2
#define FK_MAX_DEVICES 16
#define FK_SMEM_PER_BLOCK 49152 /* default dynamic shared memory limit */
#define FK_SMEM_PER_BLOCK_OPTIN 232448

/* Recording limits. */
#define FK_MAX_LAUNCHES 4096
#define FK_MAX_ATTRS 8
#define FK_ATTR_BYTES 64
#define FK_MAX_FUNC_ATTR 64
#define FK_CTX_STACK 16
#define FK_MAX_IMAGE ((size_t)1 << 30)

/* ------------------------------------------------------------------------ */
/* State.  One mutex guards everything shared between threads; the tests are
 * not performance sensitive and a single lock keeps the invariants simple. */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

struct fk_ctx {
  int retain_count; /* only informative; primary contexts are never destroyed */
};
static struct fk_ctx g_ctx[FK_MAX_DEVICES];

/* The thread's context stack; its top is the current context, as in the
 * real driver, so cuCtxSetCurrent replaces the top and Push/Pop nest. */
static _Thread_local CUcontext t_ctx_stack[FK_CTX_STACK];
static _Thread_local int t_ctx_depth;

struct fk_param {
  unsigned int ordinal;
  unsigned int offset;
  unsigned int size;
};

struct fk_func {
  struct fk_func* next;
  struct fk_mod* mod;
  char* name;
  int nparams;
  struct fk_param* params; /* sorted by ordinal */
  unsigned int cbank_size; /* bytes of the parameter constant bank */
  unsigned char attr_is_set[FK_MAX_FUNC_ATTR];
  int attr_value[FK_MAX_FUNC_ATTR];
  int cache_config;
};

/* Modules are never freed, only marked unloaded, so that a stale CUmodule or
 * CUfunction is reported as CUDA_ERROR_INVALID_HANDLE instead of crashing. */
struct fk_mod {
  struct fk_mod* next;
  CUcontext ctx;
  unsigned char* image;
  size_t size;
  unsigned long long digest; /* FNV-1a of the image: which binary a launch ran */
  int unloaded;
  struct fk_func* funcs;
};
static struct fk_mod* g_modules;
static unsigned long long g_retained_bytes;

struct fk_launch {
  char* name;
  int device;
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_mem;
  unsigned long long stream;
  unsigned long long image; /* the digest of the launched function's module image */
  int is_ex;
  int num_attrs;
  unsigned int attr_id[FK_MAX_ATTRS];
  unsigned char attr_value[FK_MAX_ATTRS][FK_ATTR_BYTES];
  int num_params;
  struct fk_param* params;
  unsigned int raw_size;
  unsigned char* raw;
};
/* Recording stops (launches keep succeeding) once the table is full; the
 * launch counter keeps counting so a test can notice the overflow. */
static struct fk_launch g_launches[FK_MAX_LAUNCHES];
static int g_num_recorded;
static int g_num_launches;
static int g_num_module_loads;
static int g_num_module_unloads;

/* -1: no override, consult FKSTUB_LAUNCH_RESULT; otherwise the result code. */
static int g_launch_result_override = -1;

/* What cuFuncGetAttribute reports for these attributes of a function where none was set
 * (fkstub_set_function_defaults): a real driver reads them from the cubin. */
#define FK_DEFAULT_MAX_THREADS 1024
#define FK_DEFAULT_NUM_REGS 32
static int g_default_max_threads = FK_DEFAULT_MAX_THREADS;
static int g_default_num_regs = FK_DEFAULT_NUM_REGS;
static int g_default_local_bytes = 0;
static int g_param_count_api = 1;         /* cuFuncGetParamCount answers (fkstub_set_...) */
static int g_num_param_info_failures = 0; /* cuFuncGetParamInfo calls that returned an error */

/* Last value set per (function name, attribute) through cuFuncSetAttribute.
 * Kept by name because tests usually know the kernel name, not the handle. */
struct fk_attr_log {
  char* name;
  int attr;
  int value;
};
static struct fk_attr_log* g_attr_log;
static int g_attr_log_len;
static int g_attr_log_cap;

/* ------------------------------------------------------------------------ */
/* Small helpers. */

/* Byte-wise little-endian reads: cubin fields are little-endian and may be
 * unaligned inside .nv.info sections. */
static unsigned int rd16(const unsigned char* p) {
  return (unsigned int)p[0] | ((unsigned int)p[1] << 8);
}
static unsigned int rd32(const unsigned char* p) { return rd16(p) | (rd16(p + 2) << 16); }
static unsigned long long rd64(const unsigned char* p) {
  return (unsigned long long)rd32(p) | ((unsigned long long)rd32(p + 4) << 32);
}

static char* dup_str(const char* s) {
  size_t n = strlen(s) + 1;
  char* d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Read on every call so a test can change FKSTUB_DEVICES between cases. */
static int device_count(void) {
  const char* s = getenv("FKSTUB_DEVICES");
  if (!s || !*s) return FK_DEFAULT_DEVICES;
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < 0) return FK_DEFAULT_DEVICES;
  return v > FK_MAX_DEVICES ? FK_MAX_DEVICES : (int)v;
}

static int valid_device(CUdevice dev) { return dev >= 0 && dev < device_count(); }

/* Compute capability as major*10+minor: FKSTUB_CAPABILITY (e.g. "80"), read
 * on every call like FKSTUB_DEVICES; 90 (sm_90) when unset or invalid. */
static int capability(void) {
  const char* s = getenv("FKSTUB_CAPABILITY");
  if (!s || !*s) return 90;
  char* end = NULL;
  long v = strtol(s, &end, 10);
  return (*end != '\0' || v < 10 || v > 199) ? 90 : (int)v;
}

static int ctx_device(CUcontext ctx) {
  for (int i = 0; i < FK_MAX_DEVICES; i++)
    if (ctx == &g_ctx[i]) return i;
  return -1;
}

static int valid_ctx(CUcontext ctx) {
  int dev = ctx_device(ctx);
  return dev >= 0 && valid_device(dev);
}

static CUcontext current_ctx(void) { return t_ctx_depth > 0 ? t_ctx_stack[t_ctx_depth - 1] : NULL; }

/* Handle checks walk the module list (callers hold g_lock): a garbage or
 * stale pointer is never dereferenced. */
static int valid_module(CUmodule mod) {
  for (struct fk_mod* m = g_modules; m; m = m->next)
    if (m == mod) return !m->unloaded;
  return 0;
}

static int valid_func(CUfunction f) {
  for (struct fk_mod* m = g_modules; m; m = m->next) {
    if (m->unloaded) continue;
    for (struct fk_func* fn = m->funcs; fn; fn = fn->next)
      if (fn == f) return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Initialization, version, devices. */

FK_EXPORT CUresult cuInit(unsigned int flags) {
  /* The real driver requires Flags == 0. */
  return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 12080;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = device_count();
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetAttribute(int* pi, int attrib, CUdevice dev) {
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case 75:
      *pi = capability() / 10;
      break; /* COMPUTE_CAPABILITY_MAJOR */
    case 76:
      *pi = capability() % 10;
      break; /* COMPUTE_CAPABILITY_MINOR */
    case 97:
      *pi = FK_SMEM_PER_BLOCK_OPTIN;
      break; /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 81:
      *pi = 233472;
      break; /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 16:
      *pi = 132;
      break; /* MULTIPROCESSOR_COUNT */
    case 8:
      *pi = FK_SMEM_PER_BLOCK;
      break; /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10:
      *pi = 32;
      break; /* WARP_SIZE */
    default:
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Contexts: one static primary context per device. */

FK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&g_lock);
  g_ctx[dev].retain_count++;
  pthread_mutex_unlock(&g_lock);
  *pctx = &g_ctx[dev];
  return CUDA_SUCCESS;
}

static CUresult primary_ctx_release(CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&g_lock);
  if (g_ctx[dev].retain_count > 0) g_ctx[dev].retain_count--;
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

/* cuda.h maps cuDevicePrimaryCtxRelease to the _v2 symbol; export both so a
 * launcher resolving either name finds it. */
FK_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_ctx_release(dev); }
FK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_ctx_release(dev); }

FK_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current_ctx();
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  /* As documented for the driver: replace the top of the stack, push when
   * the stack is empty, and treat NULL as a pop. */
  if (ctx == NULL) {
    if (t_ctx_depth > 0) t_ctx_depth--;
    return CUDA_SUCCESS;
  }
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx_depth == 0) t_ctx_depth = 1;
  t_ctx_stack[t_ctx_depth - 1] = ctx;
  return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext ctx) {
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx_depth >= FK_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
  t_ctx_stack[t_ctx_depth++] = ctx;
  return CUDA_SUCCESS;
}

static CUresult ctx_pop(CUcontext* pctx) {
  if (t_ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext top = t_ctx_stack[--t_ctx_depth];
  if (pctx) *pctx = top;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return ctx_push(ctx); }
FK_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return ctx_push(ctx); }
FK_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) { return ctx_pop(pctx); }
FK_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) { return ctx_pop(pctx); }

FK_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = current_ctx();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  *device = ctx_device(ctx);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Modules: real cubins (ELF64).  Parsing follows what the driver needs to
 * launch a kernel: the section header table, the section names, and the
 * per-kernel .nv.info.<name> attribute section. */

#define ELF_SHT_NOBITS 8

/* Size of an ELF image given only its start, as a loader must compute it.
 * The section header table is not necessarily last: cubins written by
 * ptxas put the program header table after it, so take the furthest end of
 * the header tables and of every section with file contents. */
static CUresult elf_image_size(const unsigned char* img, size_t* out) {
  if (memcmp(img, "\177ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  if (img[4] != 2 /* ELFCLASS64 */ || img[5] != 1 /* little endian */)
    return CUDA_ERROR_INVALID_IMAGE;
  unsigned long long phoff = rd64(img + 0x20);
  unsigned long long shoff = rd64(img + 0x28);
  unsigned int phentsize = rd16(img + 0x36), phnum = rd16(img + 0x38);
  unsigned int shentsize = rd16(img + 0x3a), shnum = rd16(img + 0x3c);
  if (shnum == 0 || shentsize < 64 || shoff < 64) return CUDA_ERROR_INVALID_IMAGE;
  if (shoff > FK_MAX_IMAGE || phoff > FK_MAX_IMAGE) return CUDA_ERROR_INVALID_IMAGE;
  unsigned long long end = shoff + (unsigned long long)shnum * shentsize;
  unsigned long long ph_end = phoff + (unsigned long long)phnum * phentsize;
  if (phnum && ph_end > end) end = ph_end;
  for (unsigned int i = 0; i < shnum; i++) {
    const unsigned char* sh = img + shoff + (unsigned long long)i * shentsize;
    if (rd32(sh + 4) == ELF_SHT_NOBITS) continue;
    unsigned long long off = rd64(sh + 0x18), size = rd64(sh + 0x20);
    if (off > FK_MAX_IMAGE || size > FK_MAX_IMAGE) return CUDA_ERROR_INVALID_IMAGE;
    if (off + size > end) end = off + size;
  }
  if (end > FK_MAX_IMAGE) return CUDA_ERROR_INVALID_IMAGE;
  *out = (size_t)end;
  return CUDA_SUCCESS;
}

/* Find a section by exact name inside the module's private copy. */
static int find_section(const struct fk_mod* m, const char* name, const unsigned char** data,
                        size_t* len) {
  const unsigned char* img = m->image;
  unsigned long long shoff = rd64(img + 0x28);
  unsigned int shentsize = rd16(img + 0x3a), shnum = rd16(img + 0x3c), shstrndx = rd16(img + 0x3e);
  if (shstrndx >= shnum) return 0;
  const unsigned char* strsh = img + shoff + (unsigned long long)shstrndx * shentsize;
  unsigned long long str_off = rd64(strsh + 0x18), str_size = rd64(strsh + 0x20);
  size_t want = strlen(name);
  for (unsigned int i = 0; i < shnum; i++) {
    const unsigned char* sh = img + shoff + (unsigned long long)i * shentsize;
    unsigned long long name_off = rd32(sh);
    if (name_off + want + 1 > str_size) continue;
    const char* sec_name = (const char*)img + str_off + name_off;
    if (memcmp(sec_name, name, want + 1) != 0) continue;
    *data = img + rd64(sh + 0x18);
    *len = (size_t)rd64(sh + 0x20);
    return 1;
  }
  return 0;
}

static int cmp_param(const void* a, const void* b) {
  unsigned int x = ((const struct fk_param*)a)->ordinal, y = ((const struct fk_param*)b)->ordinal;
  return x < y ? -1 : x > y;
}

#define EIFMT_NVAL 0x01
#define EIFMT_BVAL 0x02
#define EIFMT_HVAL 0x03
#define EIFMT_SVAL 0x04
#define EIATTR_KPARAM_INFO 0x17
#define EIATTR_CBANK_PARAM_SIZE 0x19

/* Parse .nv.info.<kernel>.  Each entry is {u8 format, u8 attribute, ...}.
 * NVAL, BVAL and HVAL entries all occupy 4 bytes (the 2 bytes after the
 * header hold nothing, one byte, or a u16): checked against cuobjdump,
 * which keeps the following entries aligned when an entry is rewritten as
 * NVAL.  SVAL entries are a u16 byte count followed by that many bytes. */
static CUresult parse_kernel_info(const unsigned char* d, size_t len, struct fk_func* f) {
  size_t pos = 0, cap = 0;
  int have_cbank = 0;
  while (pos + 4 <= len) {
    unsigned int fmt = d[pos], attr = d[pos + 1];
    const unsigned char* payload = d + pos + 2;
    size_t payload_len, next;
    if (fmt == EIFMT_NVAL || fmt == EIFMT_BVAL || fmt == EIFMT_HVAL) {
      payload_len = 2;
      next = pos + 4;
    } else if (fmt == EIFMT_SVAL) {
      payload_len = rd16(d + pos + 2);
      payload = d + pos + 4;
      next = pos + 4 + payload_len;
      if (next > len) return CUDA_ERROR_INVALID_IMAGE;
    } else {
      return CUDA_ERROR_INVALID_IMAGE;
    }
    if (attr == EIATTR_KPARAM_INFO && fmt == EIFMT_SVAL && payload_len >= 12) {
      /* u32 index, u16 ordinal, u16 offset, u32 flags (size in bits 18..31) */
      if ((size_t)f->nparams == cap) {
        cap = cap ? cap * 2 : 8;
        struct fk_param* grown = realloc(f->params, cap * sizeof *grown);
        if (!grown) return CUDA_ERROR_OUT_OF_MEMORY;
        f->params = grown;
      }
      struct fk_param* p = &f->params[f->nparams++];
      p->ordinal = rd16(payload + 4);
      p->offset = rd16(payload + 6);
      p->size = (rd32(payload + 8) >> 18) & 0x3fff;
    } else if (attr == EIATTR_CBANK_PARAM_SIZE && fmt == EIFMT_HVAL) {
      f->cbank_size = rd16(payload);
      have_cbank = 1;
    }
    pos = next;
  }
  if (f->nparams > 1) qsort(f->params, (size_t)f->nparams, sizeof *f->params, cmp_param);
  unsigned int extent = 0;
  for (int i = 0; i < f->nparams; i++) {
    const struct fk_param* p = &f->params[i];
    /* Ordinals index kernelParams, so they must be exactly 0..n-1. */
    if (p->ordinal != (unsigned int)i) return CUDA_ERROR_INVALID_IMAGE;
    if (p->offset + p->size > extent) extent = p->offset + p->size;
  }
  if (!have_cbank) f->cbank_size = extent;
  if (extent > f->cbank_size) return CUDA_ERROR_INVALID_IMAGE;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = current_ctx();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  size_t size = 0;
  CUresult r = elf_image_size(image, &size);
  if (r != CUDA_SUCCESS) return r;
  struct fk_mod* m = calloc(1, sizeof *m);
  unsigned char* copy = malloc(size);
  if (!m || !copy) {
    free(m);
    free(copy);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* Copy: the caller may free its buffer right after loading. */
  memcpy(copy, image, size);
  m->image = copy;
  m->size = size;
  m->digest = 0xcbf29ce484222325ULL; /* FNV-1a, 64-bit */
  for (size_t i = 0; i < size; i++) {
    m->digest = (m->digest ^ copy[i]) * 0x100000001b3ULL;
  }
  m->ctx = ctx;
  pthread_mutex_lock(&g_lock);
  m->next = g_modules;
  g_modules = m;
  g_num_module_loads++;
  pthread_mutex_unlock(&g_lock);
  *module = m;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleUnload(CUmodule mod) {
  pthread_mutex_lock(&g_lock);
  if (!valid_module(mod)) {
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  mod->unloaded = 1;
  g_num_module_unloads++;
  free(mod->image);
  mod->image = NULL;
  g_retained_bytes += sizeof *mod;
  for (const struct fk_func* f = mod->funcs; f; f = f->next)
    g_retained_bytes += sizeof *f + strlen(f->name) + 1 + (size_t)f->nparams * sizeof *f->params;
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule mod, const char* name) {
  if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&g_lock);
  if (!valid_module(mod)) {
    r = CUDA_ERROR_INVALID_HANDLE;
    goto out;
  }
  /* The driver hands back the same handle for repeated lookups. */
  for (struct fk_func* fn = mod->funcs; fn; fn = fn->next) {
    if (strcmp(fn->name, name) == 0) {
      *hfunc = fn;
      goto out;
    }
  }
  static const char prefix[] = ".nv.info.";
  size_t name_len = strlen(name);
  char* sec_name = malloc(sizeof prefix + name_len);
  if (!sec_name) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  memcpy(sec_name, prefix, sizeof prefix - 1);
  memcpy(sec_name + sizeof prefix - 1, name, name_len + 1);
  const unsigned char* info = NULL;
  size_t info_len = 0;
  int found = find_section(mod, sec_name, &info, &info_len);
  free(sec_name);
  if (!found) {
    r = CUDA_ERROR_NOT_FOUND;
    goto out;
  }
  struct fk_func* f = calloc(1, sizeof *f);
  if (!f || !(f->name = dup_str(name))) {
    free(f);
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  r = parse_kernel_info(info, info_len, f);
  if (r != CUDA_SUCCESS) {
    free(f->params);
    free(f->name);
    free(f);
    goto out;
  }
  f->mod = mod;
  f->next = mod->funcs;
  mod->funcs = f;
  *hfunc = f;
out:
  pthread_mutex_unlock(&g_lock);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Function attributes. */

static void log_func_attribute(const char* name, int attr, int value) {
  for (int i = 0; i < g_attr_log_len; i++) {
    if (g_attr_log[i].attr == attr && strcmp(g_attr_log[i].name, name) == 0) {
      g_attr_log[i].value = value;
      return;
    }
  }
  if (g_attr_log_len == g_attr_log_cap) {
    int cap = g_attr_log_cap ? g_attr_log_cap * 2 : 16;
    struct fk_attr_log* grown = realloc(g_attr_log, (size_t)cap * sizeof *grown);
    if (!grown) return;
    g_attr_log = grown;
    g_attr_log_cap = cap;
  }
  char* copy = dup_str(name);
  if (!copy) return;
  g_attr_log[g_attr_log_len].name = copy;
  g_attr_log[g_attr_log_len].attr = attr;
  g_attr_log[g_attr_log_len].value = value;
  g_attr_log_len++;
}

FK_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value) {
  if (attrib < 0 || attrib >= FK_MAX_FUNC_ATTR) return CUDA_ERROR_INVALID_VALUE;
  /* Asking for more dynamic shared memory than the opt-in limit fails on
   * the real device too; catching it here keeps CPU tests honest. */
  if (attrib == FK_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
      (value < 0 || value > FK_SMEM_PER_BLOCK_OPTIN))
    return CUDA_ERROR_INVALID_VALUE;
  /* The shared memory mode (oversized shared memory, sm_107 with newer
   * drivers) is unknown to an sm_90 driver: Triton >= 3.8 tries it first and
   * then opts in through MAX_DYNAMIC_SHARED_SIZE_BYTES, as on an H100. */
  if (attrib == FK_FUNC_SHARED_MEMORY_MODE) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  if (!valid_func(hfunc)) {
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  hfunc->attr_is_set[attrib] = 1;
  hfunc->attr_value[attrib] = value;
  log_func_attribute(hfunc->name, attrib, value);
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

/* CUDA 12.4: offset and size of parameter `index`, CUDA_ERROR_INVALID_VALUE past the last.
 * Each call that returns an error is counted (fkstub_param_info_failure_count), as
 * compute-sanitizer reports it as an API error. */
FK_EXPORT CUresult cuFuncGetParamInfo(CUfunction hfunc, size_t index, size_t* offset,
                                      size_t* size) {
  pthread_mutex_lock(&g_lock);
  CUresult r = CUDA_ERROR_INVALID_VALUE; /* null outputs, or an index past the last parameter */
  if (offset && size) {
    if (!valid_func(hfunc)) {
      r = CUDA_ERROR_INVALID_HANDLE;
    } else if (index < (size_t)hfunc->nparams) {
      *offset = hfunc->params[index].offset;
      *size = hfunc->params[index].size;
      r = CUDA_SUCCESS;
    }
  }
  if (r != CUDA_SUCCESS) g_num_param_info_failures++;
  pthread_mutex_unlock(&g_lock);
  return r;
}

/* The number of parameters the function declares. Drivers newer than CUDA 13.1 export it (13.1's
 * cuda.h does not declare it); fkstub_set_param_count_api(0) makes it answer
 * CUDA_ERROR_NOT_SUPPORTED, as a caller must expect of a driver that lacks it. */
FK_EXPORT CUresult cuFuncGetParamCount(CUfunction hfunc, size_t* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (g_param_count_api) {
    if (!valid_func(hfunc)) {
      r = CUDA_ERROR_INVALID_HANDLE;
    } else {
      *count = (size_t)hfunc->nparams;
      r = CUDA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return r;
}

FK_EXPORT CUresult cuFuncGetAttribute(int* pi, int attrib, CUfunction hfunc) {
  if (!pi || attrib < 0 || attrib >= FK_MAX_FUNC_ATTR) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  if (!valid_func(hfunc)) {
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  int v = 0;
  if (hfunc->attr_is_set[attrib]) {
    v = hfunc->attr_value[attrib];
  } else {
    switch (attrib) {
      case FK_FUNC_MAX_THREADS_PER_BLOCK:
        v = g_default_max_threads;
        break;
      case FK_FUNC_NUM_REGS:
        v = g_default_num_regs;
        break;
      case FK_FUNC_LOCAL_SIZE_BYTES:
        v = g_default_local_bytes;
        break;
      case FK_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        v = FK_SMEM_PER_BLOCK;
        break;
      case FK_FUNC_SHARED_SIZE_BYTES:
      default:
        v = 0;
        break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  *pi = v;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config) {
  pthread_mutex_lock(&g_lock);
  if (!valid_func(hfunc)) {
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  hfunc->cache_config = config;
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Launches. */

static int launch_result_override(void) {
  pthread_mutex_lock(&g_lock);
  int r = g_launch_result_override;
  pthread_mutex_unlock(&g_lock);
  if (r >= 0) return r;
  const char* s = getenv("FKSTUB_LAUNCH_RESULT");
  return s && *s ? atoi(s) : 0;
}

/* Mirrors the driver's limits for an sm_90 device. */
static int valid_dims(const unsigned int g[3], const unsigned int b[3]) {
  if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) return 0;
  if (g[0] > 0x7fffffffu || g[1] > 65535 || g[2] > 65535) return 0;
  if (b[0] > 1024 || b[1] > 1024 || b[2] > 64) return 0;
  return (unsigned long long)b[0] * b[1] * b[2] <= 1024;
}

/* Builds the parameter bank the driver would copy to the kernel's constant
 * bank: from kernelParams (one pointer per ordinal) or from the packed
 * buffer passed through `extra`. */
static CUresult build_param_bank(const struct fk_func* f, void** params, void** extra,
                                 unsigned char* raw) {
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  if (params) {
    for (int k = 0; k < f->nparams; k++) {
      if (!params[k]) return CUDA_ERROR_INVALID_VALUE;
      memcpy(raw + f->params[k].offset, params[k], f->params[k].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra) {
    const void* buf = NULL;
    const size_t* buf_size = NULL;
    for (size_t i = 0; extra[i] != NULL /* CU_LAUNCH_PARAM_END */; i += 2) {
      if (extra[i] == (void*)1 /* CU_LAUNCH_PARAM_BUFFER_POINTER */)
        buf = extra[i + 1];
      else if (extra[i] == (void*)2 /* CU_LAUNCH_PARAM_BUFFER_SIZE */)
        buf_size = extra[i + 1];
      else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!buf || !buf_size || *buf_size > f->cbank_size) return CUDA_ERROR_INVALID_VALUE;
    memcpy(raw, buf, *buf_size);
    return CUDA_SUCCESS;
  }
  return f->nparams == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult do_launch(CUfunction f, const unsigned int grid[3], const unsigned int block[3],
                          unsigned int smem, CUstream stream, void** params, void** extra,
                          int is_ex, const CUlaunchAttribute* attrs, unsigned int num_attrs) {
  /* An injected failure must look like a failed launch: nothing recorded. */
  int forced = launch_result_override();
  if (forced != 0) return forced;

  CUresult r = CUDA_SUCCESS;
  unsigned char* raw = NULL;
  struct fk_param* layout = NULL;
  char* name = NULL;
  pthread_mutex_lock(&g_lock);
  if (!valid_func(f)) {
    r = CUDA_ERROR_INVALID_HANDLE;
    goto out;
  }
  CUcontext cur = current_ctx();
  if (!cur) {
    r = CUDA_ERROR_INVALID_CONTEXT;
    goto out;
  }
  /* A function belongs to the context its module was loaded in; the real
   * driver rejects it from any other context (e.g. another device). */
  if (cur != f->mod->ctx) {
    r = CUDA_ERROR_INVALID_HANDLE;
    goto out;
  }
  if (!valid_dims(grid, block)) {
    r = CUDA_ERROR_INVALID_VALUE;
    goto out;
  }
  /* A block of more threads than the function allows (its registers) does not launch. */
  if ((unsigned long long)block[0] * block[1] * block[2] >
      (unsigned long long)g_default_max_threads) {
    r = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    goto out;
  }
  /* More than 48 KiB of dynamic shared memory needs the opt-in attribute. */
  int smem_limit = f->attr_is_set[FK_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES]
                       ? f->attr_value[FK_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES]
                       : FK_SMEM_PER_BLOCK;
  if (smem > (unsigned int)smem_limit) {
    r = CUDA_ERROR_INVALID_VALUE;
    goto out;
  }
  raw = calloc(1, f->cbank_size ? f->cbank_size : 1);
  layout = malloc((size_t)(f->nparams ? f->nparams : 1) * sizeof *layout);
  name = dup_str(f->name);
  if (!raw || !layout || !name) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  r = build_param_bank(f, params, extra, raw);
  if (r != CUDA_SUCCESS) goto out;

  g_num_launches++;
  if (g_num_recorded < FK_MAX_LAUNCHES) {
    struct fk_launch* rec = &g_launches[g_num_recorded++];
    memset(rec, 0, sizeof *rec);
    rec->name = name;
    rec->device = ctx_device(f->mod->ctx);
    memcpy(rec->grid, grid, sizeof rec->grid);
    memcpy(rec->block, block, sizeof rec->block);
    rec->shared_mem = smem;
    rec->stream = (unsigned long long)(uintptr_t)stream;
    rec->image = f->mod->digest;
    rec->is_ex = is_ex;
    rec->num_attrs = num_attrs > FK_MAX_ATTRS ? FK_MAX_ATTRS : (int)num_attrs;
    for (int i = 0; i < rec->num_attrs; i++) {
      rec->attr_id[i] = attrs[i].id;
      memcpy(rec->attr_value[i], attrs[i].value.raw, FK_ATTR_BYTES);
    }
    rec->num_params = f->nparams;
    if (f->nparams) memcpy(layout, f->params, (size_t)f->nparams * sizeof *layout);
    rec->params = layout;
    rec->raw_size = f->cbank_size;
    rec->raw = raw;
    name = NULL;
    layout = NULL;
    raw = NULL;
  }
out:
  pthread_mutex_unlock(&g_lock);
  free(raw);
  free(layout);
  free(name);
  return r;
}

FK_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void** kernelParams, void** extra) {
  const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
  const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
  return do_launch(f, grid, block, sharedMemBytes, hStream, kernelParams, extra, 0, NULL, 0);
}

FK_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                    void** extra) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && !config->attrs) return CUDA_ERROR_INVALID_VALUE;
  const unsigned int grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  const unsigned int block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  return do_launch(f, grid, block, config->sharedMemBytes, config->hStream, kernelParams, extra, 1,
                   config->attrs, config->numAttrs);
}

/* ------------------------------------------------------------------------ */
/* Errors and the few remaining queries. */

struct fk_error {
  int code;
  const char* name;
  const char* text;
};

static const struct fk_error k_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct fk_error* find_error(CUresult code) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
    if (k_errors[i].code == code) return &k_errors[i];
  return NULL;
}

/* Unknown codes: the real driver sets *pStr to NULL and returns
 * CUDA_ERROR_INVALID_VALUE; callers must cope with that, so do the same. */
FK_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const struct fk_error* e = find_error(error);
  *pStr = e ? e->name : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const struct fk_error* e = find_error(error);
  *pStr = e ? e->text : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Host memory stands in for device memory here (CPU tensors play device
 * tensors), so every nonzero address is its own device pointer: the query
 * Triton's launcher makes for each pointer argument (DEVICE_POINTER, 3)
 * answers with the address; other attributes are unsupported. */
FK_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (attribute != 3) return CUDA_ERROR_NOT_SUPPORTED;
  if (ptr == 0) return CUDA_ERROR_INVALID_VALUE;
  memcpy(data, &ptr, sizeof ptr);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, int* captureStatus) {
  (void)hStream;
  if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
  *captureStatus = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
  return CUDA_SUCCESS;
}

/* Context limits (printf FIFO, stack size, ...): one value per limit id, as
 * Triton's launcher only sets and reads them back. */
#define FK_MAX_LIMITS 16
static size_t g_limits[FK_MAX_LIMITS];

FK_EXPORT CUresult cuCtxSetLimit(int limit, size_t value) {
  if (limit < 0 || limit >= FK_MAX_LIMITS) return CUDA_ERROR_INVALID_VALUE;
  if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&g_lock);
  g_limits[limit] = value;
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetLimit(size_t* value, int limit) {
  if (!value || limit < 0 || limit >= FK_MAX_LIMITS) return CUDA_ERROR_INVALID_VALUE;
  if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&g_lock);
  *value = g_limits[limit];
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Tensor maps (TMA descriptors).  cuTensorMapEncodeTiled checks its inputs
 * with the rules the CUDA driver API documents for it, then writes a
 * readable encoding of them instead of the hardware format, so tests can
 * compare the 128 bytes a launcher passes and decode what was encoded:
 *
 *   0..3    "FKTM"                     16..23  global address
 *   4       data type                  24..63  globalDim[5]     (u64, innermost first)
 *   5       rank                       64..95  globalStrides[4] (u64 bytes, dims 1..4)
 *   6..9    interleave, swizzle,       96..115 boxDim[5]        (u32)
 *           L2 promotion, OOB fill     116..120 elementStrides[5] (u8)
 *
 * Unused entries and bytes are zero. */

#define FK_TENSOR_MAP_BYTES 128
static int g_num_tensor_map_encodes;

/* Bytes per element of each CUtensorMapDataType (cuda.h order); the packed
 * 4- and 6-bit types (13..15) count as one byte. */
static const unsigned char k_tma_elem_bytes[16] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, 1, 1, 1};

static int is_float_tma_type(int t) { return t >= 6 && t <= 12; }

FK_EXPORT CUresult cuTensorMapEncodeTiled(void* tensorMap, int dataType, unsigned int rank,
                                          void* globalAddress, const unsigned long long* globalDim,
                                          const unsigned long long* globalStrides,
                                          const unsigned int* boxDim,
                                          const unsigned int* elementStrides, int interleave,
                                          int swizzle, int l2Promotion, int oobFill) {
  if (!tensorMap || ((uintptr_t)tensorMap & 63) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (dataType < 0 || dataType > 15 || rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  if (interleave < 0 || interleave > 2 || swizzle < 0 || swizzle > 3 || l2Promotion < 0 ||
      l2Promotion > 3 || oobFill < 0 || oobFill > 1)
    return CUDA_ERROR_INVALID_VALUE;
  if (interleave != 0 && rank < 3) return CUDA_ERROR_INVALID_VALUE;
  if (!globalDim || !boxDim || !elementStrides || (rank > 1 && !globalStrides))
    return CUDA_ERROR_INVALID_VALUE;
  uintptr_t address = (uintptr_t)globalAddress;
  if (address == 0 || (address & (interleave == 2 ? 31 : 15)) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (oobFill == 1 && !is_float_tma_type(dataType)) return CUDA_ERROR_INVALID_VALUE;
  unsigned int elem = k_tma_elem_bytes[dataType];
  for (unsigned int i = 0; i < rank; i++) {
    if (globalDim[i] == 0 || globalDim[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (boxDim[i] == 0 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    if (elementStrides[i] == 0 || elementStrides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned int i = 0; i + 1 < rank; i++)
    if (globalStrides[i] % 16 != 0 || globalStrides[i] >= (1ull << 40))
      return CUDA_ERROR_INVALID_VALUE;
  if (interleave == 0 && dataType < 13) {
    unsigned int inner = boxDim[0] * elem;
    if (inner % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
    static const unsigned int span[4] = {0, 32, 64, 128};
    if (swizzle != 0 && inner > span[swizzle]) return CUDA_ERROR_INVALID_VALUE;
  }

  unsigned char out[FK_TENSOR_MAP_BYTES];
  memset(out, 0, sizeof out);
  memcpy(out, "FKTM", 4);
  out[4] = (unsigned char)dataType;
  out[5] = (unsigned char)rank;
  out[6] = (unsigned char)interleave;
  out[7] = (unsigned char)swizzle;
  out[8] = (unsigned char)l2Promotion;
  out[9] = (unsigned char)oobFill;
  unsigned long long a = (unsigned long long)address;
  memcpy(out + 16, &a, 8);
  for (unsigned int i = 0; i < rank; i++) {
    memcpy(out + 24 + 8 * i, &globalDim[i], 8);
    memcpy(out + 96 + 4 * i, &boxDim[i], 4);
    out[116 + i] = (unsigned char)elementStrides[i];
  }
  for (unsigned int i = 0; i + 1 < rank; i++) memcpy(out + 64 + 8 * i, &globalStrides[i], 8);
  memcpy(tensorMap, out, sizeof out);
  pthread_mutex_lock(&g_lock);
  g_num_tensor_map_encodes++;
  pthread_mutex_unlock(&g_lock);
  return CUDA_SUCCESS;
}

/* Im2col tensor maps are not modelled: callers see the driver refuse them. */
FK_EXPORT CUresult cuTensorMapEncodeIm2col(void) { return CUDA_ERROR_NOT_SUPPORTED; }

/* ------------------------------------------------------------------------ */
/* Recording accessors for tests (fkstub_ prefix).  Getters taking a launch
 * index return -1 for an index that was not recorded. */

static void free_launches_locked(void) {
  for (int i = 0; i < g_num_recorded; i++) {
    free(g_launches[i].name);
    free(g_launches[i].params);
    free(g_launches[i].raw);
  }
  memset(g_launches, 0, sizeof g_launches);
  g_num_recorded = 0;
}

/* Clears recorded launches, the launch, module-load, -unload and failed cuFuncGetParamInfo
 * counters, any injected launch result or function defaults, and turns cuFuncGetParamCount back
 * on.  Loaded modules, functions, their attributes and
 * the per-name attribute log stay: they are driver state, not recordings. */
FK_EXPORT void fkstub_reset(void) {
  pthread_mutex_lock(&g_lock);
  free_launches_locked();
  g_num_launches = 0;
  g_num_module_loads = 0;
  g_num_module_unloads = 0;
  g_num_tensor_map_encodes = 0;
  g_launch_result_override = -1;
  g_default_max_threads = FK_DEFAULT_MAX_THREADS;
  g_default_num_regs = FK_DEFAULT_NUM_REGS;
  g_default_local_bytes = 0;
  g_param_count_api = 1;
  g_num_param_info_failures = 0;
  pthread_mutex_unlock(&g_lock);
}

/* cuFuncGetParamCount answers (1, the default) or returns CUDA_ERROR_NOT_SUPPORTED (0), until
 * the next fkstub_reset. */
FK_EXPORT void fkstub_set_param_count_api(int enabled) {
  pthread_mutex_lock(&g_lock);
  g_param_count_api = enabled != 0;
  pthread_mutex_unlock(&g_lock);
}

/* cuFuncGetParamInfo calls that returned an error since the last reset. */
FK_EXPORT int fkstub_param_info_failure_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_param_info_failures;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Successful cuTensorMapEncodeTiled calls since the last reset. */
FK_EXPORT int fkstub_tensor_map_encode_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_tensor_map_encodes;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Successful launches since the last reset (can exceed the recorded ones). */
FK_EXPORT int fkstub_launch_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_launches;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Launches stored and readable through the getters (at most 4096). */
FK_EXPORT int fkstub_recorded_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_recorded;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Bytes the stand-in keeps for unloaded modules (their handles stay valid so that a stale one
 * is detected rather than reused): the module and function records, names and parameter
 * tables, counted without malloc's own overhead. A memory test subtracts them. */
FK_EXPORT unsigned long long fkstub_retained_bytes(void) {
  pthread_mutex_lock(&g_lock);
  unsigned long long n = g_retained_bytes;
  pthread_mutex_unlock(&g_lock);
  return n;
}

FK_EXPORT int fkstub_module_load_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_module_loads;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Successful cuModuleUnload calls since the last reset. */
FK_EXPORT int fkstub_module_unload_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_num_module_unloads;
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* Make every launch return `code` without recording (0 restores normal
 * launches).  Until called, FKSTUB_LAUNCH_RESULT from the environment is
 * used if set. */
FK_EXPORT void fkstub_set_launch_result(int code) {
  pthread_mutex_lock(&g_lock);
  g_launch_result_override = code < 0 ? 0 : code;
  pthread_mutex_unlock(&g_lock);
}

/* What every function reports, until the next reset, for CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
 * NUM_REGS and LOCAL_SIZE_BYTES (a real driver reads them from the cubin); launches of blocks
 * larger than `max_threads` fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. */
FK_EXPORT void fkstub_set_function_defaults(int max_threads, int num_regs, int local_bytes) {
  pthread_mutex_lock(&g_lock);
  g_default_max_threads = max_threads;
  g_default_num_regs = num_regs;
  g_default_local_bytes = local_bytes;
  pthread_mutex_unlock(&g_lock);
}

/* Last value set through cuFuncSetAttribute on any function named `name`,
 * or -1 if none was set. */
FK_EXPORT int fkstub_func_attribute(const char* name, int attr) {
  int v = -1;
  if (!name) return v;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_attr_log_len; i++)
    if (g_attr_log[i].attr == attr && strcmp(g_attr_log[i].name, name) == 0)
      v = g_attr_log[i].value;
  pthread_mutex_unlock(&g_lock);
  return v;
}

/* Looks up a record; on success returns with g_lock held. */
static const struct fk_launch* lock_launch(int i) {
  pthread_mutex_lock(&g_lock);
  if (i < 0 || i >= g_num_recorded) {
    pthread_mutex_unlock(&g_lock);
    return NULL;
  }
  return &g_launches[i];
}

/* Copies the kernel name (NUL-terminated, truncated to cap) and returns its
 * full length, so a caller can retry with a larger buffer. */
FK_EXPORT int fkstub_launch_name(int i, char* buf, int cap) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int len = (int)strlen(l->name);
  if (buf && cap > 0) {
    int n = len < cap - 1 ? len : cap - 1;
    memcpy(buf, l->name, (size_t)n);
    buf[n] = '\0';
  }
  pthread_mutex_unlock(&g_lock);
  return len;
}

FK_EXPORT int fkstub_launch_device(int i) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int d = l->device;
  pthread_mutex_unlock(&g_lock);
  return d;
}

/* grid and block each receive 3 values (x, y, z). */
FK_EXPORT int fkstub_launch_dims(int i, unsigned int* grid, unsigned int* block) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  if (grid) memcpy(grid, l->grid, sizeof l->grid);
  if (block) memcpy(block, l->block, sizeof l->block);
  pthread_mutex_unlock(&g_lock);
  return 0;
}

FK_EXPORT int fkstub_launch_shared_mem(int i, unsigned int* out) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  if (out) *out = l->shared_mem;
  pthread_mutex_unlock(&g_lock);
  return 0;
}

FK_EXPORT int fkstub_launch_stream(int i, unsigned long long* out) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  if (out) *out = l->stream;
  pthread_mutex_unlock(&g_lock);
  return 0;
}

/* The digest (FNV-1a, 64-bit) of the module image whose function launch i ran. */
FK_EXPORT int fkstub_launch_image(int i, unsigned long long* out) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  *out = l->image;
  pthread_mutex_unlock(&g_lock);
  return 0;
}

/* 1 for cuLaunchKernelEx, 0 for cuLaunchKernel. */
FK_EXPORT int fkstub_launch_is_ex(int i) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int v = l->is_ex;
  pthread_mutex_unlock(&g_lock);
  return v;
}

/* Number of launch attributes recorded (at most 8). */
FK_EXPORT int fkstub_launch_num_attrs(int i) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int v = l->num_attrs;
  pthread_mutex_unlock(&g_lock);
  return v;
}

/* Attribute j: its id and the 64 raw bytes of its value union. */
FK_EXPORT int fkstub_launch_attr(int i, int j, unsigned int* id, unsigned char* value64) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  if (j < 0 || j >= l->num_attrs) {
    pthread_mutex_unlock(&g_lock);
    return -1;
  }
  if (id) *id = l->attr_id[j];
  if (value64) memcpy(value64, l->attr_value[j], FK_ATTR_BYTES);
  pthread_mutex_unlock(&g_lock);
  return 0;
}

/* Number of kernel parameters (from the cubin's KPARAM_INFO entries). */
FK_EXPORT int fkstub_launch_num_params(int i) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int v = l->num_params;
  pthread_mutex_unlock(&g_lock);
  return v;
}

/* Offset and size in the parameter bank of the parameter with ordinal k. */
FK_EXPORT int fkstub_launch_param(int i, int k, unsigned int* offset, unsigned int* size) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  if (k < 0 || k >= l->num_params) {
    pthread_mutex_unlock(&g_lock);
    return -1;
  }
  if (offset) *offset = l->params[k].offset;
  if (size) *size = l->params[k].size;
  pthread_mutex_unlock(&g_lock);
  return 0;
}

/* Copies up to cap bytes of the parameter bank (CBANK_PARAM_SIZE bytes,
 * unused padding zeroed) and returns its full size. */
FK_EXPORT int fkstub_launch_raw(int i, void* buf, int cap) {
  const struct fk_launch* l = lock_launch(i);
  if (!l) return -1;
  int size = (int)l->raw_size;
  if (buf && cap > 0) memcpy(buf, l->raw, (size_t)(size < cap ? size : cap));
  pthread_mutex_unlock(&g_lock);
  return size;
}
