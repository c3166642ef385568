/* The job-transparent mode's shared state between a node agent and the interposer
 * (libsolar_preload.so) in unmodified ranks. Plain C: the interposer links no libstdc++.
 *
 * The agent's buffer (a memfd, passed over its Unix socket with SCM_RIGHTS) holds, at
 * `index_offset`, a solar_xindex header followed by one 64-bit entry per sample of the dataset:
 *
 *   entry[i] == 0                  sample i is not resident
 *   entry[i] == gen << 32 | slot+1 sample i's bytes are at buffer offset slot * slot_bytes
 *   entry[i] == gen << 32          sample i is coming (in flight): the agent has given it a
 *                                  slot and queued or started its read, from storage or a
 *                                  peer; a reader waits for it, bounded
 *                                  (SOLAR_XINDEX_WAIT_NS), rather than read it from the file
 *                                  as well
 *
 * The agent publishes an entry (release store) only after the slot's bytes are written, and
 * clears it (release store) before the slot is reused. A reader copies lock-free:
 *   e1 = load_acquire(entry[i]); if e1 == 0: miss
 *   memcpy(dst, base + slot * slot_bytes + off, n)
 *   atomic_thread_fence(acquire); e2 = load_relaxed(entry[i]); if e2 != e1: miss (use the file)
 * `gen` changes on every publication, so a slot recycled and re-filled during the copy is seen.
 * Only the low 32 bits tell whether the bytes are there (0: not, or not yet).
 *
 * Where a sample's bytes are in the file: a contiguous dataset's sample i is at
 * data_offset + i*S (extents == 0); a chunked one's (unfiltered, whole samples per chunk, e.g.
 * one chunk per sample) is given by a table of `extents` {file offset, sample} pairs sorted by
 * offset, at `extents_offset`: sample k's bytes are [offset, offset + S).
 *
 * After the entries come one 32-bit counter per sample, `consumed[i]`, which readers increment
 * (relaxed fetch-add) when they read sample i from the start, hit or miss: the agent paces its
 * evictions on them. Then the statistics block (relaxed fetch-adds).
 *
 * Handshake: the interposer connects to $SOLAR_SOCKET and sends a frame of the agent protocol
 * (solar/protocol.h: 16-byte header {magic "SOLR", version SOLAR_PROTO_VERSION, op, length, 0}) with op
 * SOLAR_OP_XHELLO and a solar_xhello body; the agent answers op SOLAR_OP_XHELLO_OK with a
 * solar_xhello_ok body and the memfd as SCM_RIGHTS ancillary data, or op 10 (error, text).
 */
#ifndef SOLAR_TRANSPARENT_H
#define SOLAR_TRANSPARENT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOLAR_XINDEX_MAGIC 0x5844495852414c53ULL /* "SLARXIDX" little-endian */
#define SOLAR_XINDEX_FILE_CHANGED 1
#define SOLAR_XINDEX_AGENT_STOPPED 2
/* The watch's lease (lease_until_ns): how long a check of the file vouches for it, and how often
 * the agent checks. An agent that dies (SIGKILL, the OOM killer) stops renewing: within
 * SOLAR_XINDEX_LEASE_NS every reader serves nothing more from its buffer. */
#define SOLAR_XINDEX_LEASE_NS 2000000000ULL
#define SOLAR_XINDEX_RENEW_NS 100000000ULL
/* How long a reader waits for a sample in flight before it reads the file itself: the agent is
 * reading it from the storage the reader would read it from. */
#define SOLAR_XINDEX_WAIT_NS 1000000000ULL
/* solar/protocol.h's kVersion (checked there at compile time). */
#define SOLAR_PROTO_VERSION 5
#define SOLAR_OP_XHELLO 11
#define SOLAR_OP_XHELLO_OK 12

struct solar_xhello {
  uint32_t pid;
  uint32_t reserved;
};

struct solar_xhello_ok {
  uint64_t map_bytes;     /* size of the memfd to map (read-only) */
  uint64_t index_offset;  /* where the solar_xindex header starts in it */
};

struct solar_xstats {     /* counters readers add to; the agent reports them */
  uint64_t hit_reads, hit_bytes;    /* served from the buffer */
  uint64_t miss_reads, miss_bytes;  /* sample reads that went to the file */
  uint64_t torn;                    /* copies abandoned because the entry changed */
  uint64_t attached;                /* processes that mapped the buffer */
  uint64_t waited_reads, waited_ns; /* reads that waited for a sample in flight, and how long */
  uint64_t reserved[8];
};

struct solar_xextent {
  uint64_t offset; /* file offset of the sample's first byte */
  uint64_t sample;
};

struct solar_xindex {
  uint64_t magic;           /* SOLAR_XINDEX_MAGIC */
  uint64_t samples;         /* N */
  uint64_t sample_bytes;    /* S */
  uint64_t slot_bytes;      /* distance between slots in the buffer */
  uint64_t data_offset;     /* file offset of sample 0 (contiguous dataset): sample i's bytes
                               are [data_offset + i*S, data_offset + (i+1)*S) of the file */
  /* The file the entries describe; the interposer serves only fds whose fstat matches all of
     these, checked at open and again on every read it serves (an fd number closed behind its
     back and reused for another file, or the file rewritten: ctime changes on every write and
     cannot be set back, and an inode number reused for a new file comes with a new ctime). */
  uint64_t file_dev, file_ino, file_size;
  int64_t file_mtime_sec, file_mtime_nsec;
  int64_t file_ctime_sec, file_ctime_nsec;
  uint64_t entries_offset;  /* from the start of the buffer: N uint64 entries */
  uint64_t consumed_offset; /* from the start of the buffer: N uint32 counters */
  uint64_t extents_offset;  /* chunked: from the start of the buffer, `extents` solar_xextent */
  uint64_t extents;         /* 0: contiguous (data_offset applies); else N */
  uint64_t withdrawn;       /* nonzero: readers serve nothing more from the buffer (relaxed
                               load per read). SOLAR_XINDEX_FILE_CHANGED: the file changed
                               under the agent; SOLAR_XINDEX_AGENT_STOPPED: the agent stopped
                               (nobody watches the file any more) */
  uint64_t lease_until_ns;  /* CLOCK_MONOTONIC nanoseconds: the agent found the file unchanged
                               at most SOLAR_XINDEX_LEASE_NS before this and renews it every
                               SOLAR_XINDEX_RENEW_NS; once it has passed (the agent was killed,
                               or is stopped), readers serve nothing until it is renewed */
  struct solar_xstats stats;
};

#ifdef __cplusplus
}
#endif

#endif /* SOLAR_TRANSPARENT_H */
