// SPDX-License-Identifier: Apache-2.0
/* interpose_read: pread throughput of one process over a dataset file's samples, against
 * memcpy of the same sizes in the same process. Run by bench/interpose_bench.py plain, under
 * libsolar_preload.so with every sample resident (served from the agent's buffer), and under
 * the preload with no agent (every read falls through: the interposer's miss-only overhead).
 *
 *   interpose_read FILE DATA_OFFSET SAMPLE_BYTES SAMPLES PASSES
 *
 * Prints one line: reads, bytes, pread seconds, memcpy seconds. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s FILE DATA_OFFSET SAMPLE_BYTES SAMPLES PASSES\n", argv[0]);
    return 2;
  }
  const uint64_t offset = strtoull(argv[2], NULL, 10), s = strtoull(argv[3], NULL, 10);
  const uint64_t n = strtoull(argv[4], NULL, 10), passes = strtoull(argv[5], NULL, 10);
  const int fd = open(argv[1], O_RDONLY);
  if (fd < 0) {
    perror(argv[1]);
    return 1;
  }
  unsigned char *buf = malloc(s);
  memset(buf, 1, s);
  uint64_t sum = 0, reads = 0;
  /* A fixed permutation of the samples (an LCG walk), the same in every mode. */
  double t0 = now();
  for (uint64_t p = 0; p < passes; ++p)
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t k = (i * 2654435761ULL + p) % n;
      if (pread(fd, buf, s, (off_t)(offset + k * s)) != (ssize_t)s) {
        perror("pread");
        return 1;
      }
      sum += buf[k % s];
      ++reads;
    }
  const double t_read = now() - t0;
  /* memcpy of the same samples in the same order from private memory as large as the dataset
   * (touched first, so no page faults are timed), i.e. what a copy out of any buffer costs. */
  unsigned char *pool = malloc(s * n);
  memset(pool, 3, s * n);
  t0 = now();
  for (uint64_t p = 0; p < passes; ++p)
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t k = (i * 2654435761ULL + p) % n;
      memcpy(buf, pool + k * s, s);
      sum += buf[k % s];
    }
  const double t_copy = now() - t0;
  printf("%llu %llu %.6f %.6f %llu\n", (unsigned long long)reads,
         (unsigned long long)(reads * s), t_read, t_copy, (unsigned long long)(sum & 1));
  free(pool);
  free(buf);
  close(fd);
  return 0;
}
