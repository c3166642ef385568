// SPDX-License-Identifier: Apache-2.0
/* libsolar_preload.so: serves an unmodified rank's reads of the dataset's files from the node
 * agent's shared buffer (job-transparent mode). LD_PRELOAD it; see interpose/README.md.
 *
 * Only pread-family reads (and read(2) at the fd's position) of fds that are exactly a file of the agent's file table (the same
 * dev, ino, size, mtime and ctime), at byte ranges of samples that the agent's index marks
 * resident, are served from the mapping; everything else goes to the real libc function
 * unchanged. One file ($SOLAR_DATASET = FILE.h5[:/name]) is a table of one; a directory, a
 * glob or @LIST names many. Plain C, libc only: no locks and no malloc on the hot path;
 * symbols are resolved in the constructor.
 */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE /* we define the functions the fortify wrappers would inline */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "solar/transparent.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define EXPORT __attribute__((visibility("default")))
#define SOLAR_PROTO_MAGIC 0x524c4f53u /* "SOLR", solar/protocol.h */

#ifndef __OPEN_NEEDS_MODE
#define __OPEN_NEEDS_MODE(f) (((f) & O_CREAT) != 0 || ((f) & O_TMPFILE) == O_TMPFILE)
#endif

/* The fortify entry points glibc's headers declare only under _FORTIFY_SOURCE. */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen);
ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen);
ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen);

/* ---- the real functions ---------------------------------------------------------------- */

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real___open_2)(const char *, int);
static int (*real___open64_2)(const char *, int);
static int (*real___openat_2)(int, const char *, int);
static int (*real___openat64_2)(int, const char *, int);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_pread64)(int, void *, size_t, off64_t);
static ssize_t (*real___pread_chk)(int, void *, size_t, off_t, size_t);
static ssize_t (*real___pread64_chk)(int, void *, size_t, off64_t, size_t);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real___read_chk)(int, void *, size_t, size_t);
static int (*real_close)(int);
static int (*real_close_range)(unsigned int, unsigned int, int);
static void (*real_closefrom)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

/* Fallbacks for calls made before the constructor ran (another library's constructor, a
 * malloc that opens files): raw system calls, never a dlsym from inside a wrapper. */
static int sys_openat(int dirfd, const char *path, int flags, mode_t mode) {
  return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}
static ssize_t sys_pread(int fd, void *buf, size_t n, off_t off) {
  return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}
static ssize_t sys_read(int fd, void *buf, size_t n) { return syscall(SYS_read, fd, buf, n); }
static int sys_close(int fd) { return (int)syscall(SYS_close, fd); }
static int sys_close_range(unsigned int first, unsigned int last, int flags) {
  return (int)syscall(SYS_close_range, first, last, flags);
}
static int sys_dup2(int oldfd, int newfd) {
  if (oldfd == newfd) return fcntl(oldfd, F_GETFD) < 0 ? -1 : newfd;
  return (int)syscall(SYS_dup3, oldfd, newfd, 0);
}
static int sys_dup3(int oldfd, int newfd, int flags) {
  return (int)syscall(SYS_dup3, oldfd, newfd, flags);
}
static int close_fd(int fd) { return real_close ? real_close(fd) : sys_close(fd); }

/* ---- configuration and process state ------------------------------------------------------ */

enum { FD_MAX = 65536 };
/* fds[] values: FD_NONE, or (file + 1) << 2 | FD_PLAIN or FD_DIRECT, file the fd's index in the
 * file table; file + 1 == 0: a dataset candidate opened before this process was attached (or
 * while another thread attached), looked up at its first read. */
enum { FD_NONE = 0, FD_PLAIN = 1, FD_DIRECT = 2, FD_MODE = 3 };
enum { FILES_MAX = 1 << 29 }; /* file + 1 fits in fds[]' upper 30 bits */
enum { X_UNTRIED, X_ATTACHING, X_ATTACHED, X_FAILED }; /* xstate values */
/* What $SOLAR_DATASET's file part names: one file, or many (a directory, a glob, @LIST).
 * SPEC_FILE_OR_DIR: told apart by a stat of the path, once, at the first open it concerns. */
enum { SPEC_FILE, SPEC_DIR, SPEC_GLOB, SPEC_LIST, SPEC_FILE_OR_DIR };

static int active;                 /* 0: inert, every wrapper is the real function */
static int verbose;                /* $SOLAR_VERBOSE set */
static pid_t my_pid;               /* getpid() of this process: differs in a vfork child */
static char ds_path[PATH_MAX];     /* the spec's file part: the file, directory, glob or list */
static const char *ds_base;        /* its basename, inside ds_path (a glob's: the pattern) */
static int spec_said;              /* SPEC_* as the spec's text says */
static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static _Atomic int ds_known;       /* ds_kind (and for a file ds_dev/ds_ino) hold ds_path's stat */
static _Atomic int ds_kind = SPEC_FILE_OR_DIR;
static _Atomic uint64_t ds_dev, ds_ino;

static _Atomic uint32_t fds[FD_MAX]; /* per fd number, above */
/* Per fd number: a whole-file sample's file that this process read from (served or not); its
 * sample counts as consumed when the fd is closed (see count_whole). */
static _Atomic unsigned char fd_read[FD_MAX];
static _Atomic int fd_high = -1;     /* no fd above this was ever tracked */

static _Atomic int xstate = X_UNTRIED;
static struct {                           /* the attachment, written before xstate=ATTACHED */
  const unsigned char *base;              /* the mapped buffer */
  const _Atomic uint64_t *entries;        /* N entries */
  _Atomic uint32_t *consumed;             /* N counters */
  struct solar_xstats *stats;
  /* Private copies of the file table (sorted by dev, ino) and the extent table, checked once:
   * what is checked is what is used, whatever the shared memory says later. Kept for the
   * process's life (88 bytes a file, 16 an extent). */
  const struct solar_xfile *files;
  const struct solar_xextent *ext;
  const _Atomic uint64_t *withdrawn;      /* the agent saw the file change: serve nothing */
  const _Atomic uint64_t *lease_until;    /* the agent's watch vouches for the files until then */
  const _Atomic uint64_t *peer_nodes, *peer_node; /* demand mode across nodes: ask (ask_agent) */
  uint64_t n, nfiles;
  uint64_t s, slot_bytes, len; /* len: the mapping's bytes (each copy is checked inside it) */
} X;

static void stat_add(uint64_t *field, uint64_t v) {
  atomic_fetch_add_explicit((_Atomic uint64_t *)field, v, memory_order_relaxed);
}

/* The file behind an fd is the one the table describes: the same inode, size, modification and
 * change time. ctime moves on every write and cannot be set back, so neither a rewrite in place
 * (even one that restores the mtime) nor a new file on a reused inode number passes. */
enum { ID_SAME, ID_CHANGED, ID_OTHER }; /* ID_CHANGED: the file's inode, other content */
static int identity_of(const struct stat *st, const struct solar_xfile *f) {
  if (!S_ISREG(st->st_mode) || f->dev != (uint64_t)st->st_dev || f->ino != (uint64_t)st->st_ino)
    return ID_OTHER;
  if (f->size != (uint64_t)st->st_size || f->mtime_sec != (int64_t)st->st_mtim.tv_sec ||
      f->mtime_nsec != (int64_t)st->st_mtim.tv_nsec ||
      f->ctime_sec != (int64_t)st->st_ctim.tv_sec || f->ctime_nsec != (int64_t)st->st_ctim.tv_nsec)
    return ID_CHANGED;
  return ID_SAME;
}

/* The first file of the table with st's (dev, ino), or -1: a binary search (sorted by them). */
static int64_t file_of(const struct stat *st) {
  const uint64_t dev = (uint64_t)st->st_dev, ino = (uint64_t)st->st_ino;
  uint64_t lo = 0, hi = X.nfiles; /* the first entry not below (dev, ino) */
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    const struct solar_xfile *f = &X.files[mid];
    if (f->dev < dev || (f->dev == dev && f->ino < ino)) lo = mid + 1;
    else hi = mid;
  }
  if (lo == X.nfiles || X.files[lo].dev != dev || X.files[lo].ino != ino) return -1;
  return (int64_t)lo;
}

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* the vDSO: no system call */
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- messages: stderr, unbuffered, no stdio (no locks, no malloc) -------------------------- */

static void say(const char *a, const char *b, const char *c, long num) {
  char line[PATH_MAX + 256];
  size_t at = 0;
  const char *parts[3] = {a, b, c};
  for (int i = 0; i < 3; ++i) {
    if (!parts[i]) continue;
    size_t len = strlen(parts[i]);
    if (len > sizeof line - 32 - at) len = sizeof line - 32 - at;
    memcpy(line + at, parts[i], len);
    at += len;
  }
  if (num >= 0) { /* " (errno N)" */
    char digits[24];
    int d = 0;
    do digits[d++] = (char)('0' + num % 10); while ((num /= 10) > 0 && d < 20);
    memcpy(line + at, " (errno ", 8);
    at += 8;
    while (d > 0) line[at++] = digits[--d];
    line[at++] = ')';
  }
  line[at++] = '\n';
  int saved = errno;
  ssize_t w = write(2, line, at);
  (void)w;
  errno = saved;
}

/* ---- attach: the agent's buffer ------------------------------------------------------------ */

static int send_all(int s, const void *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(s, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p = (const char *)p + w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads exactly n bytes; an fd passed with SCM_RIGHTS goes to *fd (a second one is an error). */
static int recv_all(int s, void *p, size_t n, int *fd) {
  while (n > 0) {
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = p, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    int bad = (m.msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got;
        memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
        if (*fd < 0) *fd = got;
        else { close_fd(got); bad = 1; }
      }
    }
    if (bad) return -1;
    p = (char *)p + r;
    n -= (size_t)r;
  }
  return 0;
}

/* Asks the agent for its buffer. Returns the memfd and fills *ok, or -1. */
struct frame_head { /* solar/protocol.h's Header */
  uint32_t magic;
  uint16_t version, op;
  uint32_t length, reserved;
};
_Static_assert(sizeof(struct frame_head) == 16, "protocol header is 16 bytes");

/* A connection to the agent's socket whose reads and writes give up after timeout_ms (never
 * hang the rank on a stuck agent); -1 if none. */
static int agent_connect(long timeout_ms) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, sock_path, strlen(sock_path) + 1);
  if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
    const int err = errno;
    close_fd(s);
    errno = err;
    return -1;
  }
  return s;
}

static int xhello(struct solar_xhello_ok *ok) {
  const int s = agent_connect(10000);
  struct frame_head head = {SOLAR_PROTO_MAGIC, SOLAR_PROTO_VERSION, SOLAR_OP_XHELLO,
                            sizeof(struct solar_xhello), 0};
  struct solar_xhello hello = {.pid = (uint32_t)my_pid, .reserved = 0};
  unsigned char frame[sizeof head + sizeof hello];
  memcpy(frame, &head, sizeof head);
  memcpy(frame + sizeof head, &hello, sizeof hello);

  int memfd = -1;
  int fine = s >= 0 && send_all(s, frame, sizeof frame) == 0 &&
             recv_all(s, &head, sizeof head, &memfd) == 0;
  fine = fine && head.magic == SOLAR_PROTO_MAGIC && head.version == SOLAR_PROTO_VERSION &&
         head.op == SOLAR_OP_XHELLO_OK && head.length == sizeof *ok &&
         recv_all(s, ok, sizeof *ok, &memfd) == 0 && memfd >= 0;
  int err = errno;
  if (s >= 0) close_fd(s);
  if (!fine) {
    if (memfd >= 0) close_fd(memfd);
    if (verbose) say("solar: no buffer from the node agent at ", sock_path,
                     "; reading the dataset directly", head.op == 10 ? -1 : err);
    return -1;
  }
  return memfd;
}

/* One file's extents: sorted by offset, not overlapping, inside the file, each of 1 to
 * most bytes (the mapping's length: every copy from a slot is checked against the mapping's
 * end, copy_resident), its own samples. */
static int extents_sane(const struct solar_xextent *e, uint64_t count, uint64_t first,
                        uint64_t most, uint64_t size) {
  for (uint64_t i = 0; i < count; ++i) {
    if (e[i].sample < first || e[i].sample - first >= count || e[i].offset > size ||
        e[i].length == 0 || e[i].length > most || size - e[i].offset < e[i].length)
      return 0;
    if (i > 0 && (e[i].offset < e[i - 1].offset ||
                  e[i].offset - e[i - 1].offset < e[i - 1].length))
      return 0;
  }
  return 1;
}

/* The file table: sorted by (dev, ino); each file's samples inside [0, n) and its bytes inside
 * the file, contiguous or by its own extents inside the extent table. */
static int files_sane(const struct solar_xfile *f, uint64_t nfiles, const struct solar_xextent *e,
                      uint64_t n_ext, uint64_t n, uint64_t s, uint64_t most) {
  for (uint64_t i = 0; i < nfiles; ++i, ++f) {
    if (i > 0 && (f->dev < f[-1].dev || (f->dev == f[-1].dev && f->ino < f[-1].ino))) return 0;
    if (f->count > n || f->first > n - f->count) return 0;
    if (f->extents == 0) {
      if (f->count > 0 && (f->data_offset > f->size || (f->size - f->data_offset) / s < f->count))
        return 0;
    } else if (f->extents != f->count || f->extents_first > n_ext ||
               n_ext - f->extents_first < f->extents ||
               !extents_sane(e + f->extents_first, f->extents, f->first, most, f->size)) {
      return 0;
    }
  }
  return 1;
}

/* A private copy of `count` records of `size` bytes at `off` of the mapping, or NULL. */
static void *copy_table(const unsigned char *base, uint64_t off, uint64_t count, size_t size) {
  void *p = malloc(count ? (size_t)count * size : 1);
  if (p) memcpy(p, base + off, (size_t)count * size);
  return p;
}

/* Maps the agent's buffer and checks its index and tables (one file: and that the file behind
 * the fd that made us attach is the one it holds). Returns 1 with X filled in, or 0. */
static int attach_now(const struct stat *file) {
  struct solar_xhello_ok ok;
  int memfd = xhello(&ok);
  if (memfd < 0) return 0;
  const uint64_t len = ok.map_bytes, at = ok.index_offset;
  struct stat mst;
  if (fstat(memfd, &mst) != 0 || mst.st_size < 0 || (uint64_t)mst.st_size < len ||
      len > SIZE_MAX || at % 8 != 0 || at > len || len - at < sizeof(struct solar_xindex)) {
    close_fd(memfd);
    if (verbose) say("solar: the node agent's buffer is malformed; reading the dataset directly",
                     NULL, NULL, -1);
    return 0;
  }
  /* The agent seals the buffer against shrinking: a shrunk mapping would SIGBUS our reads. */
  const int seals = fcntl(memfd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    close_fd(memfd);
    if (verbose) say("solar: the node agent's buffer is not sealed; reading the dataset directly",
                     NULL, NULL, -1);
    return 0;
  }
  unsigned char *base = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, memfd, 0);
  close_fd(memfd);
  if (base == MAP_FAILED) {
    if (verbose) say("solar: cannot map the node agent's buffer", NULL, NULL, errno);
    return 0;
  }
  /* One private copy of the header (and below of the tables): what is checked is what is used,
   * whatever the shared memory says later. */
  struct solar_xindex hdr;
  memcpy(&hdr, base + at, sizeof hdr);
  const struct solar_xindex *ix = &hdr;
  struct solar_xfile *files = NULL;
  struct solar_xextent *ext = NULL;
  const uint64_t n = ix->samples, s = ix->sample_bytes, eo = ix->entries_offset,
                 co = ix->consumed_offset, nf = ix->files, fo = ix->files_offset,
                 ne = ix->extents, xo = ix->extents_offset;
  /* A sample's bytes start at its slot and run for its extent's length: a slot's bytes, or
   * several 64-byte units for samples of differing sizes. Extents are checked to lie inside
   * the mapping here (files_sane's bound: len), and every copy against the mapping's end
   * (copy_resident). */
  const char *why = NULL;
  if (ix->magic != SOLAR_XINDEX_MAGIC || n == 0 || s == 0 || ix->slot_bytes == 0 || s > len ||
      n > UINT64_MAX / 8 / s || eo % 8 != 0 || eo > len || (len - eo) / 8 < n || co % 4 != 0 ||
      co > len || (len - co) / 4 < n || s > len || nf == 0 || nf > FILES_MAX || fo % 8 != 0 ||
      fo > len || (len - fo) / sizeof(struct solar_xfile) < nf || ne > n ||
      (ne != 0 && (xo % 8 != 0 || xo > len || (len - xo) / sizeof(struct solar_xextent) < ne))) {
    why = "solar: the node agent's index is malformed; reading the dataset directly";
  } else if (!(files = copy_table(base, fo, nf, sizeof *files)) ||
             !(ext = copy_table(base, xo, ne, sizeof *ext)) ||
             !files_sane(files, nf, ext, ne, n, s, len)) {
    why = "solar: the node agent's file table is malformed; reading the dataset directly";
  } else {
    X.files = files;
    X.nfiles = nf;
    const int64_t i = file_of(file);
    if (atomic_load_explicit(&ds_kind, memory_order_relaxed) == SPEC_FILE &&
        (i < 0 || identity_of(file, &files[i]) != ID_SAME)) {
      say("solar: ", ds_path, " is not the file the node agent holds; reading it directly", -1);
      goto fail;
    }
    /* The counters (consumed[], stats) are the only bytes we write: make just their pages
     * writable; the samples stay read-only. Needs the memfd opened for writing, unsealed. */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo[2] = {(uintptr_t)base + at, (uintptr_t)base + co};
    const uintptr_t hi[2] = {lo[0] + sizeof *ix, lo[1] + n * 4};
    for (int k = 0; k < 2 && !why; ++k) {
      uintptr_t from = lo[k] & ~(page - 1);
      if (mprotect((void *)from, hi[k] - from, PROT_READ | PROT_WRITE) != 0)
        why = "solar: the node agent's counters are not writable; reading the dataset directly";
    }
    if (!why) {
      const struct solar_xindex *shared = (const struct solar_xindex *)(base + at);
      X.base = base;
      X.entries = (const _Atomic uint64_t *)(base + eo);
      X.consumed = (_Atomic uint32_t *)(base + co);
      X.stats = (struct solar_xstats *)&((struct solar_xindex *)(base + at))->stats;
      X.s = s;
      X.slot_bytes = ix->slot_bytes;
      X.len = len;
      X.n = n;
      X.ext = ext;
      X.withdrawn = (const _Atomic uint64_t *)&shared->withdrawn;
      X.lease_until = (const _Atomic uint64_t *)&shared->lease_until_ns;
      X.peer_nodes = (const _Atomic uint64_t *)&shared->peer_nodes;
      X.peer_node = (const _Atomic uint64_t *)&shared->peer_node;
      stat_add(&X.stats->attached, 1);
      if (verbose) say("solar: serving ", ds_path, " from the node agent's buffer", -1);
      return 1;
    }
  }
  if (why && verbose) say(why, NULL, NULL, -1);
fail:
  X.files = NULL;
  X.nfiles = 0;
  free(files);
  free(ext);
  munmap(base, (size_t)len);
  return 0;
}

static void attach(const struct stat *file) {
  int expected = X_UNTRIED;
  if (!atomic_compare_exchange_strong(&xstate, &expected, X_ATTACHING)) return; /* once */
  const int ok = attach_now(file);
  atomic_store_explicit(&xstate, ok ? X_ATTACHED : X_FAILED, memory_order_release);
}

/* ---- fd tracking ---------------------------------------------------------------------------- */

static uint32_t fd_mark(int fd) {
  return fd >= 0 && fd < FD_MAX ? atomic_load_explicit(&fds[fd], memory_order_relaxed) : FD_NONE;
}

/* Whole-file samples (a file of one extent covering it all: npz, JPEG, any file) are read in
 * many pieces at many positions (zipfile reads the end first), so no single read says the
 * sample was taken: it counts as consumed when the process closes the file after reading from
 * it, which np.load, PIL and `with open()` do at once. (A chunk or a row is one read: counted
 * at the read that brings its first byte, count_consumed.) */
static int whole_file(const struct solar_xfile *f) {
  return f->extents == 1 && X.ext[f->extents_first].offset == 0 &&
         X.ext[f->extents_first].length == f->size;
}

static void count_whole(int fd, uint32_t old) {
  if (!atomic_exchange_explicit(&fd_read[fd], 0, memory_order_relaxed)) return;
  const uint32_t file = old >> 2;
  if (file == 0 || atomic_load_explicit(&xstate, memory_order_acquire) != X_ATTACHED) return;
  atomic_fetch_add_explicit(&X.consumed[X.files[file - 1].first], 1, memory_order_relaxed);
}

static void fd_mark_set(int fd, uint32_t mark) {
  const uint32_t old = atomic_exchange_explicit(&fds[fd], mark, memory_order_relaxed);
  if (mark == FD_NONE) {
    count_whole(fd, old);
    return;
  }
  int high = atomic_load_explicit(&fd_high, memory_order_relaxed);
  while (high < fd && !atomic_compare_exchange_weak(&fd_high, &high, fd)) {
  }
}

/* A vfork child shares our memory (and no atfork handler runs in it): it must change nothing. */
static int same_process(void) { return getpid() == my_pid; }

/* Before fds [first, last] are closed. */
static void untrack_range(unsigned int first, unsigned int last) {
  const int high = atomic_load_explicit(&fd_high, memory_order_relaxed);
  if (!active || high < 0 || first > (unsigned int)high || !same_process()) return;
  if (last > (unsigned int)high) last = (unsigned int)high;
  for (unsigned int fd = first; fd <= last; ++fd) fd_mark_set((int)fd, FD_NONE);
}

/* What the spec names, and for one file its (dev, ino): from the text, else from a stat of the
 * path, once (a path that is not there yet is stat'ed again at the next open). */
static int spec_kind(void) {
  if (spec_said != SPEC_FILE_OR_DIR) return spec_said;
  if (!atomic_load_explicit(&ds_known, memory_order_acquire)) {
    struct stat ds;
    if (stat(ds_path, &ds) != 0) return SPEC_FILE_OR_DIR;
    atomic_store_explicit(&ds_dev, (uint64_t)ds.st_dev, memory_order_relaxed);
    atomic_store_explicit(&ds_ino, (uint64_t)ds.st_ino, memory_order_relaxed);
    atomic_store_explicit(&ds_kind, S_ISDIR(ds.st_mode) ? SPEC_DIR : SPEC_FILE,
                          memory_order_relaxed);
    atomic_store_explicit(&ds_known, 1, memory_order_release);
  }
  return atomic_load_explicit(&ds_kind, memory_order_relaxed);
}

/* The HDF5 file names a directory's listing takes (dataset_files.h). */
static int hdf5_name(const char *base) {
  static const char *const suffixes[] = {".h5", ".hdf5", ".hdf", ".he5"};
  const size_t len = strlen(base);
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; ++i) {
    const size_t sl = strlen(suffixes[i]);
    if (len > sl && strcasecmp(base + len - sl, suffixes[i]) == 0) return 1;
  }
  return 0;
}

/* Whether a file of this basename may be the dataset's, for a spec of this kind: the cheap
 * test before any fstat (a script opens many other files: modules, libraries, its outputs). A
 * list may name any file: every regular file is looked up. */
static int may_be_dataset(int kind, const char *base) {
  switch (kind) {
    case SPEC_FILE: return strcmp(base, ds_base) == 0;
    case SPEC_DIR: return hdf5_name(base);
    case SPEC_GLOB: return fnmatch(ds_base, base, FNM_PERIOD) == 0;
    case SPEC_LIST: return 1;
    default: return strcmp(base, ds_base) == 0 || hdf5_name(base);
  }
}

static void count_open(void) { stat_add(&X.stats->opens, 1); }

/* After a successful open of `path` returned fd. */
static void opened(int fd, const char *path, int flags) {
  if (!active || fd < 0 || fd >= FD_MAX) return;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!may_be_dataset(spec_said, base)) {
    if (fd_mark(fd) != FD_NONE && same_process()) fd_mark_set(fd, FD_NONE); /* closed behind us */
    return;
  }
  if (!same_process()) return;
  const int saved = errno;
  struct stat st;
  uint32_t mark = FD_NONE;
  /* Read-only opens only: a writer may change the file under the buffer; O_PATH can't read. */
  const int readable = (flags & O_ACCMODE) == O_RDONLY && !(flags & O_PATH);
  const int kind = readable ? spec_kind() : SPEC_FILE_OR_DIR;
  if (kind != SPEC_FILE_OR_DIR && may_be_dataset(kind, base) && fstat(fd, &st) == 0 &&
      S_ISREG(st.st_mode) &&
      (kind != SPEC_FILE ||
       ((uint64_t)st.st_dev == atomic_load_explicit(&ds_dev, memory_order_relaxed) &&
        (uint64_t)st.st_ino == atomic_load_explicit(&ds_ino, memory_order_relaxed)))) {
    attach(&st);
    mark = (flags & O_DIRECT) ? FD_DIRECT : FD_PLAIN;
    /* Attached: the fd is the table's file of its (dev, ino), with that whole identity (the
     * inode number may since have gone to a new file, which has another ctime), or nothing.
     * Attaching in another thread: looked up at its first read. */
    if (atomic_load_explicit(&xstate, memory_order_acquire) == X_ATTACHED) {
      const int64_t i = file_of(&st);
      if (i >= 0 && identity_of(&st, &X.files[i]) == ID_SAME) {
        mark |= (uint32_t)(i + 1) << 2;
        count_open();
      } else {
        if (verbose && kind != SPEC_FILE)
          say("solar: ", path, " is not a file the node agent holds; reading it directly", -1);
        mark = FD_NONE;
      }
    }
  }
  fd_mark_set(fd, mark);
  /* The agent serves this file's samples: the kernel's readahead after a small read (HDF5's
   * metadata, a zip header) would bring them from storage a second time, the whole of a file
   * of a few hundred KiB (one sample a file). Read only what is asked of the file. */
  if (mark != FD_NONE) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  errno = saved;
}

/* ---- serving a read ------------------------------------------------------------------------- */

/* Which sample's bytes offset `pos` of file f is, how far into them, and how many they are
 * (S, or a filtered chunk's stored size); 0: none (metadata, labels, chunk index nodes between
 * chunks). O(1) for contiguous datasets, a binary search over the file's extents for chunked
 * ones. */
static int locate(const struct solar_xfile *f, uint64_t pos, uint64_t *k, uint64_t *in,
                  uint64_t *len) {
  if (!f->extents) {
    if (pos < f->data_offset) return 0;
    const uint64_t rel = pos - f->data_offset, j = rel / X.s;
    if (j >= f->count) return 0;
    *k = f->first + j;
    *in = rel % X.s;
    *len = X.s;
    return 1;
  }
  const struct solar_xextent *e = X.ext + f->extents_first;
  if (pos < e[0].offset) return 0;
  uint64_t lo = 0, hi = f->extents; /* the last extent starting at or before pos */
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (e[mid].offset <= pos) lo = mid;
    else hi = mid;
  }
  if (pos - e[lo].offset >= e[lo].length) return 0;
  *k = e[lo].sample;
  *in = pos - e[lo].offset;
  *len = e[lo].length;
  return 1;
}

/* memcpy, except where glibc's is slow: it moves large blocks with `rep movsb`, which runs at
 * well under half its speed when source and destination are not equally aligned modulo 64
 * (measured on this project's AMD EPYC VMs: random 256 KiB copies from page-aligned blocks,
 * 13.5 GB/s into a page-aligned destination, 5.3 GB/s 16 bytes past one). The buffer's slots are
 * page aligned and a program's read buffer is wherever its allocator put it (malloc's large
 * blocks start 16 bytes past a page), so where the CPU has AVX2 such copies go through
 * unaligned loads and aligned stores (11.4-11.9 GB/s in the same test, 10.1-10.7 for an
 * aligned memcpy); an SSE2 loop was 9.9-10.6 GB/s, but x86-64 CPUs without AVX2 (before 2013)
 * are not worth a second loop: they keep memcpy. */
#if defined(__x86_64__)
static int have_avx2; /* set in the constructor */

__attribute__((target("avx2"))) static void copy_avx2(unsigned char *d, const unsigned char *s,
                                                      size_t n) {
  const size_t head = (32 - ((uintptr_t)d & 31)) & 31;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 128; d += 128, s += 128, n -= 128) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)s);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
    const __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_store_si256((__m256i *)d, a);
    _mm256_store_si256((__m256i *)(d + 32), b);
    _mm256_store_si256((__m256i *)(d + 64), c);
    _mm256_store_si256((__m256i *)(d + 96), e);
  }
  memcpy(d, s, n);
}
#endif

static void copy_out(unsigned char *d, const unsigned char *s, size_t n) {
#if defined(__x86_64__)
  if (have_avx2 && n >= 4096 && (((uintptr_t)d - (uintptr_t)s) & 63) != 0) {
    copy_avx2(d, s, n);
    return;
  }
#endif
  memcpy(d, s, n);
}

/* Sample k is in flight (the agent is reading it into its buffer; entry e): waits until it is
 * there, until *deadline (one per read, SOLAR_XINDEX_WAIT_NS after its first wait: a read of
 * several samples waits that long in all), while the agent's lease holds and nothing is
 * withdrawn, instead of reading it from the file too (the same bytes from the same storage a
 * second time, which slows the agent's reads as much as the rank's). Returns the entry last
 * seen. */
static uint64_t wait_in_flight(uint64_t k, uint64_t e, uint64_t *deadline) {
  const int saved = errno;
  const uint64_t start = monotonic_ns();
  if (*deadline == 0) *deadline = start + SOLAR_XINDEX_WAIT_NS;
  uint64_t now = start;
  const struct timespec nap = {.tv_sec = 0, .tv_nsec = 50000};
  while ((e & 0xffffffffu) == 0 && e != 0 && now < *deadline &&
         now <= atomic_load_explicit(X.lease_until, memory_order_acquire) &&
         !atomic_load_explicit(X.withdrawn, memory_order_relaxed)) {
    nanosleep(&nap, NULL);
    e = atomic_load_explicit(&X.entries[k], memory_order_acquire);
    now = monotonic_ns();
  }
  stat_add(&X.stats->waited_reads, 1);
  stat_add(&X.stats->waited_ns, now - start);
  errno = saved;
  return e;
}

/* Copies the resident samples' bytes of [pos, pos+n) of file f in order; stops at the first
 * sample that is not resident or changed during its copy. Returns the bytes copied. */
static size_t copy_resident(const struct solar_xfile *f, unsigned char *dst, size_t n,
                            uint64_t pos) {
  size_t done = 0;
  uint64_t k, in, extent, deadline = 0;
  while (done < n && locate(f, pos, &k, &in, &extent)) {
    const size_t len = extent - in < n - done ? (size_t)(extent - in) : n - done;
    uint64_t e1 = atomic_load_explicit(&X.entries[k], memory_order_acquire);
    if ((e1 & 0xffffffffu) == 0 && e1 != 0) e1 = wait_in_flight(k, e1, &deadline);
    const uint64_t slot = e1 & 0xffffffffu; /* slot + 1; 0: not resident */
    /* Its extent's bytes from its slot lie inside the mapping (extent <= len: files_sane). */
    if (slot == 0 || slot - 1 > (X.len - extent) / X.slot_bytes) break;
    copy_out(dst + done, X.base + (slot - 1) * X.slot_bytes + in, len);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&X.entries[k], memory_order_relaxed) != e1) {
      stat_add(&X.stats->torn, 1);
      break;
    }
    done += len;
    pos += len;
  }
  return done;
}

/* Every sample whose first byte lies in [pos, pos + span) has been read by this process: one
 * pread can bring several (HDF5's 64 KiB sieve over small rows, a chunk of several samples),
 * and HDF5 then serves them from its own cache without another pread. A short count's rest
 * is counted by the follow-up read that fetches it. */
static void count_consumed(const struct solar_xfile *f, uint64_t pos, uint64_t span) {
  const uint64_t end = pos + span;
  uint64_t k, in, extent;
  while (pos < end && locate(f, pos, &k, &in, &extent)) {
    if (in == 0) atomic_fetch_add_explicit(&X.consumed[k], 1, memory_order_relaxed);
    pos += extent - in;
  }
}

/* What a read of [pos, pos + n) of file f through fd takes: its samples (count_consumed), or
 * for a whole-file sample, its file marked read (counted when fd closes). */
static void took(int fd, const struct solar_xfile *f, uint64_t pos, uint64_t n) {
  if (!whole_file(f)) count_consumed(f, pos, n);
  else if (same_process()) atomic_store_explicit(&fd_read[fd], 1, memory_order_relaxed);
}

/* The kernel refuses O_DIRECT reads whose buffer, offset or length is not a multiple of the
 * device's logical block size (EINVAL). Only requests aligned to this, at least as large as any
 * such block size, are served on an O_DIRECT fd; the others go to the kernel, which decides. */
enum { DIRECT_ALIGN = 4096 };

static atomic_int warned_changed, warned_unwatched;

static void say_changed(void) {
  if (atomic_exchange(&warned_changed, 1)) return;
  if (atomic_load_explicit(&ds_kind, memory_order_relaxed) == SPEC_FILE)
    say("solar: ", ds_path, " changed during the run; reading it directly", -1);
  else
    say("solar: a file of ", ds_path, " changed during the run; reading it directly", -1);
}

/* ---- demand mode across nodes: a miss of another node's sample asked of the agent ---------- */

/* One connection per process (a forked worker makes its own), one ask at a time: a thread
 * that finds it busy reads the file. An agent that does not answer within ASK_WAIT_MS (the
 * connection is closed, so that a late answer is not taken for the next ask) or refuses is
 * asked no more by this process after ASK_FAILURES such times. */
enum { ASK_FAILURES = 3 };
#define ASK_WAIT_MS 1000
static pthread_mutex_t ask_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int ask_fd = -1; /* -1 as soon as the program closes or replaces its number */
static int ask_failures;

static void ask_close(void) {
  const int fd = atomic_exchange(&ask_fd, -1);
  if (fd >= 0) close_fd(fd);
}

/* The program closed (or dup'ed over) fds [lo, hi]: if ours was among them, it is no longer
 * ours to use or close. */
static void ask_forget(unsigned int lo, unsigned int hi) {
  int fd = atomic_load(&ask_fd);
  if (fd >= 0 && (unsigned int)fd >= lo && (unsigned int)fd <= hi)
    atomic_compare_exchange_strong(&ask_fd, &fd, -1);
}

/* Asks the agent for sample k (SOLAR_OP_XFETCH): 1 once it is in the buffer (copy it), 0 not
 * (read the file). */
static int ask_agent(uint64_t k) {
  if (pthread_mutex_trylock(&ask_mu) != 0) return 0;
  const int saved = errno; /* a served read leaves errno as it was */
  int held = 0;
  if (ask_failures < ASK_FAILURES) {
    if (atomic_load(&ask_fd) < 0) atomic_store(&ask_fd, agent_connect(ASK_WAIT_MS));
    const int s = atomic_load(&ask_fd);
    struct frame_head head = {SOLAR_PROTO_MAGIC, SOLAR_PROTO_VERSION, SOLAR_OP_XFETCH,
                              sizeof(struct solar_xfetch), 0};
    struct solar_xfetch ask = {.sample = (uint32_t)k, .held = 0}, got = {0, 0};
    unsigned char frame[sizeof head + sizeof ask];
    memcpy(frame, &head, sizeof head);
    memcpy(frame + sizeof head, &ask, sizeof ask);
    int fd = -1;
    const int fine = s >= 0 && send_all(s, frame, sizeof frame) == 0 &&
                     recv_all(s, &head, sizeof head, &fd) == 0 && fd < 0 &&
                     head.magic == SOLAR_PROTO_MAGIC && head.op == SOLAR_OP_XFETCH_OK &&
                     head.length == sizeof got && recv_all(s, &got, sizeof got, &fd) == 0 &&
                     fd < 0 && got.sample == ask.sample;
    if (fd >= 0) close_fd(fd);
    if (fine) {
      held = got.held == 1;
    } else {
      ask_close();
      ++ask_failures;
    }
  }
  pthread_mutex_unlock(&ask_mu);
  errno = saved;
  return held;
}

/* How the process's recent asks went (approximate: relaxed, halved every ASK_WINDOW asks).
 * While fewer than one in ASK_RARE found the sample (the first epoch: the homes hold little
 * yet), only one miss in ASK_PROBE is asked: an ask that finds nothing costs a round trip. */
enum { ASK_WINDOW = 128, ASK_RARE = 10, ASK_PROBE = 8 };
static _Atomic uint32_t ask_tries, ask_found, ask_skips;

static int ask_worth_it(void) {
  const uint32_t tries = atomic_load_explicit(&ask_tries, memory_order_relaxed);
  if (tries < ASK_WINDOW / 2 ||
      atomic_load_explicit(&ask_found, memory_order_relaxed) * ASK_RARE >= tries)
    return 1;
  return atomic_fetch_add_explicit(&ask_skips, 1, memory_order_relaxed) % ASK_PROBE == 0;
}

static void ask_went(int found) {
  if (atomic_fetch_add_explicit(&ask_tries, 1, memory_order_relaxed) + 1 >= ASK_WINDOW) {
    atomic_store_explicit(&ask_tries, ASK_WINDOW / 2, memory_order_relaxed);
    atomic_store_explicit(&ask_found,
                          atomic_load_explicit(&ask_found, memory_order_relaxed) / 2,
                          memory_order_relaxed);
  }
  if (found) atomic_fetch_add_explicit(&ask_found, 1, memory_order_relaxed);
}

/* After copy_resident stopped at pos, short of n: while the next sample is missing here and
 * kept by another node's buffer (demand mode across the nodes), asks the agent for it and
 * copies it once there. Returns the bytes copied. */
static size_t copy_asked(const struct solar_xfile *f, unsigned char *dst, size_t n, uint64_t pos) {
  const uint64_t nodes = atomic_load_explicit(X.peer_nodes, memory_order_acquire);
  if (nodes < 2) return 0;
  const uint64_t me = atomic_load_explicit(X.peer_node, memory_order_relaxed);
  size_t done = 0;
  uint64_t k, in, extent;
  for (int asks = 0; asks < 8 && done < n && locate(f, pos + done, &k, &in, &extent); ++asks) {
    if (atomic_load_explicit(&X.entries[k], memory_order_acquire) != 0 ||
        solar_home_node(k, nodes) == me)
      break;
    if (!ask_worth_it()) break;
    stat_add(&X.stats->asked_reads, 1);
    const int held = ask_agent(k);
    ask_went(held);
    if (!held) break;
    const size_t got = copy_resident(f, dst + done, n - done, pos + done);
    if (got == 0) break;
    stat_add(&X.stats->asked_served, 1);
    done += got;
  }
  return done;
}

static ssize_t file_pread(int fd, void *buf, size_t n, off_t off) {
  return real_pread ? real_pread(fd, buf, n, off) : sys_pread(fd, buf, n, off);
}

/* Serves a pread from the buffer when it can. Returns the bytes served, or -1: call the real
 * function unchanged. A request whose samples are resident only in part is served whole: the
 * resident prefix from the buffer, the rest from the file (never a short count the kernel would
 * not return: a program may take one for the end of the file). */
static ssize_t serve(int fd, void *buf, size_t n, off_t off) {
  const uint32_t mark = fd_mark(fd);
  if (mark == FD_NONE || n == 0 || off < 0 || n > SSIZE_MAX) return -1;
  if (atomic_load_explicit(&xstate, memory_order_acquire) != X_ATTACHED) return -1;
  const uint64_t withdrawn = atomic_load_explicit(X.withdrawn, memory_order_relaxed);
  if (withdrawn) {
    if (withdrawn == SOLAR_XINDEX_FILE_CHANGED) say_changed();
    else if (verbose && !atomic_exchange(&warned_unwatched, 1))
      say("solar: the node agent stopped; reading ", ds_path, " directly", -1);
    return -1;
  }
  const int saved = errno;
  struct stat st;
  int have_st = 0;
  uint32_t file = mark >> 2; /* its index + 1; 0: not looked up yet (opened while attaching) */
  if (file == 0) {
    const int64_t i = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? file_of(&st) : -1;
    errno = saved;
    if (i < 0) {
      if (same_process()) fd_mark_set(fd, FD_NONE);
      return -1;
    }
    file = (uint32_t)i + 1;
    uint32_t expected = mark; /* unless closed (or resolved) meanwhile */
    if (same_process())
      atomic_compare_exchange_strong(&fds[fd], &expected, file << 2 | (mark & FD_MODE));
    have_st = 1;
    count_open();
  }
  const struct solar_xfile *f = &X.files[file - 1];
  const uint64_t pos = (uint64_t)off;
  uint64_t k, in, extent;
  if (!locate(f, pos, &k, &in, &extent)) return -1; /* metadata, labels: not samples */
  if ((mark & FD_MODE) == FD_DIRECT &&
      (((uintptr_t)buf | pos | (uint64_t)n) & (DIRECT_ALIGN - 1)) != 0)
    return -1;
  /* The fd is still the file: a number closed behind our back (fclose, a raw close, io_uring)
   * and reused for another file, or the file rewritten, is seen here, on every read served. */
  const int id = have_st || fstat(fd, &st) == 0 ? identity_of(&st, f) : ID_OTHER;
  errno = saved;
  if (id != ID_SAME) {
    if (same_process()) fd_mark_set(fd, FD_NONE); /* for good: its reads go to the file */
    if (id == ID_CHANGED) say_changed();
    return -1;
  }
  if (monotonic_ns() > atomic_load_explicit(X.lease_until, memory_order_acquire)) {
    /* Nobody watches the files now (the agent was killed, or is stopped): read them. The reads
     * still count, for an agent that comes back. */
    if (verbose && !atomic_exchange(&warned_unwatched, 1))
      say("solar: the node agent no longer watches ", ds_path, "; reading it directly", -1);
    took(fd, f, pos, n);
    stat_add(&X.stats->miss_reads, 1);
    stat_add(&X.stats->miss_bytes, n);
    return -1;
  }
  size_t done = copy_resident(f, buf, n, pos);
  if (done < n) done += copy_asked(f, (unsigned char *)buf + done, n - done, pos + done);
  if (done < n && (mark & FD_MODE) == FD_DIRECT) done = 0; /* O_DIRECT: whole requests */
  /* After the copy (an eviction paced on it cannot start during it): what this read brings
   * in, served or from the file, counts as consumed. */
  took(fd, f, pos, n);
  if (done == 0) {
    stat_add(&X.stats->miss_reads, 1);
    stat_add(&X.stats->miss_bytes, n);
    return -1;
  }
  stat_add(&X.stats->hit_reads, 1);
  stat_add(&X.stats->hit_bytes, done);
  if (done == n) return (ssize_t)done;
  /* The rest from the file, as the kernel reads it (short only at the end of the file). An
   * error there still returns what was transferred, as read(2) does, errno unchanged. */
  const ssize_t rest = file_pread(fd, (unsigned char *)buf + done, n - done, off + (off_t)done);
  errno = saved;
  if (rest <= 0) return (ssize_t)done;
  stat_add(&X.stats->miss_reads, 1);
  stat_add(&X.stats->miss_bytes, (uint64_t)rest);
  return (ssize_t)(done + (size_t)rest);
}

/* ---- the wrappers --------------------------------------------------------------------------- */

#define MODE_ARG(flags, mode)                        \
  mode_t mode = 0;                                   \
  if (__OPEN_NEEDS_MODE(flags)) {                    \
    va_list ap;                                      \
    va_start(ap, flags);                             \
    mode = va_arg(ap, mode_t);                       \
    va_end(ap);                                      \
  }

#define CALL_OPEN(real, flags, mode, ...) \
  (__OPEN_NEEDS_MODE(flags) ? real(__VA_ARGS__, flags, mode) : real(__VA_ARGS__, flags))

EXPORT int open(const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  const int fd = real_open ? CALL_OPEN(real_open, flags, mode, path)
                           : sys_openat(AT_FDCWD, path, flags, mode);
  opened(fd, path, flags);
  return fd;
}

EXPORT int open64(const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  const int fd = real_open64 ? CALL_OPEN(real_open64, flags, mode, path)
                             : sys_openat(AT_FDCWD, path, flags, mode);
  opened(fd, path, flags);
  return fd;
}

EXPORT int openat(int dirfd, const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  const int fd = real_openat ? CALL_OPEN(real_openat, flags, mode, dirfd, path)
                             : sys_openat(dirfd, path, flags, mode);
  opened(fd, path, flags);
  return fd;
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  const int fd = real_openat64 ? CALL_OPEN(real_openat64, flags, mode, dirfd, path)
                               : sys_openat(dirfd, path, flags, mode);
  opened(fd, path, flags);
  return fd;
}

EXPORT int __open_2(const char *path, int flags) {
  const int fd = real___open_2 ? real___open_2(path, flags) : sys_openat(AT_FDCWD, path, flags, 0);
  opened(fd, path, flags);
  return fd;
}

EXPORT int __open64_2(const char *path, int flags) {
  const int fd =
      real___open64_2 ? real___open64_2(path, flags) : sys_openat(AT_FDCWD, path, flags, 0);
  opened(fd, path, flags);
  return fd;
}

EXPORT int __openat_2(int dirfd, const char *path, int flags) {
  const int fd =
      real___openat_2 ? real___openat_2(dirfd, path, flags) : sys_openat(dirfd, path, flags, 0);
  opened(fd, path, flags);
  return fd;
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags) {
  const int fd = real___openat64_2 ? real___openat64_2(dirfd, path, flags)
                                   : sys_openat(dirfd, path, flags, 0);
  opened(fd, path, flags);
  return fd;
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  const ssize_t served = serve(fd, buf, n, off);
  if (served >= 0) return served;
  return file_pread(fd, buf, n, off);
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off64_t off) {
  const ssize_t served = serve(fd, buf, n, off);
  if (served >= 0) return served;
  return real_pread64 ? real_pread64(fd, buf, n, off) : sys_pread(fd, buf, n, off);
}

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
  if (n <= buflen) { /* else the real one fails the check */
    const ssize_t served = serve(fd, buf, n, off);
    if (served >= 0) return served;
  }
  if (real___pread_chk) return real___pread_chk(fd, buf, n, off, buflen);
  if (n > buflen) abort();
  return sys_pread(fd, buf, n, off);
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen) {
  if (n <= buflen) {
    const ssize_t served = serve(fd, buf, n, off);
    if (served >= 0) return served;
  }
  if (real___pread64_chk) return real___pread64_chk(fd, buf, n, off, buflen);
  if (n > buflen) abort();
  return sys_pread(fd, buf, n, off);
}

/* read(2) of a tracked fd (Python's io.FileIO under open(), np.load's zipfile, PIL): served
 * at the file position the kernel keeps, which is then moved past what was served, exactly as
 * the read would have moved it. (Two threads reading one fd at once race on that position,
 * as they would on the kernel's without solar.) Untracked fds go straight to the real read. */
static ssize_t serve_at_position(int fd, void *buf, size_t n) {
  if (fd_mark(fd) == FD_NONE) return -1;
  const int saved = errno;
  const off_t pos = lseek(fd, 0, SEEK_CUR);
  if (pos < 0) {
    errno = saved;
    return -1;
  }
  const ssize_t served = serve(fd, buf, n, pos);
  if (served >= 0 && lseek(fd, pos + served, SEEK_SET) < 0) {
    /* cannot happen on a regular file; the bytes were read: let the kernel read them again */
    errno = saved;
    return -1;
  }
  errno = saved;
  return served;
}

EXPORT ssize_t read(int fd, void *buf, size_t n) {
  const ssize_t served = serve_at_position(fd, buf, n);
  if (served >= 0) return served;
  return real_read ? real_read(fd, buf, n) : sys_read(fd, buf, n);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
  if (n <= buflen) {
    const ssize_t served = serve_at_position(fd, buf, n);
    if (served >= 0) return served;
  }
  if (real___read_chk) return real___read_chk(fd, buf, n, buflen);
  if (n > buflen) abort();
  return sys_read(fd, buf, n);
}

EXPORT int close(int fd) {
  if (fd_mark(fd) != FD_NONE && same_process()) fd_mark_set(fd, FD_NONE); /* before: no reuse gap */
  if (fd >= 0) ask_forget((unsigned int)fd, (unsigned int)fd);
  return close_fd(fd);
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
  if (!(flags & (int)CLOSE_RANGE_CLOEXEC)) {
    untrack_range(first, last);
    ask_forget(first, last);
  }
  return real_close_range ? real_close_range(first, last, flags)
                          : sys_close_range(first, last, flags);
}

EXPORT void closefrom(int lowfd) {
  if (lowfd >= 0) {
    untrack_range((unsigned int)lowfd, UINT_MAX);
    ask_forget((unsigned int)lowfd, UINT_MAX);
  }
  if (real_closefrom) real_closefrom(lowfd);
  else if (lowfd >= 0) sys_close_range((unsigned int)lowfd, UINT_MAX, 0);
}

/* dup2/dup3: newfd is closed and becomes oldfd's file. */
static int dup_common(int oldfd, int newfd, int flags, int three) {
  const uint32_t mark = fd_mark(oldfd);
  const int change = oldfd != newfd && newfd >= 0 && newfd < FD_MAX &&
                     (mark != FD_NONE || fd_mark(newfd) != FD_NONE) && same_process();
  if (change) fd_mark_set(newfd, FD_NONE);
  if (oldfd != newfd && newfd >= 0) ask_forget((unsigned int)newfd, (unsigned int)newfd);
  int r;
  if (three) r = real_dup3 ? real_dup3(oldfd, newfd, flags) : sys_dup3(oldfd, newfd, flags);
  else r = real_dup2 ? real_dup2(oldfd, newfd) : sys_dup2(oldfd, newfd);
  if (change && r >= 0 && mark != FD_NONE) fd_mark_set(newfd, mark);
  return r;
}

EXPORT int dup2(int oldfd, int newfd) { return dup_common(oldfd, newfd, 0, 0); }
EXPORT int dup3(int oldfd, int newfd, int flags) { return dup_common(oldfd, newfd, flags, 1); }

/* ---- setup -------------------------------------------------------------------------------- */

static void after_fork_child(void) {
  my_pid = getpid();
  /* A thread of the parent was attaching: it does not exist here; try again when needed. */
  int expected = X_ATTACHING;
  atomic_compare_exchange_strong(&xstate, &expected, X_UNTRIED);
  /* A thread of the parent may have held it: this process has only this thread. The parent's
   * connection is closed here, before the child can reuse its number: not ours to use. */
  pthread_mutex_init(&ask_mu, NULL);
  ask_close();
  ask_failures = 0;
}

#define RESOLVE(name)                            \
  do {                                           \
    void *sym = dlsym(RTLD_NEXT, #name);         \
    memcpy(&real_##name, &sym, sizeof sym);      \
  } while (0)

__attribute__((constructor)) static void solar_preload_init(void) {
  RESOLVE(open);
  RESOLVE(open64);
  RESOLVE(openat);
  RESOLVE(openat64);
  RESOLVE(__open_2);
  RESOLVE(__open64_2);
  RESOLVE(__openat_2);
  RESOLVE(__openat64_2);
  RESOLVE(pread);
  RESOLVE(pread64);
  RESOLVE(__pread_chk);
  RESOLVE(__pread64_chk);
  RESOLVE(read);
  RESOLVE(__read_chk);
  RESOLVE(close);
  RESOLVE(close_range);
  RESOLVE(closefrom);
  RESOLVE(dup2);
  RESOLVE(dup3);
  my_pid = getpid();
#if defined(__x86_64__)
  __builtin_cpu_init();
  have_avx2 = __builtin_cpu_supports("avx2");
#endif

  /* $SOLAR_DATASET is FILE[:/dataset]; the file is everything before the last ":/" after the
     first character; @LIST names a list (the @ comes off), `*?[` in the file a glob, a
     trailing / a directory (otherwise a stat tells a directory from a file). The dataset, and
     a `[]` after it, do not matter here (protocol/src/dataset_spec.cpp;
     tests/protocol/dataset_spec_cases.json). No I/O here: the constructor runs in every
     process. */
  const char *ds = getenv("SOLAR_DATASET"), *sock = getenv("SOLAR_SOCKET");
  if (!ds || !*ds || strncmp(ds, "fabric://", 9) == 0 || !sock || !*sock) return;
  size_t len = strlen(ds);
  for (const char *p = strstr(ds + 1, ":/"); p; p = strstr(p + 1, ":/")) len = (size_t)(p - ds);
  spec_said = SPEC_FILE_OR_DIR;
  if (ds[0] == '@') {
    spec_said = SPEC_LIST;
    ++ds;
    --len;
  }
  if (len == 0 || len >= sizeof ds_path || strlen(sock) >= sizeof sock_path) return;
  memcpy(ds_path, ds, len);
  ds_path[len] = '\0';
  if (spec_said != SPEC_LIST && strpbrk(ds_path, "*?[")) spec_said = SPEC_GLOB;
  else if (spec_said != SPEC_LIST && ds_path[len - 1] == '/') spec_said = SPEC_DIR;
  const char *slash = strrchr(ds_path, '/');
  ds_base = slash ? slash + 1 : ds_path;
  if (!*ds_base && (spec_said == SPEC_GLOB || spec_said == SPEC_FILE_OR_DIR)) return;
  if (spec_said != SPEC_FILE_OR_DIR) atomic_store(&ds_kind, spec_said);
  memcpy(sock_path, sock, strlen(sock) + 1);
  const char *v = getenv("SOLAR_VERBOSE");
  verbose = v && *v;
  if (pthread_atfork(NULL, NULL, after_fork_child) != 0) return;
  active = 1;
}
