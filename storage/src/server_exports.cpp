// SPDX-License-Identifier: Apache-2.0
// What solar-stored exports: --export specs, the files opened and mapped (or copied into
// memory), and the watch that withdraws an export whose file changed.
#include "server_impl.h"
#include "solar/dataset_spec.h"
#include "solar/sys/meminfo.h"

namespace solar::storage {

Export Export::parse(const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw StorageError(fmt::format("--export '{}': expected NAME=FILE.h5:/dataset", spec));
  Export e;
  e.name = spec.substr(0, eq);
  for (char c : e.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      throw StorageError(fmt::format("--export '{}': the name may use letters, digits, - _ . only",
                                     spec));
  e.spec = spec.substr(eq + 1);
  protocol::FileDataset where = protocol::split_file_dataset(e.spec);
  e.path = std::move(where.file);
  e.dataset = std::move(where.dataset);
  return e;
}

void StorageServer::Impl::open_export(const Export& e) {
  for (const auto& x : exports)
    if (x->spec.name == e.name)
      throw StorageError(fmt::format("--export {}: the name is used twice", e.name));
  auto ex = std::make_unique<Exported>();
  ex->spec = e;
  try {
    if (names_many_files(e.spec)) {  // many files, one export: staged reads (or --in-memory)
      SourceOptions so;
      so.io_threads = 4;
      so.label_dataset = opt.labels;
      ex->source = open_source(e.spec, so);
    } else {
      Hdf5Options ho;
      ho.io_threads = 2;
      ho.label_dataset = opt.labels;
      auto file = Hdf5Source::open(e.path, e.dataset, ho);
      ex->file = file.get();
      ex->source = std::move(file);
    }
  } catch (const StorageError& err) {
    throw StorageError(fmt::format("--export {}: {}", e.name, err.what()));
  }
  const DatasetInfo& info = ex->source->info();
  ex->identity = fmt::format("solar-stored export {} of {}", e.name, ex->source->identity());
  const std::uint64_t bytes = info.samples * info.sample_bytes;
  const auto off = ex->file ? ex->file->raw_offset() : std::nullopt;
  if (!ex->file && bytes > 0 && opt.in_memory) {
    load_into_memory(*ex);
  } else if (off && bytes > 0 && opt.in_memory) {
    load_into_memory(*ex);
  } else if (off && bytes > 0) {
    const int fd = ::open(e.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw StorageError(fmt::format("--export {}: {}: {}", e.name, e.path, std::strerror(errno)));
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t aligned = *off / page * page;
    ex->map_len = bytes + (*off - aligned);
    ex->map = ::mmap(nullptr, ex->map_len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(aligned));
    ::close(fd);
    if (ex->map == MAP_FAILED) {
      ex->map = nullptr;
      throw StorageError(fmt::format("--export {}: cannot map {}: {}", e.name, e.path,
                                     std::strerror(errno)));
    }
    ex->data = static_cast<const std::byte*>(ex->map) + (*off - aligned);
    ex->rma = true;  // registered per connection (Grant): exactly the data region
  } else {
    staging_bytes = std::max(staging_bytes, info.sample_bytes);
  }
  if (info.has_labels && info.samples) {
    ex->labels.resize(info.samples * info.label_bytes);
    const SampleRun all{0, info.samples};
    ex->source->read_labels({&all, 1}, ex->labels.data());
  }
  spdlog::info("export {}: {} ({} samples of {} {}, {} B each, {}; {})", e.name,
               ex->source->describe(), info.samples, info.shape_string(), to_string(info.dtype),
               info.sample_bytes, info.layout,
               ex->in_memory ? "one-sided RMA from the server's memory"
               : ex->rma     ? "one-sided RMA from the mapped file"
                             : "staged reads");
  exports.push_back(std::move(ex));
}

// --in-memory: the data is read once, at start, into anonymous memory of the server's own (on
// huge pages where the kernel gives them), and clients read that copy. Page-cache pages cost
// clients more to copy out than anonymous ones: shm reads of the copy ran 1.3-1.4x those of
// the mapped file, 256 KiB to 16 MiB samples (bench/README.md). The copy is
// read with O_DIRECT where the file system allows it, so the node does not hold it twice, and
// from a second handle whose identity must match the export's: a file replaced between the
// two opens is refused rather than served as the export's.
void StorageServer::Impl::load_into_memory(Exported& ex) {
  const DatasetInfo& info = ex.source->info();
  const std::uint64_t bytes = info.samples * info.sample_bytes;
  const std::string& name = ex.spec.name;
  constexpr std::uint64_t kReserve = 256ULL << 20;  // left to the job and the kernel
  if (const std::uint64_t avail = sys::mem_available_bytes(); bytes + kReserve > avail)
    throw StorageError(fmt::format(
        "--in-memory: export {} needs {} of memory, and {} is available (keeping {} for the "
        "rest): serve it from its file (without --in-memory), or free memory",
        name, format_bytes(bytes), format_bytes(avail), format_bytes(kReserve)));
  constexpr std::size_t kHuge = 2ULL << 20;
  ex.map_len = (bytes + kHuge - 1) / kHuge * kHuge;
  ex.map = ::mmap(nullptr, ex.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ex.map == MAP_FAILED) {
    ex.map = nullptr;
    throw StorageError(fmt::format("--in-memory: export {}: cannot allocate {}: {}", name,
                                   format_bytes(bytes), std::strerror(errno)));
  }
  ::madvise(ex.map, ex.map_len, MADV_HUGEPAGE);  // best effort: THP may be off
  Hdf5Options ho;
  ho.label_dataset.clear();
  ho.io_threads = 4;
  ho.direct = true;
  std::unique_ptr<Hdf5Source> own;  // one file: a second handle, O_DIRECT
  SampleSource* loader = ex.source.get();  // many files: the export's source checks each file
  try {
    if (ex.file) loader = (own = Hdf5Source::open(ex.spec.path, ex.spec.dataset, ho)).get();
  } catch (const StorageError& err) {
    throw StorageError(fmt::format("--export {}: {}", name, err.what()));
  }
  if (loader->identity() != ex.source->identity())
    throw StorageError(fmt::format("--export {}: the file changed while it was opened ({}, then "
                                   "{}); start the server on a file nobody rewrites",
                                   name, ex.source->identity(), loader->identity()));
  spdlog::info("export {}: loading {} into memory", name, format_bytes(bytes));
  const auto start = std::chrono::steady_clock::now();
  auto shown = start;
  auto* dst = static_cast<std::byte*>(ex.map);
  const std::uint64_t step = std::max<std::uint64_t>(1, (256ULL << 20) / info.sample_bytes);
  for (std::uint64_t first = 0; first < info.samples; first += step) {
    const SampleRun run{first, std::min(step, info.samples - first)};
    try {
      loader->read({&run, 1}, dst + first * info.sample_bytes);  // checks the file after
    } catch (const StorageError& err) {
      throw StorageError(fmt::format("--export {}: loading into memory: {}", name, err.what()));
    }
    if (const auto now = std::chrono::steady_clock::now(); now - shown > std::chrono::seconds(5)) {
      shown = now;
      spdlog::info("export {}: {} of {} loaded", name,
                   format_bytes((first + run.count) * info.sample_bytes), format_bytes(bytes));
    }
  }
  ::mprotect(ex.map, ex.map_len, PROT_READ);  // served read-only from here on
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("export {}: {} loaded into memory in {:.1f} s ({:.2f} GB/s)", name,
               format_bytes(bytes), s, s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0);
  ex.data = static_cast<const std::byte*>(ex.map);
  ex.in_memory = true;
  ex.rma = true;
}

// Mapped exports are read by clients without the server's CPU, so a file rewritten in place is
// caught here (twice a second) rather than at a read: the export stops being served.
void StorageServer::Impl::watch_exports() {
  for (auto& ex : exports) {
    if (!ex->rma || !ex->file || ex->changed.load(std::memory_order_acquire)) continue;
    try {
      ex->file->check_unchanged();
      continue;
    } catch (const StorageError& e) {
      std::lock_guard g(conns_mu);  // new clients are refused only once the readers are hung up on
      ex->changed_why = e.what();
      ex->changed.store(true, std::memory_order_release);
      for (auto& c : conns)
        if (c.reading.load() == ex.get()) ::shutdown(c.socket->native_handle(), SHUT_RDWR);
    }
    spdlog::error("export {} withdrawn: {}", ex->spec.name, ex->changed_why);
  }
}

}  // namespace solar::storage
