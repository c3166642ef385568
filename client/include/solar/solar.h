// SPDX-License-Identifier: Apache-2.0
/* libsolar: what a training rank links to get its batches.
 *
 * A rank opens a loader from the environment that `solar run` (or `srun --solar-*`) sets, then
 * loops: solar_next_batch → use the samples → solar_release. With a node agent running, the
 * sample pointers point straight into the node's shared buffer (zero copy); without one — or
 * if the agent goes away mid-run — the library reads the very same samples, in the same order,
 * directly from the dataset, and says so once on stderr. Training sees identical data either
 * way.
 *
 * Environment: SOLAR_PLAN (plan file), SOLAR_NODE (node id in the plan), SOLAR_LOCAL_RANK (or
 * LOCAL_RANK), SOLAR_DATASET (FILE.h5[:/dataset] or fabric://host:port/name), SOLAR_LABELS
 * (labels dataset, default /label, empty for none), SOLAR_SOCKET (the agent; absent = read
 * directly), SOLAR_AGENT_TIMEOUT (seconds, default 60, 0 for no limit: the longest a rank waits
 * for its agent, to accept the connection or to send any reply; past it the rank reads the
 * dataset directly from the step where it was, as when the agent dies, and says so once on
 * stderr; an agent that refuses a rank, e.g. out of file descriptors, makes it read directly at
 * once), SOLAR_START_EPOCH / SOLAR_START_STEP (resume: the loader starts at global step
 * epoch × steps per epoch + step, set by `solar run --start-epoch/--start-step` and `srun
 * --solar-start-epoch/--solar-start-step`; the step is within the epoch, or any global step
 * without an epoch; beyond the plan's end is an error naming its length; unset: the loader
 * starts where its agent starts, step 0 without one). SOLAR_NODE and SOLAR_LOCAL_RANK default to 0 for a process started on its own
 * (with a warning on stderr when the plan has more ranks); a process that a launcher started as
 * one of several (WORLD_SIZE, SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1)
 * must have them whenever the plan has more than one node or rank per node.
 *
 * Thread safety: one loader per rank, used from one thread at a time. Errors: functions that
 * can fail return NULL or -1 and leave a message in solar_last_error() (per thread).
 */
#ifndef SOLAR_SOLAR_H
#define SOLAR_SOLAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SOLAR_API __attribute__((visibility("default")))
#else
#define SOLAR_API
#endif

/* The release these headers belong to (checked against the project version at build time). The
 * library's SONAME changes with SOLAR_VERSION_MAJOR; solar_version() says which library a
 * program actually loaded. */
#define SOLAR_VERSION_MAJOR 0
#define SOLAR_VERSION_MINOR 1
#define SOLAR_VERSION_PATCH 0
#define SOLAR_VERSION_STRING "0.1.0"
#define SOLAR_VERSION (SOLAR_VERSION_MAJOR * 10000 + SOLAR_VERSION_MINOR * 100 + SOLAR_VERSION_PATCH)

typedef struct solar_loader solar_loader;
typedef struct solar_batch solar_batch;

/* "0.1.0": the loaded library's version. */
SOLAR_API const char* solar_version(void);

/* Opens this rank's loader from the environment. NULL on error. */
SOLAR_API solar_loader* solar_open_env(void);
/* Closes the loader (releasing any batch it still holds). NULL is ignored. */
SOLAR_API void solar_close(solar_loader* loader);
/* The last error of this thread, as one line of text ("" if none). */
SOLAR_API const char* solar_last_error(void);

/* 1 when batches come from a node agent's shared buffer, 0 when read directly. */
SOLAR_API int solar_using_agent(const solar_loader* loader);
SOLAR_API uint32_t solar_epochs(const solar_loader* loader);
SOLAR_API uint32_t solar_steps_per_epoch(const solar_loader* loader);
/* Bytes of one sample; with samples of differing sizes, the largest (each one's own:
 * solar_batch_sample_bytes). */
SOLAR_API uint64_t solar_sample_bytes(const solar_loader* loader);
/* 1 when samples differ in size: a dataset of whole files (`*.npz`, `*.jpg`, any file: one
 * sample is one file's bytes, which the program decodes itself), planned by bytes. Such a batch's
 * sample i is solar_batch_sample_bytes(batch, i) bytes long; there are no labels, and the
 * shape is unknown (solar_sample_shape gives the largest sample's bytes as uint8). */
SOLAR_API int solar_sample_sizes_differ(const solar_loader* loader);
/* Bytes of one sample's label; 0 when the dataset has none. */
SOLAR_API uint64_t solar_label_bytes(const solar_loader* loader);
SOLAR_API uint64_t solar_dataset_samples(const solar_loader* loader);
/* What a sample's bytes are, as the agent's source (or, reading directly, the dataset) says.
 * solar_sample_shape: one sample's shape (the dataset's shape without its first dimension):
 * writes its first min(n, max_dims) dimensions to `dims` (may be NULL with max_dims 0) and
 * returns n, its number of dimensions (0 for scalar samples); -1 when libsolar does not know it.
 * solar_sample_dtype, solar_label_dtype: the element type by name ("int8", "uint8", "int16",
 * "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"); "" when unknown, and
 * for the label when the dataset has none. The strings live as long as the loader. */
SOLAR_API int solar_sample_shape(const solar_loader* loader, uint64_t* dims, int max_dims);
SOLAR_API const char* solar_sample_dtype(const solar_loader* loader);
SOLAR_API const char* solar_label_dtype(const solar_loader* loader);
/* Global rank, world size and node id as the plan knows them. */
SOLAR_API uint32_t solar_rank(const solar_loader* loader);
SOLAR_API uint32_t solar_world_size(const solar_loader* loader);

/* The plan's per-rank batch size b (with an imbalance bound δ a rank's batch has b-δ..b+δ
 * samples; the last step of an epoch may have fewer). */
SOLAR_API uint32_t solar_batch_per_rank(const solar_loader* loader);
/* A 64-bit fingerprint of the plan: its configuration (samples, sizes, epochs, nodes, ranks,
 * batch, seed, order, policy, buffer, δ), its epoch order and every node section's checksum,
 * so every rank's batches; not the dataset's identity. Equal on every rank of a run, and equal
 * for a plan made again from the same inputs (plans are deterministic). For checkpoints: a
 * saved position is only meaningful for the plan it was taken with. */
SOLAR_API uint64_t solar_plan_fingerprint(const solar_loader* loader);

/* The global step the next solar_next_batch returns (for a new loader its start: 0, or the
 * resumed launch's start step; the plan's total steps, epochs × steps per epoch, once every
 * batch has been taken). */
SOLAR_API uint64_t solar_position(const solar_loader* loader);
/* Moves the loader so that the next solar_next_batch returns global step `global_step`: to
 * resume a run from a checkpoint (solar_position saved with it). Forward only: global_step at
 * least solar_position and at most the plan's total steps (which means nothing is left); no
 * batch may be held. Without an agent, or to solar_position itself, this only moves the cursor
 * (no reads): a launch resumed at the checkpoint's step (solar run --start-step, srun
 * --solar-start-step) starts its agents and loaders there, so skipping to it costs nothing. With
 * an agent and a later step, the steps before are taken and released in order, because the
 * agent runs its plan in order (it reads what those steps needed and evicts as planned). 0 on
 * success, -1 with solar_last_error(): a step beyond the end, a step already served or before
 * the launch's start, a batch still held. */
SOLAR_API int solar_skip_to(solar_loader* loader, uint64_t global_step);

/* Takes the next batch: 1 and *out set; 0 when every epoch is done; -1 on error. The previous
 * batch must have been released. The batch stays valid until solar_release. */
SOLAR_API int solar_next_batch(solar_loader* loader, solar_batch** out);
/* Gives the batch back; its pointers are invalid afterwards. 0 on success, -1 on error. */
SOLAR_API int solar_release(solar_loader* loader, solar_batch* batch);

SOLAR_API size_t solar_batch_size(const solar_batch* batch);
/* Global step (epoch position × steps per epoch + step) and epoch position. */
SOLAR_API uint64_t solar_batch_step(const solar_batch* batch);
SOLAR_API uint32_t solar_batch_epoch(const solar_batch* batch);
/* Sample i of the batch: its index in the dataset, its bytes, its label bytes (NULL if none). */
SOLAR_API uint64_t solar_batch_index(const solar_batch* batch, size_t i);
SOLAR_API const void* solar_batch_sample(const solar_batch* batch, size_t i);
/* Bytes of sample i of the batch (solar_sample_bytes unless samples differ in size) and of all
 * its samples together (what solar_batch_gather needs). */
SOLAR_API uint64_t solar_batch_sample_bytes(const solar_batch* batch, size_t i);
SOLAR_API uint64_t solar_batch_bytes(const solar_batch* batch);
SOLAR_API const void* solar_batch_label(const solar_batch* batch, size_t i);
/* Mean per-rank batch of this batch's step (the step's global batch / world size). With an
 * imbalance bound δ > 0 ranks get b-δ..b+δ samples; weighting a rank's loss by
 * solar_batch_size / this keeps averaged gradients unbiased. */
SOLAR_API double solar_batch_mean_size(const solar_batch* batch);
/* Copies the batch's samples back to back into `data` (at least solar_batch_bytes: size ×
 * sample bytes, or the samples' own lengths when they differ; NULL to skip) and their labels into `labels` (size × label bytes; NULL to skip): one contiguous batch
 * (a framework's tensor) in one call. 0 on success, -1 with solar_last_error() (a buffer too
 * small, labels asked of a dataset without). */
SOLAR_API int solar_batch_gather(const solar_batch* batch, void* data, size_t data_bytes,
                                 void* labels, size_t labels_bytes);

/* GPU (optional: libsolar built with SOLAR_WITH_CUDA, on when the CUDA toolkit is found).
 * solar_cuda_available: 1 when this libsolar has CUDA and a GPU is usable, else 0 with the
 * reason in solar_last_error() ("built without CUDA", "no GPU: ...").
 * solar_batch_copy_to_device: copies the batch's samples back to back to device memory `dst`
 * (at least solar_batch_bytes) with cudaMemcpyAsync on `stream` (a cudaStream_t, or NULL for
 * the default stream); the node's shared buffer is registered (pinned, read-only) on first use,
 * so the copies are DMA straight from it. 0 on success, -1 with solar_last_error() otherwise;
 * the batch stays valid and usable from the CPU either way. */
SOLAR_API int solar_cuda_available(void);
SOLAR_API int solar_batch_copy_to_device(const solar_batch* batch, void* dst, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* SOLAR_SOLAR_H */
