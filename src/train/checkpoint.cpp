#include "src/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "src/comm/mpi_check.hpp"
#include "src/core/error.hpp"

namespace strata::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kManifest = "manifest.toml";

std::string step_name(int step) { return fmt::format("step-{:06d}", step); }
std::string rank_file(int rank) { return fmt::format("rank-{:05d}.bin", rank); }

// FNV-1a over the bytes written or read, in order.
struct Checksum {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  }
};

// Every rank learns whether any rank failed; all throw the message of the
// lowest failing rank (so no rank is left waiting in the next collective).
void agree(MPI_Comm comm, const std::string& mine, core::ErrorKind kind) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  int first = mine.empty() ? size : rank;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return;
  long long n = rank == first ? static_cast<long long>(mine.size()) : 0;
  STRATA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_LONG_LONG, first, comm));
  std::string msg = rank == first ? mine : std::string(std::size_t(n), '\0');
  STRATA_CHECK_MPI(MPI_Bcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm));
  throw core::Error(kind, first == rank ? msg : fmt::format("rank {}: {}", first, msg));
}

std::string broadcast_string(MPI_Comm comm, std::string s, int root) {
  long long n = static_cast<long long>(s.size());
  STRATA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm));
  s.resize(std::size_t(n));
  STRATA_CHECK_MPI(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, comm));
  return s;
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// This rank's file: magic, version, the tensor table (name, count), the
// data in that order, then the checksum of everything before it.
std::string write_rank_file(const fs::path& path, const std::vector<strategies::StateTensor>& tensors,
                            std::uint64_t* checksum) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return fmt::format("cannot create {}: {}", path.string(), std::strerror(errno));
  Checksum sum;
  bool ok = true;
  auto put = [&](const void* p, std::size_t n) {
    sum.add(p, n);
    ok = ok && std::fwrite(p, 1, n, f) == n;
  };
  put(kMagic, sizeof kMagic);
  put(&kVersion, sizeof kVersion);
  const std::uint32_t count = std::uint32_t(tensors.size());
  put(&count, sizeof count);
  for (const auto& t : tensors) {
    const std::uint32_t len = std::uint32_t(t.name.size());
    put(&len, sizeof len);
    put(t.name.data(), len);
    put(&t.count, sizeof t.count);
  }
  for (const auto& t : tensors) put(t.data, sizeof(float) * std::size_t(t.count));
  ok = ok && std::fwrite(&sum.h, sizeof sum.h, 1, f) == 1 && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = std::fclose(f) == 0 && ok;
  *checksum = sum.h;
  return ok ? "" : fmt::format("cannot write {}: {}", path.string(), std::strerror(errno));
}

std::string read_rank_file(const fs::path& path, const std::vector<strategies::StateTensor>& tensors) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return fmt::format("cannot open {}: {}", path.string(), std::strerror(errno));
  Checksum sum;
  bool ok = true;
  auto get = [&](void* p, std::size_t n) {
    ok = ok && std::fread(p, 1, n, f) == n;
    if (ok) sum.add(p, n);
  };
  std::string err;
  char magic[8] = {};
  std::uint32_t version = 0, count = 0;
  get(magic, sizeof magic);
  get(&version, sizeof version);
  get(&count, sizeof count);
  if (!ok || std::memcmp(magic, kMagic, sizeof magic) != 0 || version != kVersion) {
    err = fmt::format("{} is not a strata checkpoint file of version {}", path.string(), kVersion);
  } else if (count != tensors.size()) {
    err = fmt::format("{} holds {} state tensors, this run has {}", path.string(), count, tensors.size());
  }
  for (std::size_t i = 0; err.empty() && i < tensors.size(); ++i) {
    std::uint32_t len = 0;
    get(&len, sizeof len);
    std::string name(ok && len < 4096 ? len : 0, '\0');
    get(name.data(), name.size());
    std::int64_t n = 0;
    get(&n, sizeof n);
    if (!ok || name != tensors[i].name || n != tensors[i].count)
      err = fmt::format("{}: tensor {} is '{}' of {} elements, this run has '{}' of {}", path.string(), i, name, n,
                        tensors[i].name, tensors[i].count);
  }
  for (std::size_t i = 0; err.empty() && i < tensors.size(); ++i)
    get(tensors[i].data, sizeof(float) * std::size_t(tensors[i].count));
  std::uint64_t stored = 0;
  const std::uint64_t computed = sum.h;
  if (err.empty() && (std::fread(&stored, sizeof stored, 1, f) != 1 || !ok || stored != computed))
    err = fmt::format("{} is truncated or corrupt (checksum)", path.string());
  std::fclose(f);
  return err;
}

// The [model] section of a resolved deck: what fixes the parameters' shapes.
std::string model_section(const std::string& resolved) {
  const auto a = resolved.find("[model]");
  if (a == std::string::npos) return "";
  const auto b = resolved.find("\n[", a + 1);
  return resolved.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

}  // namespace

std::string CheckpointLayout::describe() const {
  return fmt::format("{} rank(s): pp {} x dp {} x tp {}, ep {}, zero {}, virtual_stages {}", world, pp, dp, tp, ep,
                     zero, virtual_stages);
}

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, int step, const CheckpointLayout& layout,
                             const std::vector<strategies::StateTensor>& tensors) {
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

  std::uint64_t checksum = 0;
  err = write_rank_file(partial / rank_file(rank), tensors, &checksum);
  // A job killed here, with some ranks' files written and no manifest,
  // must leave every earlier checkpoint loadable (the kill test).
  if (const char* v = std::getenv("STRATA_INJECT_CHECKPOINT_KILL"); v != nullptr && rank == 0 && std::atoi(v) == step)
    std::raise(SIGKILL);
  agree(comm, err, core::ErrorKind::runtime);
  std::vector<unsigned long long> sums(static_cast<std::size_t>(size));
  unsigned long long mine = checksum;
  STRATA_CHECK_MPI(MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, sums.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, comm));

  if (rank == 0) {
    toml::table m;
    m.insert("schema", "strata-checkpoint");
    m.insert("schema_version", int64_t(kVersion));
    m.insert("step", int64_t(step));
    toml::table l;
    l.insert("world", int64_t(layout.world));
    l.insert("pp", int64_t(layout.pp));
    l.insert("dp", int64_t(layout.dp));
    l.insert("tp", int64_t(layout.tp));
    l.insert("ep", int64_t(layout.ep));
    l.insert("zero", int64_t(layout.zero));
    l.insert("virtual_stages", int64_t(layout.virtual_stages));
    l.insert("run_name", layout.run_name);
    m.insert("layout", std::move(l));
    toml::array files, checksums;
    for (int r = 0; r < size; ++r) {
      files.push_back(rank_file(r));
      checksums.push_back(fmt::format("{:016x}", sums[std::size_t(r)]));
    }
    m.insert("files", std::move(files));
    m.insert("checksums", std::move(checksums));
    m.insert("resolved_deck", layout.resolved_deck);
    {
      std::ofstream out(partial / kManifest);
      out << m << "\n";
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

CheckpointRef find_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointLayout& layout) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::string err, dir;
  int step = 0;
  if (rank == 0) {
    std::error_code ec;
    fs::path p(path);
    if (!fs::is_directory(p, ec)) {
      err = fmt::format("--resume {}: no such directory", path);
    } else if (!fs::exists(p / kManifest, ec)) {
      // A directory of checkpoints: the complete one of the highest step.
      int best = -1;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        const std::string name = e.path().filename().string();
        int k = -1;
        if (name.size() == 11 && name.starts_with("step-") && std::sscanf(name.c_str() + 5, "%d", &k) == 1 &&
            fs::exists(e.path() / kManifest, ec) && k > best)
          best = k;
      }
      if (best < 0)
        err = fmt::format("--resume {}: no complete checkpoint there (a step-NNNNNN directory with {})", path,
                          kManifest);
      else
        p /= step_name(best);
    }
    if (err.empty()) {
      dir = p.string();
      try {
        const toml::table m = toml::parse_file((p / kManifest).string());
        const toml::table* l = m["layout"].as_table();
        if (m["schema"].value_or(std::string()) != "strata-checkpoint" || l == nullptr)
          throw std::runtime_error("not a strata checkpoint manifest");
        step = int(m["step"].value_or(int64_t(-1)));
        CheckpointLayout saved;
        auto get = [&](const char* k) { return int((*l)[k].value_or(int64_t(-1))); };
        saved.world = get("world"), saved.pp = get("pp"), saved.dp = get("dp"), saved.tp = get("tp");
        saved.ep = get("ep"), saved.zero = get("zero"), saved.virtual_stages = get("virtual_stages");
        const std::string deck = m["resolved_deck"].value_or(std::string());
        if (!(saved == layout))
          err = fmt::format("--resume {}: the checkpoint was written by {}; this run is {}. Resume with the same "
                            "layout (re-sharding onto another one is not built yet)",
                            dir, saved.describe(), layout.describe());
        else if (model_section(deck) != model_section(layout.resolved_deck))
          err = fmt::format("--resume {}: the checkpoint's model differs from this deck's:\n{}\nversus\n{}", dir,
                            model_section(deck), model_section(layout.resolved_deck));
      } catch (const std::exception& e) {
        err = fmt::format("--resume {}: cannot read {}: {}", dir, kManifest, e.what());
      }
    }
  }
  agree(comm, err, core::ErrorKind::input);
  CheckpointRef ref;
  ref.dir = broadcast_string(comm, dir, 0);
  STRATA_CHECK_MPI(MPI_Bcast(&step, 1, MPI_INT, 0, comm));
  ref.step = step;
  return ref;
}

void load_checkpoint(MPI_Comm comm, const CheckpointRef& ref, const std::vector<strategies::StateTensor>& tensors) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  agree(comm, read_rank_file(fs::path(ref.dir) / rank_file(rank), tensors), core::ErrorKind::runtime);
}

}  // namespace strata::train
