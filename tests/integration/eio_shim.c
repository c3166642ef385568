// SPDX-License-Identifier: Apache-2.0
// A failing disk for tests, preloaded (LD_PRELOAD) into the programs a test starts. For a file
// whose path ends with $SOLAR_TEST_EIO_SUFFIX:
// - with $SOLAR_TEST_EIO_AFTER set, its reads fail with EIO once that many of them have
//   succeeded in this process, as a local disk's bad sectors do;
// - with $SOLAR_TEST_ENOSPC_AFTER set, its writes fail with ENOSPC once that many of them have
//   succeeded, as a disk filling up mid-run does beneath a preallocated file on a
//   copy-on-write or thin-provisioned filesystem (btrfs, ZFS, an overcommitted volume).
// Other files, and every file without the variables set, are read and written as usual.
// test_local_tier.py builds it with the system's C compiler and counts what the agent made of it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static atomic_long reads_done, writes_done;

static int is_target(int fd) {
  const char* suffix = getenv("SOLAR_TEST_EIO_SUFFIX");
  if (!suffix || !*suffix) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  const size_t len = strlen(suffix);
  return (size_t)n >= len && strcmp(path + n - len, suffix) == 0;
}

static int fails(int fd) {  // a read
  const char* after = getenv("SOLAR_TEST_EIO_AFTER");
  return after && is_target(fd) && atomic_fetch_add(&reads_done, 1) >= atol(after);
}

static int full(int fd) {  // a write
  const char* after = getenv("SOLAR_TEST_ENOSPC_AFTER");
  return after && is_target(fd) && atomic_fetch_add(&writes_done, 1) >= atol(after);
}

typedef ssize_t (*pread_fn)(int, void*, size_t, off_t);
typedef ssize_t (*preadv_fn)(int, const struct iovec*, int, off_t);

ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  static pread_fn next;
  if (!next) next = (pread_fn)dlsym(RTLD_NEXT, "pread");
  if (fails(fd)) {
    errno = EIO;
    return -1;
  }
  return next(fd, buf, count, offset);
}

ssize_t pread64(int fd, void* buf, size_t count, off_t offset) {
  static pread_fn next;
  if (!next) next = (pread_fn)dlsym(RTLD_NEXT, "pread64");
  if (fails(fd)) {
    errno = EIO;
    return -1;
  }
  return next(fd, buf, count, offset);
}

ssize_t preadv(int fd, const struct iovec* iov, int n, off_t offset) {
  static preadv_fn next;
  if (!next) next = (preadv_fn)dlsym(RTLD_NEXT, "preadv");
  if (fails(fd)) {
    errno = EIO;
    return -1;
  }
  return next(fd, iov, n, offset);
}

typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);
typedef ssize_t (*pwritev_fn)(int, const struct iovec*, int, off_t);

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  static pwrite_fn next;
  if (!next) next = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  if (full(fd)) {
    errno = ENOSPC;
    return -1;
  }
  return next(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  static pwrite_fn next;
  if (!next) next = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  if (full(fd)) {
    errno = ENOSPC;
    return -1;
  }
  return next(fd, buf, count, offset);
}

ssize_t pwritev(int fd, const struct iovec* iov, int n, off_t offset) {
  static pwritev_fn next;
  if (!next) next = (pwritev_fn)dlsym(RTLD_NEXT, "pwritev");
  if (full(fd)) {
    errno = ENOSPC;
    return -1;
  }
  return next(fd, iov, n, offset);
}
