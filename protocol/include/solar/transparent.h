// SPDX-License-Identifier: Apache-2.0
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
 * Which files the entries describe: a FILE TABLE of `files` solar_xfile at `files_offset`, one
 * per file of the dataset (a single file is a table of one), sorted by (dev, ino) so that the
 * interposer finds an fd's file with one fstat and a binary search. Each holds the file's
 * identity as the agent stat'ed it at start (dev, ino, size, mtime, ctime: the interposer serves
 * only fds whose fstat matches all of these, at open and again on every read it serves), the
 * global id of its sample 0 (`first`) and its sample count, and where its samples' bytes lie:
 * contiguous (extents == 0): local sample k is [data_offset + k*S, data_offset + (k+1)*S);
 * chunked (unfiltered chunks of whole samples, or filtered chunks of one sample: gzip,
 * shuffle, lzf, served as they are stored, the reading program decoding them): its `extents`
 * entries of the global extent table (`extents` solar_xextent at `extents_offset`), from
 * extents_first, sorted by offset within the file, .sample the global id, .length its bytes in
 * the file (S for raw chunks, the stored size for filtered ones): [offset, offset + length).
 * A sample's slot holds those bytes (a reader checks that they lie inside the mapping). Samples of differing sizes (whole files, compressed chunks of differing stored sizes)
 * take consecutive slots of 64 bytes each (slot_bytes 64, sample_bytes their longest): the
 * entry names the first.
 * Sample ids are global: entries and counters below are indexed by them. Two entries may name
 * the same (dev, ino) (a list naming a file twice): their bytes are the same; the interposer
 * serves the first.
 *
 * After the entries come one 32-bit counter per sample, `consumed[i]`, which readers increment
 * (relaxed fetch-add) when they read sample i from the start, hit or miss: the agent paces its
 * evictions on them. Then the file table and the extent table, which the agent writes once,
 * before it publishes the magic (release store), and never changes; a reader copies them. The
 * header's statistics block takes relaxed fetch-adds.
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
#define SOLAR_PROTO_VERSION 8
#define SOLAR_OP_XHELLO 11
#define SOLAR_OP_XHELLO_OK 12
/* Demand mode across nodes (peer_nodes below): a reader that misses a sample placed on another
 * node asks its agent for it with op SOLAR_OP_XFETCH and a solar_xfetch body (held 0), on a
 * connection of its own; the agent reads it from that node's buffer over RMA into a slot of
 * its own (published in the entry as usual) and answers SOLAR_OP_XFETCH_OK with held 1 (copy
 * it now), or at once with held 0 (that node does not hold it: read the file). */
#define SOLAR_OP_XFETCH 13
#define SOLAR_OP_XFETCH_OK 14

struct solar_xfetch {
  uint32_t sample; /* its global id */
  uint32_t held;   /* the reply: 1 it is in the buffer now, 0 not */
};

/* Demand mode across nodes: the node whose buffer keeps sample `sample` of a job of `nodes`
 * nodes (splitmix64 of the id, modulo the nodes), in the agents and the interposer alike. */
static inline uint32_t solar_home_node(uint64_t sample, uint64_t nodes) {
  uint64_t z = sample + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return nodes ? (uint32_t)(z % nodes) : 0;
}

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
  uint64_t opens;                   /* opens of a dataset file (each reached the file system) */
  uint64_t asked_reads;             /* misses asked of the agent (SOLAR_OP_XFETCH) */
  uint64_t asked_served;            /* of those, served from another node's buffer */
  uint64_t reserved[5];
};

struct solar_xextent {
  uint64_t offset; /* file offset of the sample's first byte */
  uint64_t sample; /* its global id */
  uint64_t length; /* its bytes in the file: S raw, a filtered chunk's stored size */
};

struct solar_xfile {       /* one file of the dataset, as the agent stat'ed it */
  uint64_t dev, ino, size; /* an fd is this file when its fstat has all of these, and: */
  int64_t mtime_sec, mtime_nsec; /* ctime moves on every write and cannot be set back: neither */
  int64_t ctime_sec, ctime_nsec; /* a rewrite in place nor a new file on a reused inode passes */
  uint64_t first;          /* global id of its sample 0 */
  uint64_t count;          /* its samples: global ids [first, first + count) */
  uint64_t data_offset;    /* contiguous (extents == 0): local sample k at data_offset + k*S */
  uint64_t extents_first;  /* chunked: its extents in the extent table, sorted by offset */
  uint64_t extents;        /* 0: contiguous; else count */
};

struct solar_xindex {
  uint64_t magic;           /* SOLAR_XINDEX_MAGIC */
  uint64_t samples;         /* N, over all files */
  uint64_t sample_bytes;    /* S */
  uint64_t slot_bytes;      /* distance between slots in the buffer (64 for samples of
                               differing sizes, each taking consecutive slots) */
  uint64_t files;           /* F >= 1 */
  uint64_t files_offset;    /* from the start of the buffer: F solar_xfile sorted by (dev, ino) */
  uint64_t extents;         /* the chunked files' extents together (0: every file contiguous) */
  uint64_t extents_offset;  /* from the start of the buffer: `extents` solar_xextent */
  uint64_t entries_offset;  /* from the start of the buffer: N uint64 entries */
  uint64_t consumed_offset; /* from the start of the buffer: N uint32 counters */
  uint64_t withdrawn;       /* nonzero: readers serve nothing more from the buffer (relaxed
                               load per read). SOLAR_XINDEX_FILE_CHANGED: the file changed
                               under the agent (a single file; a changed file of many is
                               refused by the per-read identity check alone);
                               SOLAR_XINDEX_AGENT_STOPPED: the agent stopped (nobody watches
                               the files any more) */
  uint64_t lease_until_ns;  /* CLOCK_MONOTONIC nanoseconds: the agent found the file unchanged
                               (many files: it was alive) at most SOLAR_XINDEX_LEASE_NS before
                               this and renews it every SOLAR_XINDEX_RENEW_NS; once it has
                               passed (the agent was killed, or is stopped), readers serve
                               nothing until it is renewed */
  struct solar_xstats stats;
  uint64_t peer_nodes;      /* nonzero (the job's nodes) while the agent is in demand mode
                               across the nodes' buffers: a reader that misses a sample whose
                               solar_home_node is not peer_node asks the agent for it
                               (SOLAR_OP_XFETCH) before it reads the file; 0: never asks.
                               Written by the agent (relaxed), read by readers per miss */
  uint64_t peer_node;       /* this node's number among them */
};

#ifdef __cplusplus
}
#endif

#endif /* SOLAR_TRANSPARENT_H */
