// SPDX-License-Identifier: Apache-2.0
/* Opens the dataset, gets rid of its fd in the ways a program can (close_range, closefrom,
 * dup2/dup3 over it, a vfork child that closes/dups/opens, fclose of an fdopen), then reads other
 * files through the same fd numbers. Prints "<label> <fnv1a-64 of one sample read at READ_AT>" per read; the test
 * checks which file each read's bytes came from.
 *
 * usage: fd_reuse DATASET OTHER SAME_NAME_OTHER READ_AT SAMPLE_BYTES
 *   READ_AT: the file offset of a sample of the dataset (data_offset + k * SAMPLE_BYTES)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dataset, *other, *same_name;
static off_t at;
static size_t sample;
static unsigned char *buf;

static void die(const char *what) {
  fprintf(stderr, "fd_reuse: %s: %s\n", what, strerror(errno));
  exit(2);
}

static int open_ro(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) die(path);
  return fd;
}

/* Reads `count` samples from READ_AT through fd; prints their hash. */
static void show_n(const char *label, int fd, size_t count) {
  ssize_t got = pread(fd, buf, count * sample, at);
  if (got != (ssize_t)(count * sample)) {
    printf("%s short %zd\n", label, got);
    return;
  }
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < count * sample; ++i) h = (h ^ buf[i]) * 1099511628211ULL;
  printf("%s %016llx\n", label, (unsigned long long)h);
}
static void show(const char *label, int fd) { show_n(label, fd, 1); }

/* Puts a duplicate of the other file at exactly fd number `want` (not through open()). */
static int other_at(int src, int want) {
  int fd = fcntl(src, F_DUPFD, want);
  if (fd != want) {
    fprintf(stderr, "fd_reuse: wanted fd %d, got %d\n", want, fd);
    exit(2);
  }
  return fd;
}

static void vfork_child(void (*body)(void)) {
  pid_t pid = vfork();
  if (pid < 0) die("vfork");
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) die("waitpid");
}

static int child_fd, child_fd2;
static void child_close_all(void) { close_range(3, UINT_MAX, 0); }
static void child_dup2_dataset(void) { dup2(child_fd, child_fd2); }
static void child_open_dataset(void) {
  close(child_fd2);
  open(dataset, O_RDONLY); /* lands on child_fd2 in the child only */
}

int main(int argc, char **argv) {
  if (argc != 6) return 2;
  dataset = argv[1], other = argv[2], same_name = argv[3];
  at = (off_t)strtoull(argv[4], NULL, 10);
  sample = strtoull(argv[5], NULL, 10);
  if (posix_memalign((void **)&buf, 4096, 2 * sample + 4096)) die("posix_memalign");
  setvbuf(stdout, NULL, _IOLBF, 0);

  const int src = open_ro(other); /* the other file, kept below every dataset fd */

  int ds = open_ro(dataset);
  show("dataset", ds);
  close_range((unsigned)ds, (unsigned)ds, 0);
  show("close_range.dup", other_at(src, ds));
  close(ds);

  ds = open_ro(dataset);
  close_range((unsigned)ds, UINT_MAX, 0);
  int fd = open_ro(other);
  if (fd != ds) die("close_range.open: fd not reused");
  show("close_range.open", fd);
  close(fd);

  ds = open_ro(dataset);
  close_range((unsigned)ds, (unsigned)ds, CLOSE_RANGE_CLOEXEC); /* stays open */
  show("close_range.cloexec", ds);
  close(ds);

  ds = open_ro(dataset);
  closefrom(ds);
  show("closefrom.dup", other_at(src, ds));
  close(ds);

  ds = open_ro(dataset);
  if (dup2(src, ds) != ds) die("dup2");
  show("dup2.over", ds);
  close(ds);

  ds = open_ro(dataset);
  if (dup3(src, ds, O_CLOEXEC) != ds) die("dup3");
  show("dup3.over", ds);
  close(ds);

  ds = open_ro(dataset);
  if (dup2(ds, 50) != 50) die("dup2 copy");
  show("dup2.copy", 50);
  close(ds);
  show("dup2.copy.after_close", 50);
  close(50);
  show("dup2.copy.reuse", other_at(src, 50));
  close(50);

  ds = open_ro(dataset);
  child_fd = ds;
  vfork_child(child_close_all);
  show("vfork.close_range.parent", ds); /* the child's close changed nothing here */
  close(ds);
  show("vfork.close_range.reuse", other_at(src, ds));
  close(ds);

  ds = open_ro(dataset);
  child_fd = ds, child_fd2 = other_at(src, 60);
  vfork_child(child_dup2_dataset);
  show("vfork.dup2", 60); /* fd 60 is the other file here */
  close(60);
  close(ds);

  ds = open_ro(dataset);
  child_fd2 = other_at(src, 61);
  vfork_child(child_open_dataset);
  show("vfork.open", 61);
  close(61);
  close(ds);

  /* fdopen + fclose: glibc closes the fd inside (no call through the PLT the interposer
   * sees); fopen of the other file takes the number, also inside glibc. */
  ds = open_ro(dataset);
  FILE *f = fdopen(ds, "rb");
  if (!f) die("fdopen");
  fclose(f);
  FILE *g = fopen(other, "rb");
  if (!g || fileno(g) != ds) die("fclose.fopen: fd not reused");
  show("fclose.fopen", fileno(g));
  fclose(g);

  fd = open_ro(same_name); /* same basename, another file */
  show("same_name", fd);
  close(fd);

  /* Samples k and k+1 in one read (the test's agent holds k, not k+1): served whole on a
   * plain fd (k from the buffer, k+1 from the file), from the file on an O_DIRECT fd. */
  fd = open_ro(dataset);
  show_n("span.plain", fd, 2);
  close(fd);
  fd = open(dataset, O_RDONLY | O_DIRECT);
  if (fd < 0) die("O_DIRECT");
  show_n("span.o_direct", fd, 2);
  /* One resident sample into a buffer 1 byte past alignment: the kernel refuses it (EINVAL);
   * so must the interposer, which could copy it. */
  errno = 0;
  ssize_t got = pread(fd, buf + 1, sample, at);
  printf("o_direct.unaligned %zd errno %d\n", got, got < 0 ? errno : 0);
  close(fd);
  return 0;
}
