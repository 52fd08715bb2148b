#include "src/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <xxhash.h>

#include "kernels/kernels.hpp"
#include "models/model.hpp"
#include "strategies/pp/schedule.hpp"
#include "src/comm/mpi_check.hpp"
#include "kernels/foundation/error.hpp"
#include "kernels/foundation/input_file.hpp"

namespace strata::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
// Version 2: xxHash (XXH3, 64 bits) checksums, the global files' checksums
// and the manifest's own. Version 1 (FNV-1a) is refused by name.
constexpr std::uint32_t kVersion = 2;
constexpr const char* kManifest = "manifest.toml";

std::string step_name(int step) { return fmt::format("step-{:06d}", step); }
std::string rank_file(int rank) { return fmt::format("rank-{:05d}.bin", rank); }

// XXH3 (64 bits) over the bytes written or read, in order: at memory speed,
// so verifying a checkpoint costs its read and no more.
class Checksum {
 public:
  Checksum() : s_(XXH3_createState()) {
    STRATA_CHECK(s_ != nullptr, "XXH3_createState failed");
    XXH3_64bits_reset(s_);
  }
  ~Checksum() { XXH3_freeState(s_); }
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void add(const void* p, std::size_t n) { XXH3_64bits_update(s_, p, n); }
  std::uint64_t value() const { return XXH3_64bits_digest(s_); }

 private:
  XXH3_state_t* s_;
};

std::string hex(std::uint64_t h) { return fmt::format("{:016x}", h); }

// The manifest ends with a line "# checksum <hex>" over every byte before it.
constexpr const char* kManifestSum = "# checksum ";

}  // namespace

std::string seal_manifest(const std::string& body) {
  return body + kManifestSum + hex(XXH3_64bits(body.data(), body.size())) + "\n";
}

namespace {

// The manifest's text without its checksum line, or an error.
std::string unseal_manifest(const std::string& text, std::string* body) {
  const std::size_t at = text.rfind(kManifestSum);
  if (at == std::string::npos || (at > 0 && text[at - 1] != '\n'))
    return "its manifest has no checksum line (written by an older strata, or edited)";
  *body = text.substr(0, at);
  const std::string stored = text.substr(at + std::strlen(kManifestSum), 16);
  if (stored != hex(XXH3_64bits(body->data(), body->size())))
    return "its manifest fails its checksum (edited or corrupt)";
  return "";
}

// A file of the checkpoint: its bytes but the last 8 hash to `want`, which
// its last 8 bytes (the writer's trailer) also hold.
std::string verify_file(const fs::path& path, const std::string& want) {
  // A FIFO or device in a file's place would block or stream: not a file.
  std::error_code ec0;
  if (fs::exists(path, ec0) && !fs::is_regular_file(path, ec0))
    return fmt::format("{}: not a regular file", path.filename().string());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return fmt::format("{}: {}", path.filename().string(), std::strerror(errno));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  std::string why;
  if (ec || size < 8) {
    why = fmt::format("{}: truncated ({} bytes)", path.filename().string(), ec ? 0 : size);
  } else {
    Checksum sum;
    std::vector<char> buf(std::size_t(1) << 20);
    for (std::uintmax_t left = size - 8; left > 0 && why.empty();) {
      const std::size_t n = std::size_t(std::min<std::uintmax_t>(left, buf.size()));
      if (std::fread(buf.data(), 1, n, f) != n) why = fmt::format("{}: read error", path.filename().string());
      sum.add(buf.data(), n);
      left -= n;
    }
    std::uint64_t trailer = 0;
    if (why.empty() && std::fread(&trailer, sizeof trailer, 1, f) != 1)
      why = fmt::format("{}: read error", path.filename().string());
    if (why.empty() && (hex(sum.value()) != want || trailer != sum.value()))
      why = fmt::format("{}: checksum {} where the manifest says {}", path.filename().string(), hex(sum.value()), want);
  }
  std::fclose(f);
  return why;
}

// Every rank learns whether any rank failed; all throw the message of the
// lowest failing rank, the same text on every rank and marked agreed (so no
// rank is left waiting in the next collective, and the run reports it as one
// error).
// The text every rank reports for an agreed failure ("" for none).
std::string failure_text(MPI_Comm comm, const std::string& mine) {
  int size = 1;
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  const comm::Failure f = comm::first_failure(mine, comm);
  if (f.rank < 0) return "";
  return size > 1 ? fmt::format("rank {}: {}", f.rank, f.message) : f.message;
}

void agree(MPI_Comm comm, const std::string& mine, core::ErrorKind kind) {
  if (std::string text = failure_text(comm, mine); !text.empty()) throw core::Error(kind, text, true);
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// A checkpoint file: bytes written through a running checksum, which ends
// the file; the reader checks it.
class Writer {
 public:
  explicit Writer(const fs::path& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {}
  void put(const void* p, std::size_t n) {
    sum_.add(p, n);
    ok_ = ok_ && f_ != nullptr && std::fwrite(p, 1, n, f_) == n;
  }
  template <typename T>
  void put(const T& x) { put(&x, sizeof x); }
  void put_string(const std::string& s) {
    put(std::uint32_t(s.size()));
    put(s.data(), s.size());
  }
  // Appends the checksum, flushes and fsyncs; returns an error or "".
  std::string close(std::uint64_t* checksum) {
    if (f_ == nullptr) return fmt::format("cannot create {}: {}", path_.string(), std::strerror(errno));
    const std::uint64_t h = sum_.value();
    ok_ = ok_ && std::fwrite(&h, sizeof h, 1, f_) == 1 && std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
    ok_ = std::fclose(f_) == 0 && ok_;
    f_ = nullptr;
    if (checksum != nullptr) *checksum = h;
    return ok_ ? "" : fmt::format("cannot write {}: {}", path_.string(), std::strerror(errno));
  }

 private:
  fs::path path_;
  std::FILE* f_;
  Checksum sum_;
  bool ok_ = true;
};

class Reader {
 public:
  explicit Reader(const fs::path& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) { ok_ = f_ != nullptr; }
  ~Reader() {
    if (f_ != nullptr) std::fclose(f_);
  }
  bool ok() const { return ok_; }
  void get(void* p, std::size_t n) {
    ok_ = ok_ && std::fread(p, 1, n, f_) == n;
    if (ok_) sum_.add(p, n);
  }
  template <typename T>
  T get() {
    T x{};
    get(&x, sizeof x);
    return x;
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    std::string s(ok_ && n < (1u << 20) ? n : 0, '\0');
    if (n >= (1u << 20)) ok_ = false;
    get(s.data(), s.size());
    return s;
  }
  // The header every file starts with.
  bool header(const char (&magic)[8]) {
    char m[8] = {};
    get(m, sizeof m);
    return ok_ && std::memcmp(m, magic, sizeof m) == 0 && get<std::uint32_t>() == kVersion;
  }
  // After the last field: the stored checksum matches, nothing follows.
  bool finish() {
    const std::uint64_t want = sum_.value();
    std::uint64_t stored = 0;
    return ok_ && std::fread(&stored, sizeof stored, 1, f_) == 1 && stored == want && std::fgetc(f_) == EOF;
  }
  std::string opened_error() const { return fmt::format("cannot open {}: {}", path_.string(), std::strerror(errno)); }

 private:
  fs::path path_;
  std::FILE* f_;
  Checksum sum_;
  bool ok_ = true;
};

constexpr char kGlobalMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'G', 'L'};
std::string global_file(int rank) { return fmt::format("global-{:05d}.bin", rank); }

// This rank's file: magic, version, the tensor table (name, count), the
// data in that order, then the checksum.
std::string write_rank_file(const fs::path& path, const std::vector<strategies::StateTensor>& tensors,
                            std::uint64_t* checksum) {
  Writer w(path);
  w.put(kMagic, sizeof kMagic);
  w.put(kVersion);
  w.put(std::uint32_t(tensors.size()));
  for (const auto& t : tensors) {
    w.put_string(t.name);
    w.put(t.count);
  }
  // Through host memory: the tensors may be on the device.
  std::vector<std::byte> host;
  for (const auto& t : tensors) {
    host.resize(std::size_t(t.bytes()));
    kernels::copy_bytes(host.data(), t.data, host.size());
    w.put(host.data(), host.size());
  }
  return w.close(checksum);
}

std::string read_rank_file(const fs::path& path, const std::vector<strategies::StateTensor>& tensors) {
  Reader r(path);
  if (!r.ok()) return r.opened_error();
  if (!r.header(kMagic)) return fmt::format("{} is not a strata checkpoint file of version {}", path.string(), kVersion);
  const auto count = r.get<std::uint32_t>();
  if (count != tensors.size())
    return fmt::format("{} holds {} state tensors, this run has {}", path.string(), count, tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = r.get_string();
    const auto n = r.get<std::int64_t>();
    if (!r.ok() || name != tensors[i].name || n != tensors[i].count)
      return fmt::format("{}: tensor {} is '{}' of {} elements, this run has '{}' of {}", path.string(), i, name, n,
                         tensors[i].name, tensors[i].count);
  }
  std::vector<std::byte> host;
  for (const auto& t : tensors) {
    host.resize(std::size_t(t.bytes()));
    r.get(host.data(), host.size());
    kernels::copy_bytes(t.data, host.data(), host.size());
  }
  return r.finish() ? "" : fmt::format("{} is truncated or corrupt (checksum)", path.string());
}

// The layout-independent file: per parameter of `reg`, its name, local and
// global shape and tp/ep slices, then its parameters, m and v.
std::string write_global_file(const fs::path& path, const models::ParamRegistry& reg,
                              const strategies::FullState& full, std::uint64_t* checksum) {
  Writer w(path);
  w.put(kGlobalMagic, sizeof kGlobalMagic);
  w.put(kVersion);
  w.put(std::uint32_t(reg.specs().size()));
  for (const auto& s : reg.specs()) {
    w.put_string(s.name);
    w.put(std::uint32_t(s.shape.size()));
    for (std::size_t d = 0; d < s.shape.size(); ++d) {
      w.put(s.shape[d]);
      w.put(s.global_shape[d]);
    }
    for (const models::Slice& sl : {s.tp, s.ep}) {
      w.put(std::int32_t(sl.split_dim));
      w.put(std::int32_t(sl.sections));
      w.put(std::int32_t(sl.parts));
      w.put(std::int32_t(sl.part));
    }
    for (const auto* v : {&full.params, &full.m, &full.v}) w.put(v->data() + s.offset, sizeof(float) * std::size_t(s.numel));
  }
  return w.close(checksum);
}

// Whole tensors by name, assembled from global files: values of params, m,
// v at every global index, and which indices some file provided.
struct GlobalTensor {
  std::vector<float> params, m, v;
  std::vector<char> have;
};

// Tensors whose name is not a key of `out` are read (the checksum covers
// them) but not kept.
std::string read_global_file(const fs::path& path, std::map<std::string, GlobalTensor>& out) {
  Reader r(path);
  if (!r.ok()) return r.opened_error();
  if (!r.header(kGlobalMagic)) return fmt::format("{} is not a strata global state file", path.string());
  const auto count = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; r.ok() && i < count; ++i) {
    models::ParamSpec s;
    s.name = r.get_string();
    const auto nd = r.get<std::uint32_t>();
    if (nd > 8) return fmt::format("{} is corrupt", path.string());
    std::int64_t local = 1, global = 1;
    for (std::uint32_t d = 0; d < nd; ++d) {
      s.shape.push_back(r.get<std::int64_t>());
      s.global_shape.push_back(r.get<std::int64_t>());
      local *= s.shape.back(), global *= s.global_shape.back();
    }
    for (models::Slice* sl : {&s.tp, &s.ep}) {
      sl->split_dim = r.get<std::int32_t>();
      sl->sections = r.get<std::int32_t>();
      sl->parts = r.get<std::int32_t>();
      sl->part = r.get<std::int32_t>();
    }
    s.numel = local;
    std::vector<float> buf(static_cast<std::size_t>(local));
    const auto it = out.find(s.name);
    if (it == out.end()) {
      for (int k = 0; k < 3; ++k) r.get(buf.data(), sizeof(float) * buf.size());
      continue;
    }
    GlobalTensor& g = it->second;
    if (g.have.empty()) {
      g.params.assign(std::size_t(global), 0.0f), g.m.assign(std::size_t(global), 0.0f);
      g.v.assign(std::size_t(global), 0.0f), g.have.assign(std::size_t(global), 0);
    }
    if (std::int64_t(g.have.size()) != global)
      return fmt::format("{}: '{}' has {} elements, another file says {}", path.string(), s.name, global,
                         g.have.size());
    for (auto* dst : {&g.params, &g.m, &g.v}) {
      r.get(buf.data(), sizeof(float) * buf.size());
      for (std::int64_t k = 0; r.ok() && k < local; ++k) (*dst)[std::size_t(s.global_index(k))] = buf[std::size_t(k)];
    }
    for (std::int64_t k = 0; k < local; ++k) g.have[std::size_t(s.global_index(k))] = 1;
  }
  return r.finish() ? "" : fmt::format("{} is truncated or corrupt (checksum)", path.string());
}

// The [model] section of a resolved deck: what fixes the parameters' shapes
// (recomputation, which does not, left out).
std::string model_section(const std::string& resolved) {
  const auto a = resolved.find("[model]");
  if (a == std::string::npos) return "";
  const auto b = resolved.find("\n[", a + 1);
  std::istringstream in(resolved.substr(a, b == std::string::npos ? std::string::npos : b - a));
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (!line.starts_with("recompute")) out += line + "\n";
  return out;
}

}  // namespace

std::string CheckpointLayout::describe() const {
  std::string sizes = text;
  if (sizes.empty())
    for (const auto& [name, n] : axes) sizes += fmt::format("{}{} {}", sizes.empty() ? "" : ", ", name, n);
  return fmt::format("{} rank(s): {}, zero {}, virtual_stages {}, {}{}", world, sizes, zero, virtual_stages, precision,
                     placement.empty() ? "" : ", " + placement);
}

CheckpointLayout checkpoint_layout(const mesh::Layout& l, const plan::Plan& p, const std::string& resolved_deck) {
  CheckpointLayout c;
  c.world = l.world();
  c.zero = p.parallel.zero;
  c.virtual_stages = l.size("pp") > 1 ? p.parallel.virtual_stages : 1;
  for (const mesh::Dim& d : l.dims) c.axes[d.name] = d.size;
  for (const mesh::Group& g : l.groups) c.axes[g.name] = l.group_size(g.name);
  c.text = mesh::describe(l);
  c.run_name = p.run.name;
  c.resolved_deck = resolved_deck;
  c.precision = core::precision_name(p.backend.precision);
  if (const int pp = l.size("pp"); pp > 1) {
    const int v = c.virtual_stages;
    const strategies::pp::Shape shape{pp, 1, v};
    const std::vector<int> blocks = models::stage_block_counts(p.model.layers, pp * v, p.parallel.first_stage_layers,
                                                               p.parallel.last_stage_layers);
    std::vector<int> first(blocks.size() + 1, 1);  // the first block of each stage (1-based)
    for (std::size_t s = 0; s < blocks.size(); ++s) first[s + 1] = first[s] + blocks[s];
    for (int r = 0; r < pp; ++r) {
      std::string held;
      for (int ch = 0; ch < v; ++ch) {
        const int s = p.parallel.schedule->placement->stage_of(shape, r, ch);
        const int a = first[std::size_t(s)], b = first[std::size_t(s) + 1] - 1;
        held += fmt::format("{}{}", held.empty() ? "" : ", ",
                            b < a ? std::string("none") : a == b ? std::to_string(a) : fmt::format("{}-{}", a, b));
      }
      c.placement += fmt::format("{}pp {}: blocks {}", r == 0 ? "" : "; ", r, held);
    }
  }
  return c;
}

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, int step, const CheckpointLayout& layout,
                             strategies::StateStrategy& strategy, const models::ParamRegistry& reg,
                             bool global_writer, const ScalerState& scaler) {
  const strategies::FullState full = strategy.full_state();  // collective: before any rank writes
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  const fs::path root(dir), final_dir = root / step_name(step), partial = root / fmt::format(".{}.partial", step_name(step));
  std::string err;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    fs::remove_all(partial, ec);  // left by a job that died while writing this step
    if (!fs::create_directories(partial, ec) || ec)
      err = fmt::format("cannot create checkpoint directory {}: {}", partial.string(), ec.message());
  }
  agree(comm, err, core::ErrorKind::runtime);

  std::uint64_t checksum = 0, global_checksum = 0;
  strategy.hold_state_in_memory(true);  // NVMe offload: the state where state_tensors() points
  err = write_rank_file(partial / rank_file(rank), strategy.state_tensors(), &checksum);
  strategy.hold_state_in_memory(false);
  if (err.empty() && global_writer) err = write_global_file(partial / global_file(rank), reg, full, &global_checksum);
  // A job killed here, with some ranks' files written and no manifest,
  // must leave every earlier checkpoint loadable (the kill test).
  if (const char* v = std::getenv("STRATA_INJECT_CHECKPOINT_KILL"); v != nullptr && rank == 0 && std::atoi(v) == step)
    std::raise(SIGKILL);
  agree(comm, err, core::ErrorKind::runtime);
  std::vector<unsigned long long> sums(static_cast<std::size_t>(2 * size));
  unsigned long long mine[2] = {checksum, global_checksum};
  STRATA_CHECK_MPI(MPI_Gather(mine, 2, MPI_UNSIGNED_LONG_LONG, sums.data(), 2, MPI_UNSIGNED_LONG_LONG, 0, comm));
  std::vector<int> writers(static_cast<std::size_t>(size));
  const int writes = global_writer;
  STRATA_CHECK_MPI(MPI_Gather(&writes, 1, MPI_INT, writers.data(), 1, MPI_INT, 0, comm));

  if (rank == 0) {
    toml::table m;
    m.insert("schema", "strata-checkpoint");
    m.insert("schema_version", int64_t(kVersion));
    m.insert("step", int64_t(step));
    toml::table l;
    l.insert("world", int64_t(layout.world));
    l.insert("zero", int64_t(layout.zero));
    l.insert("virtual_stages", int64_t(layout.virtual_stages));
    // Every other integer of [layout] is an axis's size.
    for (const auto& [name, n] : layout.axes) l.insert(name, int64_t(n));
    l.insert("text", layout.text);
    l.insert("placement", layout.placement);
    l.insert("precision", layout.precision);
    l.insert("run_name", layout.run_name);
    m.insert("layout", std::move(l));
    toml::table sc;
    sc.insert("scale", scaler.scale);
    sc.insert("good_steps", int64_t(scaler.good_steps));
    sc.insert("skipped_steps", int64_t(scaler.skipped_steps));
    m.insert("loss_scale", std::move(sc));
    toml::array files, checksums;
    for (int r = 0; r < size; ++r) {
      files.push_back(rank_file(r));
      checksums.push_back(hex(sums[std::size_t(2 * r)]));
    }
    m.insert("files", std::move(files));
    m.insert("checksums", std::move(checksums));
    toml::array globals, global_sums;
    for (int r = 0; r < size; ++r)
      if (writers[std::size_t(r)]) {
        globals.push_back(global_file(r));
        global_sums.push_back(hex(sums[std::size_t(2 * r + 1)]));
      }
    m.insert("global_files", std::move(globals));
    m.insert("global_checksums", std::move(global_sums));
    m.insert("resolved_deck", layout.resolved_deck);
    {
      std::ostringstream body;
      body << m << "\n";
      std::ofstream out(partial / kManifest, std::ios::binary);
      out << seal_manifest(body.str());
      out.flush();
      if (!out) err = fmt::format("cannot write {}", (partial / kManifest).string());
    }
    fsync_path(partial / kManifest);
    fsync_path(partial);
    // Publish: the rename is atomic. An older checkpoint of the same step
    // (a run repeated over it) is moved aside first and removed after.
    std::error_code ec;
    const fs::path aside = root / fmt::format(".{}.replaced", step_name(step));
    if (err.empty() && fs::exists(final_dir)) {
      fs::remove_all(aside, ec);
      fs::rename(final_dir, aside, ec);
    }
    if (err.empty()) {
      fs::rename(partial, final_dir, ec);
      if (ec) err = fmt::format("cannot rename {} to {}: {}", partial.string(), final_dir.string(), ec.message());
    }
    fsync_path(root);
    fs::remove_all(aside, ec);
  }
  agree(comm, err, core::ErrorKind::runtime);
  return final_dir.string();
}

namespace {

// "step-000012" -> 12; -1 for any other name.
int step_of_name(const std::string& name) {
  int k = -1;
  if (name.size() != 11 || !name.starts_with("step-") ||
      name.find_first_not_of("0123456789", 5) != std::string::npos || std::sscanf(name.c_str() + 5, "%d", &k) != 1)
    return -1;
  return k;
}

// A checkpoint's manifest, read and checked on rank 0: its own checksum, its
// schema and version, the step its directory's name says, and a checksum for
// every file it lists. `files`: "name checksum" per line.
std::string read_manifest(const fs::path& dir, toml::table* table, std::string* files) {
  std::error_code ec;
  if (!fs::exists(dir / kManifest, ec)) return fmt::format("no {} (not a complete checkpoint)", kManifest);
  std::string text;
  try {
    text = core::read_input_file((dir / kManifest).string(), "checkpoint manifest");
  } catch (const core::Error& e) {
    return e.what();
  }
  std::string body;
  if (std::string why = unseal_manifest(text, &body); !why.empty()) return why;
  try {
    *table = toml::parse(body, (dir / kManifest).string());
  } catch (const std::exception& e) {
    return fmt::format("its manifest does not parse: {}", e.what());
  }
  const toml::table& m = *table;
  if (m["schema"].value_or(std::string()) != "strata-checkpoint" || m["layout"].as_table() == nullptr)
    return "its manifest is not a strata checkpoint's";
  if (const auto v = m["schema_version"].value_or(int64_t(0)); v != kVersion)
    return fmt::format("checkpoint format version {}, this strata reads version {}", v, kVersion);
  const int named = step_of_name(dir.filename().string());
  if (const auto step = m["step"].value_or(int64_t(-1)); named >= 0 && step != named)
    return fmt::format("its manifest says step {}, its directory step {}", step, named);
  files->clear();
  for (const auto& [names, sums] : {std::pair{"files", "checksums"}, std::pair{"global_files", "global_checksums"}}) {
    const toml::array* f = m[names].as_array();
    const toml::array* c = m[sums].as_array();
    if (f == nullptr || c == nullptr || f->size() != c->size())
      return fmt::format("its manifest lists {} without a checksum each", names);
    for (std::size_t k = 0; k < f->size(); ++k)
      *files += (*f)[k].value_or(std::string("?")) + " " + (*c)[k].value_or(std::string("?")) + "\n";
  }
  return "";
}

}  // namespace

void prune_checkpoints(const std::string& dir, int step, int keep) {
  if (keep <= 0) return;
  std::vector<std::pair<int, fs::path>> earlier;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int k = step_of_name(e.path().filename().string());
    if (k >= 0 && k < step && e.is_directory(ec)) earlier.push_back({k, e.path()});
  }
  std::sort(earlier.begin(), earlier.end());
  const std::size_t stays = std::size_t(keep - 1);
  for (std::size_t i = 0; i + stays < earlier.size(); ++i) fs::remove_all(earlier[i].second, ec);
}

CheckpointRef find_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointLayout& layout) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  // Rank 0 lists the candidates: the one named, or every step-NNNNNN of a
  // directory of them, newest first.
  std::string err;
  std::vector<std::string> candidates;
  int named = 0;
  if (rank == 0) {
    std::error_code ec;
    const fs::path p(path);
    if (!fs::is_directory(p, ec)) {
      err = fmt::format("--resume {}: no such directory", path);
    } else if (fs::exists(p / kManifest, ec) || step_of_name(p.filename().string()) >= 0) {
      candidates.push_back(p.string());
      named = 1;
    } else {
      std::vector<std::pair<int, std::string>> steps;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (const int k = step_of_name(e.path().filename().string()); k >= 0 && e.is_directory(ec))
          steps.emplace_back(k, e.path().string());
      std::sort(steps.rbegin(), steps.rend());
      for (const auto& [k, d] : steps) candidates.push_back(d);
      if (candidates.empty())
        err = fmt::format("--resume {}: no complete checkpoint there (a step-NNNNNN directory with {})", path,
                          kManifest);
    }
  }
  agree(comm, err, core::ErrorKind::input);
  int count = int(candidates.size());
  STRATA_CHECK_MPI(MPI_Bcast(&count, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&named, 1, MPI_INT, 0, comm));

  // The newest that verifies: rank 0 checks its manifest, then the ranks
  // share out its files (file k to rank k mod size) and check each one's
  // checksum against the manifest's.
  toml::table manifest;
  std::string dir, skipped;
  for (int i = 0; i < count && dir.empty(); ++i) {
    std::string why, files;
    const std::string candidate = comm::broadcast_string(rank == 0 ? candidates[std::size_t(i)] : "", comm);
    if (rank == 0) why = read_manifest(candidate, &manifest, &files);
    why = comm::broadcast_string(why, comm);
    if (why.empty()) {
      std::istringstream lines(comm::broadcast_string(files, comm));
      std::string mine, name, sum;
      for (int k = 0; lines >> name >> sum; ++k)
        if (k % size == rank && mine.empty()) mine = verify_file(fs::path(candidate) / name, sum);
      why = failure_text(comm, mine);
    }
    if (why.empty()) {
      dir = candidate;
      break;
    }
    if (named) core::input_error("--resume {}: the checkpoint fails verification: {}", path, why);
    skipped += fmt::format("resume: skipped {}: {}\n", fs::path(candidate).filename().string(), why);
  }
  if (rank == 0) fmt::print("{}", skipped);
  if (dir.empty())
    core::input_error("--resume {}: no complete, verified checkpoint there:\n{}", path, skipped);

  std::string saved_text, globals_text;
  int step = 0, reshard = 0, good = 0, skipped_steps = 0, same_precision = 1;
  double scale = 1;
  if (rank == 0) {
    const toml::table& m = manifest;
    const toml::table* l = m["layout"].as_table();
    step = int(m["step"].value_or(int64_t(-1)));
    CheckpointLayout saved;
    auto get = [&](const char* k) { return int((*l)[k].value_or(int64_t(-1))); };
    saved.world = get("world"), saved.zero = get("zero"), saved.virtual_stages = get("virtual_stages");
    for (const auto& [key, value] : *l)
      if (value.is_integer() && key != "world" && key != "zero" && key != "virtual_stages")
        saved.axes[std::string(key.str())] = int(value.value_or(int64_t(0)));
    saved.text = (*l)["text"].value_or(std::string());
    saved.placement = (*l)["placement"].value_or(std::string());
    saved.precision = (*l)["precision"].value_or(std::string("fp32"));
    scale = m["loss_scale"]["scale"].value_or(1.0);
    good = int(m["loss_scale"]["good_steps"].value_or(int64_t(0)));
    skipped_steps = int(m["loss_scale"]["skipped_steps"].value_or(int64_t(0)));
    same_precision = saved.precision == layout.precision;
    const std::string deck = m["resolved_deck"].value_or(std::string());
    reshard = !(saved == layout);
    saved_text = saved.describe();
    if (const toml::array* g = m["global_files"].as_array())
      for (const auto& x : *g) globals_text += x.value_or(std::string()) + "\n";
    if (reshard && globals_text.empty())
      err = fmt::format("--resume {}: the checkpoint was written by {}; this run is {}, and the checkpoint has "
                        "no global state files to re-shard from: resume with its layout",
                        dir, saved.describe(), layout.describe());
    else if (model_section(deck) != model_section(layout.resolved_deck))
      err = fmt::format("--resume {}: the checkpoint's model differs from this deck's:\n{}\nversus\n{}", dir,
                        model_section(deck), model_section(layout.resolved_deck));
    if (err.empty()) {
      // The data stream is keyed by run.seed: another seed is another
      // stream from the resumed step on. Allowed, and said.
      auto seed = [](const std::string& resolved) -> std::optional<std::int64_t> {
        try {
          return toml::parse(resolved)["run"]["seed"].value<std::int64_t>();
        } catch (const std::exception&) {
          return std::nullopt;
        }
      };
      const auto was = seed(deck), now = seed(layout.resolved_deck);
      if (was && now && *was != *now)
        fmt::print("--resume {}: the checkpoint's run.seed is {}, this run's {}: the data from step {} on differs "
                   "from what the checkpointed run would have read\n",
                   dir, *was, *now, step + 1);
    }
  }
  agree(comm, err, core::ErrorKind::input);
  CheckpointRef ref;
  ref.dir = dir;
  STRATA_CHECK_MPI(MPI_Bcast(&step, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&reshard, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&good, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&skipped_steps, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&same_precision, 1, MPI_INT, 0, comm));
  STRATA_CHECK_MPI(MPI_Bcast(&scale, 1, MPI_DOUBLE, 0, comm));
  ref.step = step;
  ref.reshard = reshard != 0;
  ref.scaler = {scale, good, skipped_steps};
  ref.same_precision = same_precision != 0;
  ref.saved_layout = comm::broadcast_string(saved_text, comm);
  std::istringstream lines(comm::broadcast_string(globals_text, comm));
  for (std::string f; std::getline(lines, f);) ref.global_files.push_back(f);
  return ref;
}

void load_checkpoint(MPI_Comm comm, const CheckpointRef& ref, strategies::StateStrategy& strategy,
                     const models::ParamRegistry& reg) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  if (!ref.reshard) {
    strategy.hold_state_in_memory(true);
    const std::string err = read_rank_file(fs::path(ref.dir) / rank_file(rank), strategy.state_tensors());
    strategy.hold_state_in_memory(false);  // back to the NVMe file
    agree(comm, err, core::ErrorKind::runtime);
    return;
  }
  // Another layout: the whole tensors this rank's registry names, from every
  // global file (each holds some ranks' slices), then this rank's slices.
  std::string err;
  std::map<std::string, GlobalTensor> found;
  for (const auto& s : reg.specs()) found[s.name];  // the tensors this rank's registry holds
  for (const auto& f : ref.global_files) {
    err = read_global_file(fs::path(ref.dir) / f, found);
    if (!err.empty()) break;
  }
  strategies::FullState st;
  for (auto* v : {&st.params, &st.m, &st.v}) v->assign(std::size_t(reg.numel()), 0.0f);
  for (const auto& s : reg.specs()) {
    if (!err.empty()) break;
    const GlobalTensor& g = found.at(s.name);
    if (g.have.empty()) {
      err = fmt::format("{}: the checkpoint holds no parameter '{}'", ref.dir, s.name);
      break;
    }
    for (std::int64_t k = 0; k < s.numel && err.empty(); ++k) {
      const std::size_t gi = std::size_t(s.global_index(k));
      if (gi >= g.have.size() || !g.have[gi]) {
        err = fmt::format("{}: element {} of '{}' is in none of its global files", ref.dir, gi, s.name);
        break;
      }
      const std::size_t at = std::size_t(s.offset + k);
      st.params[at] = g.params[gi], st.m[at] = g.m[gi], st.v[at] = g.v[gi];
    }
  }
  agree(comm, err, core::ErrorKind::runtime);
  strategy.set_full_state(st);
}

}  // namespace strata::train
