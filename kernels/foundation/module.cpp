#include "kernels/foundation/module.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/foundation/error.hpp"

namespace strata::core {

namespace {

struct Loaded {
  void* handle = nullptr;
  std::string path;
};

std::mutex g_mutex;
std::map<std::string, Loaded> g_modules;

std::string program_dir() {
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n <= 0) return "";
  exe.resize(std::size_t(n));
  const auto slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

// STRATA_CUDA_MODULE for "cuda".
std::string path_variable(const std::string& name) {
  std::string var = "STRATA_" + name + "_MODULE";
  std::transform(var.begin(), var.end(), var.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  return var;
}

// The places module `name` is looked for, in order (see module.hpp).
std::vector<std::string> candidates(const std::string& name) {
  const std::string file = "libstrata_" + name + ".so";
  const std::string var = path_variable(name);
  if (const char* p = std::getenv(var.c_str()); p != nullptr && *p != '\0') return {p};
  std::vector<std::string> out;
  if (const std::string dir = program_dir(); !dir.empty()) {
    out.push_back(dir + "/" + file);
    out.push_back(dir + "/../lib/strata/" + file);
  }
  out.push_back(std::string(STRATA_MODULE_DIR) + "/" + file);
  return out;
}

Loaded& load(const std::string& name) {
  Loaded& m = g_modules[name];
  if (m.handle != nullptr) return m;
  const std::vector<std::string> paths = candidates(name);
  std::string looked;
  for (const std::string& path : paths) {
    looked += (looked.empty() ? "" : ", ") + path;
    if (access(path.c_str(), F_OK) != 0) continue;
    // RTLD_NOW: a missing symbol or library is found here, with a message,
    // not at the first call that needs it.
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      runtime_error("module '{}' at {} does not load: {}", name, path, why != nullptr ? why : "(no reason given)");
    }
    m.handle = h;
    m.path = path;
    return m;
  }
  runtime_error("module '{}' (libstrata_{}.so) not found; looked in: {} (set {} to its path)", name, name, looked,
                path_variable(name));
}

}  // namespace

void* module_symbol(const std::string& name, const char* symbol) {
  std::lock_guard lock(g_mutex);
  Loaded& m = load(name);
  dlerror();
  void* p = dlsym(m.handle, symbol);
  if (p == nullptr) runtime_error("module '{}' at {} has no symbol {}", name, m.path, symbol);
  return p;
}

void check_module_table(const std::string& name, const char* entry, int abi, std::size_t size, int want_abi,
                        std::size_t want_size) {
  if (abi != want_abi || size != want_size)
    runtime_error("module '{}' at {} is from another build ({}: table version {}, {} bytes; this program expects {}, "
                  "{} bytes): rebuild it with the program",
                  name, module_path(name), entry, abi, size, want_abi, want_size);
}

std::string module_path(const std::string& name) {
  std::lock_guard lock(g_mutex);
  const auto it = g_modules.find(name);
  return it == g_modules.end() ? "" : it->second.path;
}

}  // namespace strata::core
