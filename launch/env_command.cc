#include "launch/env_command.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <fstream>
#include <sstream>

#include "runtime/core/dtype.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/cpu/onednn.h"

namespace ampdist {
namespace {
using json = nlohmann::json;

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool usable(const NetInterface& i) { return i.up && !i.addresses.empty(); }

// ---- run-time libraries ------------------------------------------------------------------------------------

// The first of `names` that dlopen() loads, or a handle of nullptr and the last dlerror().
struct Library {
  void* handle = nullptr;
  std::string name;   // the name that loaded (or the first tried)
  std::string error;  // dlerror() when none loaded
  template <typename F>
  F sym(const char* symbol) const {
    return handle ? reinterpret_cast<F>(dlsym(handle, symbol)) : nullptr;
  }
};

Library open_library(std::initializer_list<const char*> names) {
  Library lib;
  lib.name = *names.begin();
  for (const char* n : names) {
    dlerror();
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) {
      lib.handle = h;
      lib.name = n;
      lib.error.clear();
      return lib;
    }
    const char* e = dlerror();
    if (lib.error.empty() && e) lib.error = e;
  }
  return lib;
}

json not_found(const Library& lib) { return {{"found", false}, {"library", lib.name}, {"error", lib.error}}; }
json found(const Library& lib, const std::string& version) {
  return {{"found", true}, {"library", lib.name}, {"version", version}};
}
json broken(const Library& lib, const std::string& error) {
  return {{"found", true}, {"library", lib.name}, {"error", error}};
}

json mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, len);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0' || s.back() == ' ')) s.pop_back();
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return {{"found", true}, {"standard", fmt::format("{}.{}", major, minor)}, {"version", s}};
}

// NVML's driver version ("550.54.15").
json gpu_driver() {
  Library lib = open_library({"libnvidia-ml.so.1", "libnvidia-ml.so"});
  if (!lib.handle) return not_found(lib);
  auto init = lib.sym<int (*)()>("nvmlInit_v2");
  auto version = lib.sym<int (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
  auto shutdown = lib.sym<int (*)()>("nvmlShutdown");
  if (!init || !version || !shutdown) return broken(lib, "missing nvmlInit_v2/nvmlSystemGetDriverVersion");
  if (int rc = init()) return broken(lib, fmt::format("nvmlInit_v2 failed (NVML error {})", rc));
  char buf[96] = {};
  const int rc = version(buf, sizeof buf);
  shutdown();
  if (rc) return broken(lib, fmt::format("nvmlSystemGetDriverVersion failed (NVML error {})", rc));
  return found(lib, buf);
}

// The CUDA driver API: its version and every visible device.
json cuda_driver(json& gpus) {
  gpus = json::array();
  Library lib = open_library({"libcuda.so.1", "libcuda.so"});
  if (!lib.handle) return not_found(lib);
  using CUresult = int;
  auto cu_init = lib.sym<CUresult (*)(unsigned)>("cuInit");
  auto cu_version = lib.sym<CUresult (*)(int*)>("cuDriverGetVersion");
  auto cu_count = lib.sym<CUresult (*)(int*)>("cuDeviceGetCount");
  auto cu_get = lib.sym<CUresult (*)(int*, int)>("cuDeviceGet");
  auto cu_name = lib.sym<CUresult (*)(char*, int, int)>("cuDeviceGetName");
  auto cu_attr = lib.sym<CUresult (*)(int*, int, int)>("cuDeviceGetAttribute");
  auto cu_mem = lib.sym<CUresult (*)(size_t*, int)>("cuDeviceTotalMem_v2");
  auto cu_err = lib.sym<CUresult (*)(CUresult, const char**)>("cuGetErrorString");
  if (!cu_init || !cu_version || !cu_count || !cu_get || !cu_name || !cu_attr || !cu_mem)
    return broken(lib, "missing CUDA driver API entry points");
  auto why = [&](const char* call, CUresult rc) {
    const char* s = nullptr;
    if (cu_err) cu_err(rc, &s);
    return fmt::format("{} failed: CUDA error {}{}{}", call, rc, s ? ": " : "", s ? s : "");
  };
  int v = 0;
  if (CUresult rc = cu_version(&v)) return broken(lib, why("cuDriverGetVersion", rc));
  json out = found(lib, cuda_version_string(v));
  if (CUresult rc = cu_init(0)) {
    out["error"] = why("cuInit", rc);  // e.g. CUDA_ERROR_NO_DEVICE: a driver without a usable GPU
    return out;
  }
  int n = 0;
  if (CUresult rc = cu_count(&n)) {
    out["error"] = why("cuDeviceGetCount", rc);
    return out;
  }
  constexpr int kComputeCapabilityMajor = 75, kComputeCapabilityMinor = 76;  // CUdevice_attribute (cuda.h)
  for (int i = 0; i < n; ++i) {
    int dev = 0, major = 0, minor = 0;
    char name[256] = {};
    size_t mem = 0;
    if (cu_get(&dev, i) || cu_name(name, sizeof name, dev) || cu_attr(&major, kComputeCapabilityMajor, dev) ||
        cu_attr(&minor, kComputeCapabilityMinor, dev) || cu_mem(&mem, dev)) {
      gpus.push_back({{"index", i}, {"error", "device query failed"}});
      continue;
    }
    gpus.push_back({{"index", i},
                    {"name", name},
                    {"memory_bytes", static_cast<uint64_t>(mem)},
                    {"compute_capability", fmt::format("{}.{}", major, minor)},
                    {"bf16", major >= 8}});
  }
  return out;
}

json cuda_runtime() {
  Library lib = open_library({"libcudart.so", "libcudart.so.12", "libcudart.so.11.0"});
  if (!lib.handle) return not_found(lib);
  auto get = lib.sym<int (*)(int*)>("cudaRuntimeGetVersion");
  if (!get) return broken(lib, "missing cudaRuntimeGetVersion");
  int v = 0;
  if (int rc = get(&v)) return broken(lib, fmt::format("cudaRuntimeGetVersion failed (error {})", rc));
  return found(lib, cuda_version_string(v));
}

json cublas() {
  Library lib = open_library({"libcublas.so", "libcublas.so.12", "libcublas.so.11"});
  if (!lib.handle) return not_found(lib);
  auto prop = lib.sym<int (*)(int, int*)>("cublasGetProperty");
  if (!prop) return broken(lib, "missing cublasGetProperty");
  int v[3] = {};
  for (int p = 0; p < 3; ++p)  // libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
    if (int rc = prop(p, &v[p])) return broken(lib, fmt::format("cublasGetProperty failed (status {})", rc));
  return found(lib, fmt::format("{}.{}.{}", v[0], v[1], v[2]));
}

json nccl() {
  Library lib = open_library({"libnccl.so.2", "libnccl.so"});
  if (!lib.handle) return not_found(lib);
  auto get = lib.sym<int (*)(int*)>("ncclGetVersion");
  if (!get) return broken(lib, "missing ncclGetVersion");
  int v = 0;
  if (int rc = get(&v)) return broken(lib, fmt::format("ncclGetVersion failed (ncclResult {})", rc));
  return found(lib, nccl_version_string(v));
}

// ---- network -----------------------------------------------------------------------------------------------

std::vector<NetInterface> list_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) return out;
  auto find = [&](const char* name) -> NetInterface& {
    for (auto& i : out)
      if (i.name == name) return i;
    out.push_back(NetInterface{name, {}, false, false});
    return out.back();
  };
  auto prefix_len = [](const sockaddr* mask, int family) {
    int bits = 0;
    if (!mask) return bits;
    const auto* p = family == AF_INET ? reinterpret_cast<const unsigned char*>(
                                            &reinterpret_cast<const sockaddr_in*>(mask)->sin_addr)
                                      : reinterpret_cast<const unsigned char*>(
                                            &reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    const int n = family == AF_INET ? 4 : 16;
    for (int i = 0; i < n; ++i) bits += __builtin_popcount(p[i]);
    return bits;
  };
  for (ifaddrs* a = head; a; a = a->ifa_next) {
    NetInterface& i = find(a->ifa_name);
    i.up = i.up || (a->ifa_flags & IFF_UP);
    i.loopback = i.loopback || (a->ifa_flags & IFF_LOOPBACK);
    if (!a->ifa_addr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* src = family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    inet_ntop(family, src, text, sizeof text);
    i.addresses.push_back(fmt::format("{}/{}", text, prefix_len(a->ifa_netmask, family)));
  }
  freeifaddrs(head);
  return out;
}

// "10.1.0.0/16" against "10.1.2.3/24": does any IPv4 address of `iface` lie in the subnet?
bool in_subnet(const NetInterface& iface, const std::string& cidr) {
  const auto slash = cidr.find('/');
  if (slash == std::string::npos) return false;
  in_addr net{};
  if (inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &net) != 1) return false;
  const int bits = std::atoi(cidr.c_str() + slash + 1);
  if (bits < 0 || bits > 32) return false;
  const uint32_t mask = bits == 0 ? 0 : htonl(~uint32_t{0} << (32 - bits));
  for (const std::string& a : iface.addresses) {
    in_addr addr{};
    if (inet_pton(AF_INET, a.substr(0, a.find('/')).c_str(), &addr) != 1) continue;
    if ((addr.s_addr & mask) == (net.s_addr & mask)) return true;
  }
  return false;
}

bool matches_mpi_entry(const NetInterface& iface, const std::string& entry) {
  return entry.find('/') != std::string::npos ? in_subnet(iface, entry) : iface.name == entry;
}

}  // namespace

std::vector<std::string> nccl_socket_interfaces(const std::vector<NetInterface>& ifaces, const std::string& ifname) {
  auto select = [&](const std::vector<std::string>& prefixes, bool exclude, bool exact) {
    std::vector<std::string> out;
    for (const NetInterface& i : ifaces) {
      if (!usable(i)) continue;
      bool hit = false;
      for (const std::string& p : prefixes) hit = hit || (exact ? i.name == p : starts_with(i.name, p));
      if (hit != exclude) out.push_back(i.name);
    }
    return out;
  };
  if (!ifname.empty()) {
    std::string list = ifname;
    bool exclude = false, exact = false;
    if (list[0] == '^') exclude = true, list.erase(0, 1);
    if (!list.empty() && list[0] == '=') exact = true, list.erase(0, 1);
    return select(split_commas(list), exclude, exact);
  }
  for (const auto& [prefixes, exclude] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{"ib"}, false}, {{"docker", "lo"}, true}, {{"docker"}, false}, {{"lo"}, false}}) {
    auto out = select(prefixes, exclude, false);
    if (!out.empty()) return out;
  }
  return {};
}

std::vector<std::string> mpi_tcp_interfaces(const std::vector<NetInterface>& ifaces, const std::string& include,
                                            const std::string& exclude) {
  std::vector<std::string> out;
  const bool use_include = !include.empty();
  const auto entries = split_commas(use_include ? include : (exclude.empty() ? "127.0.0.1/8,sppp" : exclude));
  for (const NetInterface& i : ifaces) {
    if (!usable(i)) continue;
    bool hit = false;
    for (const std::string& e : entries) hit = hit || matches_mpi_entry(i, e);
    if (hit == use_include) out.push_back(i.name);
  }
  return out;
}

std::string cuda_version_string(int code) { return fmt::format("{}.{}", code / 1000, (code % 1000) / 10); }

std::string nccl_version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100);
}

namespace {

// The CPU and the paths the CPU backend takes on it: the CPU's model and the instruction-set flags that decide the
// paths (/proc/cpuinfo, as lscpu shows them), oneDNN's version and effective ISA under AMPDIST_MAX_CPU_ISA, and per
// working dtype the GEMM implementation and the dtype convolutions multiply in (kernels/cpu/onednn.h).
json cpu_backend() {
  namespace cpu = kernels::cpu;
  json c;
  std::ifstream info("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(info, line) && (model.empty() || flags.empty())) {
    auto value = [&] { return line.substr(std::min(line.size(), line.find(':') + 2)); };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + value() + " ";
  }
  c["model"] = model;
  std::vector<std::string> isa_flags;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) isa_flags.push_back(f);
  c["flags"] = isa_flags;
  c["cap"] = cpu::isa::class_name(cpu::isa::max_class());
  c["onednn"] = cpu::onednn::version();
  c["onednn_isa"] = cpu::isa::onednn_isa();
  c["avx512_loops"] = cpu::isa::avx512();
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    c["gemm"][dtype_name(d)] = cpu::onednn::implementation(d, d);
    c["conv"][dtype_name(d)] = dtype_name(cpu::onednn::engine_dtype(d));
  }
  return c;
}

json this_rank(const LauncherEnv& launcher, const MpiPlacement& p) {
  json r;
  r["rank"] = p.rank;
  r["host"] = p.host;
  r["local_rank"] = p.local_rank;
  r["local_size"] = p.local_size;
  json gpus;
  json libs;
  libs["mpi"] = mpi_library();
  libs["gpu_driver"] = gpu_driver();
  libs["cuda_driver"] = cuda_driver(gpus);
  libs["cuda_runtime"] = cuda_runtime();
  libs["cublas"] = cublas();
  libs["nccl"] = nccl();
  r["libraries"] = libs;
  r["cpu_backend"] = cpu_backend();
  r["gpus"] = gpus;
  r["device_count"] = gpus.size();
  // The binding rule of the CUDA backend: one rank per device, local rank r on device r % count.
  r["device"] = gpus.empty() ? json(nullptr) : json(p.local_rank % static_cast<int>(gpus.size()));
  const auto ifaces = list_interfaces();
  json net;
  net["interfaces"] = json::array();
  for (const auto& i : ifaces)
    net["interfaces"].push_back(
        {{"name", i.name}, {"addresses", i.addresses}, {"up", i.up}, {"loopback", i.loopback}});
  const std::string nccl_if = getenv_str("NCCL_SOCKET_IFNAME");
  const std::string inc = getenv_str("OMPI_MCA_btl_tcp_if_include");
  const std::string exc = getenv_str("OMPI_MCA_btl_tcp_if_exclude");
  net["NCCL_SOCKET_IFNAME"] = nccl_if;
  net["OMPI_MCA_btl_tcp_if_include"] = inc;
  net["OMPI_MCA_btl_tcp_if_exclude"] = exc;
  net["nccl"] = nccl_socket_interfaces(ifaces, nccl_if);
  net["mpi_tcp"] = mpi_tcp_interfaces(ifaces, inc, exc);
  r["network"] = net;
  r["launcher"] = describe_launcher();
  r["hint"] = launch_hint(launcher, p.world_size);
  return r;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string library_line(const json& lib) {
  if (!lib["found"].get<bool>()) return fmt::format("not found ({})", lib["library"].get<std::string>());
  std::string s = lib.contains("version") ? lib["version"].get<std::string>() : "?";
  if (lib.contains("standard")) s = fmt::format("MPI {}, {}", lib["standard"].get<std::string>(), s);
  if (!lib.contains("version")) s = "found but unusable";
  if (lib.contains("library")) s += fmt::format(" ({})", lib["library"].get<std::string>());
  if (lib.contains("error")) s += ": " + lib["error"].get<std::string>();
  return s;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(i == j ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return join(parts, ",");
}

void print_human(const json& all) {
  std::ostream& o = std::cout;
  const json& ranks = all["ranks"];
  o << fmt::format("ampdist env: world size {} ({})\n", all["world_size"].get<int>(), all["launcher"].get<std::string>());
  if (!all["hint"].get<std::string>().empty()) o << "warning: " << all["hint"].get<std::string>() << "\n";
  // One section per host, in the order of its first rank.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> by_host;
  for (const json& r : ranks) {
    const std::string h = r["host"];
    if (!by_host.count(h)) hosts.push_back(h);
    by_host[h].push_back(r["rank"].get<int>());
  }
  for (const std::string& h : hosts) {
    const json& first = ranks[by_host[h][0]];
    const json& libs = first["libraries"];
    o << fmt::format("host {} (ranks {})\n", h, ranks_text(by_host[h]));
    o << "  MPI:           " << library_line(libs["mpi"]) << "\n";
    o << "  GPU driver:    " << library_line(libs["gpu_driver"]) << "\n";
    o << "  CUDA driver:   " << library_line(libs["cuda_driver"]) << "\n";
    o << "  CUDA runtime:  " << library_line(libs["cuda_runtime"]) << "\n";
    o << "  cuBLAS:        " << library_line(libs["cublas"]) << "\n";
    o << "  NCCL:          " << library_line(libs["nccl"]) << "\n";
    if (first["gpus"].empty()) {
      o << "  GPUs:          none: ranks compute on the CPU backend\n";
    } else {
      o << fmt::format("  GPUs:          {}\n", first["gpus"].size());
      for (const json& g : first["gpus"]) {
        if (g.contains("error")) {
          o << fmt::format("    GPU {}: {}\n", g["index"].get<int>(), g["error"].get<std::string>());
          continue;
        }
        o << fmt::format("    GPU {}: {}, {:.1f} GiB, compute capability {}, bf16 {}\n", g["index"].get<int>(),
                         g["name"].get<std::string>(), g["memory_bytes"].get<double>() / (1024.0 * 1024 * 1024),
                         g["compute_capability"].get<std::string>(), g["bf16"].get<bool>() ? "yes" : "no (< 8.0)");
      }
    }
    const json& cb = first["cpu_backend"];
    o << fmt::format("  CPU:           {} ({})\n", cb["model"].get<std::string>(),
                     join(cb["flags"].get<std::vector<std::string>>(), " "));
    o << fmt::format("  oneDNN:        {}, ISA {} (AMPDIST_MAX_CPU_ISA: {}), our AVX-512 loops {}\n",
                     cb["onednn"].get<std::string>(), cb["onednn_isa"].get<std::string>(),
                     cb["cap"].get<std::string>(), cb["avx512_loops"].get<bool>() ? "on" : "off");
    for (const char* d : {"fp32", "fp16", "bf16"})
      o << fmt::format("  {} GEMMs:    {}; convolutions in {}\n", d, cb["gemm"][d].get<std::string>(),
                       cb["conv"][d].get<std::string>());
    o << "  ranks:         (device = local rank % device count)\n";
    for (int rk : by_host[h]) {
      const json& r = ranks[rk];
      o << fmt::format("    rank {} local rank {} of {} -> {}\n", rk, r["local_rank"].get<int>(),
                       r["local_size"].get<int>(),
                       r["device"].is_null() ? std::string("cpu") : fmt::format("GPU {}", r["device"].get<int>()));
    }
    const json& net = first["network"];
    o << "  interfaces:\n";
    for (const json& i : net["interfaces"]) {
      std::string flags = i["up"].get<bool>() ? "up" : "down";
      if (i["loopback"].get<bool>()) flags += ", loopback";
      const auto addresses = i["addresses"].get<std::vector<std::string>>();
      o << fmt::format("    {:<12} {} ({})\n", i["name"].get<std::string>(),
                       addresses.empty() ? std::string("no address") : join(addresses, " "), flags);
    }
    auto setting = [&](const char* var, const char* dflt) {
      const std::string v = net[var];
      return v.empty() ? fmt::format("{} unset: {}", var, dflt) : fmt::format("{}={}", var, v);
    };
    o << "  NCCL sockets:  " << join(net["nccl"].get<std::vector<std::string>>()) << " ("
      << setting("NCCL_SOCKET_IFNAME", "ib* first, else all but lo* and docker*") << ")\n";
    std::string mpi_setting =
        !net["OMPI_MCA_btl_tcp_if_include"].get<std::string>().empty()
            ? setting("OMPI_MCA_btl_tcp_if_include", "")
            : setting("OMPI_MCA_btl_tcp_if_exclude", "all but 127.0.0.1/8 and sppp");
    o << "  MPI TCP:       " << join(net["mpi_tcp"].get<std::vector<std::string>>()) << " (" << mpi_setting << ")\n";
  }
}

}  // namespace

int run_env_command(const EnvArgs& args, const LauncherEnv& launcher, const MpiPlacement& placement) {
  const std::string mine = this_rank(launcher, placement).dump();
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(placement.rank == 0 ? placement.world_size : 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> offsets(lens.size());
  int total = 0;
  for (size_t i = 0; i < lens.size(); ++i) offsets[i] = total, total += lens[i];
  std::string all(placement.rank == 0 ? total : 0, '\0');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (placement.rank != 0) return 0;
  json out;
  out["world_size"] = placement.world_size;
  out["ranks"] = json::array();
  for (size_t i = 0; i < lens.size(); ++i) out["ranks"].push_back(json::parse(all.substr(offsets[i], lens[i])));
  out["launcher"] = out["ranks"][0]["launcher"];
  out["hint"] = out["ranks"][0]["hint"];
  if (args.json)
    std::cout << out.dump(2) << "\n";
  else
    print_human(out);
  std::cout << std::flush;
  return 0;
}

}  // namespace ampdist
