/* rlx-conformance (backends/mlx/_nvrtc_pch.py): NVRTC's automatic precompiled headers for MLX's
 * CUDA JIT, loaded RTLD_GLOBAL into the harness's worker processes before MLX (or LD_PRELOADed):
 * its two functions then come before libnvrtc's in the lookup of MLX's calls.
 *
 * MLX builds every fused kernel with nvrtcCompileProgram; each compile parses the same CUDA and
 * CCCL headers again (3-4 s a kernel on an H100 host with 15 workers). NVRTC >= 12.8 can keep a
 * precompiled header of that prefix (--pch) and reuse it in the process's later compiles. MLX
 * passes no such option, so this library does, standing in front of two NVRTC functions:
 *
 * - nvrtcCreateProgram: a program name over 80 bytes becomes its first 64 bytes and a 64-bit
 *   FNV-1a hash of the whole. NVRTC names its PCH file after the program, MLX names a fused
 *   kernel's program after the whole fused graph, and past 255 bytes the PCH cannot be written
 *   ("File name too long", a failed compile). The name appears in diagnostics only.
 * - nvrtcCompileProgram: MLX's options plus "--pch --pch-dir=$RLX_CONFORMANCE_NVRTC_PCH_DIR/<pid>"
 *   when that variable is set and NVRTC is 12.8 or newer (else MLX's options unchanged). A PCH is
 *   about 157 MB, one a process, and the harness's ended workers left theirs behind (a 64 GB disk
 *   filled in 2,524 compiles), so each process first removes the folders of processes that no
 *   longer exist.
 *
 * The real functions are found through the already-loaded libnvrtc by soname: Python loads MLX's
 * extension RTLD_LOCAL, so libnvrtc is not in the global scope and dlsym(RTLD_NEXT) finds nothing.
 * With $RLX_CONFORMANCE_NVRTC_LOG set, one line a compile (PCH or not): start, seconds, result,
 * option count, process id, and the FNV-1a hash of the program's whole name (the last program this
 * thread created: MLX creates and compiles in one call), so that the same kernel compiled by two
 * workers at once shows as one hash under two process ids. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
typedef nvrtcResult (*create_fn)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
typedef nvrtcResult (*compile_fn)(nvrtcProgram, int, const char *const *);
typedef nvrtcResult (*destroy_fn)(nvrtcProgram *);
typedef nvrtcResult (*version_fn)(int *, int *);

#define NVRTC_INTERNAL_ERROR 11
#define MAX_OPTIONS 256

static __thread unsigned long long last_name_hash;

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int n_headers,
                               const char *const *headers, const char *const *include_names);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char *const *options);

static void *real_symbol(const char *symbol, void *self) {
  void *f = dlsym(RTLD_NEXT, symbol);
  if (f && f != self) return f;
  const char *sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
  for (int i = 0; sonames[i]; i++) {
    void *h = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(sonames[i], RTLD_NOW);
    if (!h) continue;
    f = dlsym(h, symbol);
    if (f && f != self) return f;
  }
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void remove_folder(const char *path) { /* a PCH folder holds files only */
  DIR *d = opendir(path);
  if (!d) return;
  char file[4864];
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    unlink(file);
  }
  closedir(d);
  rmdir(path);
}

static void sweep_dead(const char *root) { /* folders named after processes that are gone */
  DIR *d = opendir(root);
  if (!d) return;
  char path[4352];
  for (struct dirent *e; (e = readdir(d));) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    snprintf(path, sizeof path, "%s/%s", root, e->d_name);
    remove_folder(path);
  }
  closedir(d);
}

static char pch_option[4200];
static pthread_once_t pch_once = PTHREAD_ONCE_INIT;

static void find_pch_dir(void) {
  const char *root = getenv("RLX_CONFORMANCE_NVRTC_PCH_DIR");
  version_fn version = (version_fn)real_symbol("nvrtcVersion", NULL);
  int major = 0, minor = 0;
  if (!root || !*root || !version || version(&major, &minor) != 0) return;
  if (major < 12 || (major == 12 && minor < 8)) return;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%d", root, (int)getpid());
  mkdir(root, 0755);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) return;
  sweep_dead(root);
  snprintf(pch_option, sizeof pch_option, "--pch-dir=%s", dir);
}

/* "--pch-dir=<root>/<pid>" once NVRTC >= 12.8 and the variable are there; else NULL. Worked out
 * once a process (pthread_once: MLX may compile from more than one thread). */
static const char *pch_dir_option(void) {
  pthread_once(&pch_once, find_pch_dir);
  return pch_option[0] ? pch_option : NULL;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int n_headers,
                               const char *const *headers, const char *const *include_names) {
  static create_fn real;
  if (!real) real = (create_fn)real_symbol("nvrtcCreateProgram", (void *)nvrtcCreateProgram);
  if (!real) return NVRTC_INTERNAL_ERROR;
  char short_name[96];
  unsigned long long h = 1469598103934665603ULL;
  for (const char *c = name ? name : ""; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
  last_name_hash = h;
  if (name && strlen(name) > 80) {
    snprintf(short_name, sizeof short_name, "%.64s_%016llx", name, h);
    name = short_name;
  }
  return real(prog, src, name, n_headers, headers, include_names);
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char *const *options) {
  static compile_fn real;
  if (!real) real = (compile_fn)real_symbol("nvrtcCompileProgram", (void *)nvrtcCompileProgram);
  if (!real) return NVRTC_INTERNAL_ERROR;
  const char *dir_option = pch_dir_option();
  const char *all[MAX_OPTIONS];
  int k = 0;
  if (n >= 0 && n <= MAX_OPTIONS - 2) {
    for (; k < n; k++) all[k] = options[k];
    if (dir_option) {
      all[k++] = "--pch";
      all[k++] = dir_option;
    }
    options = all;
    n = k;
  }
  double start = now();
  nvrtcResult r = real(prog, n, options);
  const char *log = getenv("RLX_CONFORMANCE_NVRTC_LOG");  /* benchmarks/bench_nvrtc_pch.py */
  FILE *f = log && *log ? fopen(log, "a") : NULL;
  if (f) {
    fprintf(f, "%.6f %.6f %d %d %d %016llx\n", start, now() - start, r, n, (int)getpid(), last_name_hash);
    fclose(f);
  }
  return r;
}

/* For _nvrtc_pch.py's check on this machine: 0 when a program compiles through this library with
 * the PCH options (found the real NVRTC, NVRTC >= 12.8, the folder writable); else a non-zero
 * code: 1 no NVRTC, 2 no PCH (old NVRTC or no folder), 3 the compile failed. */
int rlx_nvrtc_pch_probe(void) {
  destroy_fn destroy = (destroy_fn)real_symbol("nvrtcDestroyProgram", NULL);
  if (!destroy || !real_symbol("nvrtcCompileProgram", (void *)nvrtcCompileProgram)) return 1;
  if (!pch_dir_option()) return 2;
  nvrtcProgram prog = NULL;
  if (nvrtcCreateProgram(&prog, "extern \"C\" __global__ void rlx_probe(float *x) { x[0] += 1.0f; }\n",
                         "rlx_nvrtc_pch_probe.cu", 0, NULL, NULL) != 0)
    return 3;
  nvrtcResult r = nvrtcCompileProgram(prog, 0, NULL);
  destroy(&prog);
  return r == 0 ? 0 : 3;
}
