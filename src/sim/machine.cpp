#include "src/sim/machine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "kernels/foundation/error.hpp"
#include "kernels/foundation/input_file.hpp"
#include "src/deck/deck.hpp"

namespace strata::sim {
namespace fs = std::filesystem;

namespace {

// No figure of a machine in the units its file uses (GiB, TFLOP/s, GB/s,
// microseconds, elements, shares) is beyond this: a value above is a typo or
// a unit mistake, and would carry a prediction to absurd sizes.
constexpr double kLargestFigure = 1e9;

// Reads typed figures from the description's tables, each error naming
// the file, the line and the dotted key.
class Reader {
 public:
  Reader(const std::string& path, const toml::table& root) : path_(path), root_(root) {}

  const toml::table* table(const std::string& dotted, bool required = true) const {
    const toml::node* n = root_.at_path(dotted).node();
    if (n == nullptr) {
      if (required) core::input_error("{}: [{}] is missing", path_, dotted);
      return nullptr;
    }
    if (!n->is_table()) fail(*n, dotted, "must be a table");
    return n->as_table();
  }

  // Positive figures are at least a millionth of their unit, for the same reason.
  static constexpr double kLargest = kLargestFigure, kSmallestPositive = 1e-6;

  // A number >= 0 (or > 0 with positive: then at least kSmallestPositive),
  // at most kLargest; `unit` says what it is in errors.
  double number(const std::string& dotted, const char* unit, bool positive = false, bool required = true,
                double fallback = 0) const {
    const toml::node* n = root_.at_path(dotted).node();
    if (n == nullptr) {
      if (!required) return fallback;
      const std::string parent = dotted.find('.') == std::string::npos ? "" : dotted.substr(0, dotted.rfind('.'));
      const toml::node* p = parent.empty() ? nullptr : root_.at_path(parent).node();
      core::input_error("{}:{}: {} is missing: a number ({})", path_, p != nullptr ? p->source().begin.line : 1,
                        dotted, unit);
    }
    std::optional<double> v = n->value<double>();
    if (!v) fail(*n, dotted, fmt::format("must be a number ({})", unit));
    // NaN passes every comparison: finiteness first.
    if (!std::isfinite(*v)) fail(*n, dotted, fmt::format("must be a finite number ({}), got {}", unit, *v));
    if (*v < 0 || (positive && *v == 0))
      fail(*n, dotted, fmt::format("must be {} 0 ({}), got {}", positive ? ">" : ">=", unit, *v));
    if (*v > kLargest || (positive && *v < kSmallestPositive))
      fail(*n, dotted, fmt::format("must be in [{:g}, {:g}] ({}), got {:g}", positive ? kSmallestPositive : 0.0, kLargest,
                                   unit, *v));
    return *v;
  }

  // An optional array of numbers >= 0 (empty when absent).
  std::vector<double> numbers(const std::string& dotted, const char* unit, double largest) const {
    std::vector<double> out;
    const toml::node* n = root_.at_path(dotted).node();
    if (n == nullptr) return out;
    const toml::array* a = n->as_array();
    if (a == nullptr) fail(*n, dotted, fmt::format("must be an array of numbers ({})", unit));
    for (const toml::node& e : *a) {
      const std::optional<double> v = e.value<double>();
      if (!v || !std::isfinite(*v) || *v < 0 || *v > largest)
        fail(e, dotted, fmt::format("must hold numbers in [0, {:g}] ({})", largest, unit));
      out.push_back(*v);
    }
    return out;
  }

  std::string string(const std::string& dotted, const std::vector<std::string>& allowed = {}) const {
    const toml::node* n = root_.at_path(dotted).node();
    if (n == nullptr) core::input_error("{}:1: {} is missing: a string", path_, dotted);
    std::optional<std::string> v = n->value<std::string>();
    if (!v) fail(*n, dotted, "must be a string");
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), *v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + fmt::format("\"{}\"", a);
      fail(*n, dotted, fmt::format("must be one of {}, got \"{}\"", list, *v));
    }
    return *v;
  }

  // A positive whole number.
  int count(const std::string& dotted, const char* unit) const {
    const toml::node* n = root_.at_path(dotted).node();
    if (n == nullptr) core::input_error("{}:1: {} is missing: a whole number ({})", path_, dotted, unit);
    const std::optional<std::int64_t> v = n->value_exact<std::int64_t>();
    if (!v || *v < 1 || *v > (1 << 24)) fail(*n, dotted, fmt::format("must be a whole number from 1 ({})", unit));
    return int(*v);
  }

  // Every key of the table at `dotted` ("" for the root) is one of `known`.
  void only(const std::string& dotted, const std::vector<std::string>& known) const {
    const toml::node* n = dotted.empty() ? &root_ : root_.at_path(dotted).node();
    if (n == nullptr || !n->is_table()) return;
    for (const auto& [key, value] : *n->as_table()) {
      const std::string k(key.str());
      if (std::find(known.begin(), known.end(), k) != known.end()) continue;
      std::string list;
      for (const auto& a : known) list += (list.empty() ? "" : ", ") + a;
      core::input_error("{}:{}: unknown key {}{}; known there: {}", path_, key.source().begin.line ? key.source().begin.line : value.source().begin.line,
                        dotted.empty() ? "" : dotted + ".", k, list);
    }
  }

  [[noreturn]] void fail(const toml::node& n, const std::string& dotted, const std::string& why) const {
    core::input_error("{}:{}: {} {}", path_, n.source().begin.line, dotted, why);
  }

 private:
  const std::string& path_;
  const toml::table& root_;
};

std::vector<fs::path> search_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("STRATA_MACHINES")) dirs.emplace_back(env);
  dirs.emplace_back("inputs/machines");
#ifdef STRATA_SOURCE_DIR
  dirs.emplace_back(fs::path(STRATA_SOURCE_DIR) / "inputs" / "machines");
#endif
  return dirs;
}

}  // namespace

Machine parse_machine(const std::string& path, const std::string& text) {
  const toml::table root = deck::parse_toml(path, text);
  const Reader r(path, root);
  Machine m;
  m.path = path;
  m.name = r.string("name");
  if (const toml::node* d = root.get("description"); d != nullptr && d->is_string()) m.description = *d->value<std::string>();
  r.only("", {"name", "description", "devices_per_node", "device", "host", "network", "kernels"});
  r.only("device", {"kind", "memory_gib", "host_memory_gib", "peak_tflops_fp32", "peak_tflops_bf16", "peak_tflops_fp16",
                    "matmul_efficiency", "matmul_half_dim", "vector_tflops", "memory_bandwidth_gbs",
                    "launch_latency_us", "host_link_gbs", "nvme_gbs"});
  r.only("host", {"vector_tflops", "memory_bandwidth_gbs"});
  r.only("network", {"overlap", "compute_slowdown", "node", "cluster", "fit"});
  r.only("network.node", {"bandwidth_gbs", "latency_us"});
  r.only("network.cluster", {"bandwidth_gbs", "latency_us"});
  m.devices_per_node = r.count("devices_per_node", "devices in one node");

  r.table("device");
  m.gpu = r.string("device.kind", {"gpu", "cpu"}) == "gpu";
  m.memory = r.number("device.memory_gib", "GiB per device", true) * double(1ull << 30);
  m.host_memory = r.number("device.host_memory_gib", "GiB of host memory per node", true) * double(1ull << 30);
  m.peak_fp32 = r.number("device.peak_tflops_fp32", "TFLOP/s", true) * 1e12;
  m.peak_bf16 = r.number("device.peak_tflops_bf16", "TFLOP/s", true) * 1e12;
  m.peak_fp16 = r.number("device.peak_tflops_fp16", "TFLOP/s", true) * 1e12;
  m.matmul_efficiency = r.number("device.matmul_efficiency", "share of peak, at most 1", true);
  if (m.matmul_efficiency > 1)
    r.fail(*root.at_path("device.matmul_efficiency").node(), "device.matmul_efficiency", "must be at most 1");
  m.matmul_half_dim = r.number("device.matmul_half_dim", "elements");
  m.vector_flops = r.number("device.vector_tflops", "TFLOP/s", true) * 1e12;
  m.memory_bandwidth = r.number("device.memory_bandwidth_gbs", "GB/s achieved", true) * 1e9;
  m.launch_latency = r.number("device.launch_latency_us", "microseconds") * 1e-6;
  m.host_link_bandwidth = r.number("device.host_link_gbs", "GB/s; 0 when device and host share memory") * 1e9;
  m.nvme_bandwidth = r.number("device.nvme_gbs", "GB/s; 0 without NVMe", false, false) * 1e9;

  if (m.gpu) {
    r.table("host");
    m.host_vector_flops = r.number("host.vector_tflops", "TFLOP/s of the host's cores per device", true) * 1e12;
    m.host_memory_bandwidth = r.number("host.memory_bandwidth_gbs", "GB/s of host memory per device", true) * 1e9;
  } else {
    m.host_vector_flops = m.vector_flops;
    m.host_memory_bandwidth = m.memory_bandwidth;
  }

  r.table("network");
  m.overlap = r.number("network.overlap", "share of a non-blocking transfer made while computing, 0 to 1");
  if (m.overlap > 1) r.fail(*root.at_path("network.overlap").node(), "network.overlap", "must be at most 1");
  if (const toml::node* n = root.at_path("network.compute_slowdown").node(); n != nullptr) {
    m.compute_slowdown = r.number("network.compute_slowdown", "a kernel's time beside communication over its time alone");
    if (m.compute_slowdown < 1 || m.compute_slowdown > 10)
      r.fail(*n, "network.compute_slowdown", "must be from 1 (no slowdown) to 10");
  }
  r.table("network.node");
  m.node.bandwidth = r.number("network.node.bandwidth_gbs", "GB/s of bus bandwidth inside a node", true) * 1e9;
  m.node.latency = r.number("network.node.latency_us", "microseconds per ring step") * 1e-6;
  if (r.table("network.cluster", false) != nullptr) {  // absent: one node only
    m.cluster.bandwidth = r.number("network.cluster.bandwidth_gbs", "GB/s per node, every NIC together", true) * 1e9;
    m.cluster.latency = r.number("network.cluster.latency_us", "microseconds per ring step") * 1e-6;
  }

  if (const toml::table* k = r.table("kernels", false)) {
    for (const auto& [key, node] : *k) {
      const std::string dotted = "kernels." + std::string(key.str());
      m.kernel_factors[std::string(key.str())] = r.number(dotted, "measured time over the model's", true);
    }
  }
  if (const toml::node* fits = root.at_path("network.fit").node()) {
    const toml::array* a = fits->as_array();
    if (a == nullptr) r.fail(*fits, "network.fit", "must be an array of tables ([[network.fit]])");
    for (std::size_t i = 0; i < a->size(); ++i) {
      const std::string at = fmt::format("network.fit[{}]", i);
      r.only(at, {"level", "op", "nonblocking", "group_size", "latency_us", "bandwidth_gbs", "residual", "bytes",
                  "time_us"});
      CommFit f;
      f.level = r.string(at + ".level", {"node", "cluster"});
      f.op = r.string(at + ".op", {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
                                   "all_to_allv", "send", "recv", "barrier"});
      f.group_size = r.count(at + ".group_size", "ranks");
      f.latency = r.number(at + ".latency_us", "microseconds") * 1e-6;
      f.bandwidth = r.number(at + ".bandwidth_gbs", "GB/s of bus bandwidth", true) * 1e9;
      f.residual = r.number(at + ".residual", "relative RMS error", false, false);
      if (const toml::node* nb = root.at_path(at + ".nonblocking").node()) {
        if (!nb->is_boolean()) r.fail(*nb, at + ".nonblocking", "must be true or false");
        f.nonblocking = *nb->value<bool>();
      }
      f.bytes = r.numbers(at + ".bytes", "bytes of a call", 1e15);
      f.seconds = r.numbers(at + ".time_us", "microseconds", kLargestFigure);
      for (double& t : f.seconds) t /= 1e6;
      const toml::node* where = root.at_path(at).node();
      if (f.bytes.size() != f.seconds.size())
        r.fail(*where, at, fmt::format("has {} sizes (bytes) and {} times (time_us): one time per size",
                                       f.bytes.size(), f.seconds.size()));
      for (std::size_t j = 1; j < f.bytes.size(); ++j)
        if (f.bytes[j] <= f.bytes[j - 1]) r.fail(*where, at + ".bytes", "must increase");
      m.fits.push_back(f);
    }
  }
  return m;
}

std::vector<std::string> known_machines() {
  std::vector<std::string> names;
  for (const fs::path& d : search_dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string machine_path(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".toml";
  if (is_path) return name_or_path;
  for (const fs::path& d : search_dirs()) {
    const fs::path p = d / (name_or_path + ".toml");
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

Machine load_machine(const std::string& name_or_path) {
  if (const std::string path = machine_path(name_or_path); !path.empty())
    return parse_machine(path, core::read_input_file(path, "machine description"));
  std::string list;
  for (const auto& n : known_machines()) list += (list.empty() ? "" : ", ") + n;
  core::input_error("--machine {}: no such machine; known: {} (or give a path to a machine description)",
                    name_or_path, list.empty() ? "none found" : list);
}

}  // namespace strata::sim
