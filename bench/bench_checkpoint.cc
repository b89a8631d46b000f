// Checkpoint save/load throughput over MPI (a plain MPI program, not Google Benchmark):
//
//   mpirun -np 2 build/bench/ampdist_bench_checkpoint --gib 1.0 --dir build/bench_tmp [--repeat 3] [--drop-caches]
//          [--sharded] [--json FILE] [--keep]
//
// Builds AdamW-like state (buffers "master", "exp_avg", "exp_avg_sq", each gib/3 of FP32, full on every rank, or with
// --sharded only each rank's slice, as optimizer.zero_stage 1 holds them; filled with deterministic values), then `repeat` times: save_checkpoint (a new step each time, keep_last=1) and
// load_checkpoint into a second, zeroed state, which must then be bitwise equal to the first (the program fails with
// exit code 1 otherwise). Each phase starts after a barrier and its time is the maximum over ranks.
//
// Throughput is reported as
//   save:  state GiB / s
//   load:  state GiB / s, and bytes read() from checkpoint files across all ranks / s (each rank reads the records of
//          its own slice, as load_checkpoint's LoadStats count them; replicated state is then all-gathered)
// plus the bytes the kernel actually read from / wrote to the block device (/proc/self/io, summed over ranks), which
// shows whether a load came from the page cache. --drop-caches writes 3 to /proc/sys/vm/drop_caches (root only)
// between save and load; whether that worked, and the fraction of the shard files still resident afterwards
// (mincore), is reported. Without it the load numbers are from the page cache. For each phase the main thread's time
// on a CPU and waiting in the run queue (/proc/thread-self/schedstat, max over ranks) and the load average are
// reported too: on a shared machine the run-queue wait tells how much of a slow result is other processes' doing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/mpi_communicator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"

namespace {

namespace fs = std::filesystem;
using ampdist::CheckpointState;
using ampdist::Communicator;
using ampdist::DType;
using ampdist::ReduceOp;
using ampdist::Tensor;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const char* const kBufferNames[3] = {"master", "exp_avg", "exp_avg_sq"};

struct Options {
  double gib = 1.0;
  std::string dir;
  int repeat = 3;
  bool drop_caches = false;
  bool keep = false;
  bool sharded = false;
  std::string json;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "ampdist_bench_checkpoint: %s\n"
               "usage: ampdist_bench_checkpoint --gib G --dir DIR [--repeat N] [--drop-caches] [--sharded] "
               "[--json FILE] [--keep]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--gib") {
      o.gib = std::atof(value().c_str());
    } else if (a == "--dir") {
      o.dir = value();
    } else if (a == "--repeat") {
      o.repeat = std::atoi(value().c_str());
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--drop-caches") {
      o.drop_caches = true;
    } else if (a == "--keep") {
      o.keep = true;
    } else if (a == "--sharded") {
      o.sharded = true;
    } else {
      usage("unknown argument " + a);
    }
  }
  if (o.dir.empty()) usage("--dir is required");
  if (!(o.gib > 0.0)) usage("--gib must be > 0");
  if (o.repeat < 1) usage("--repeat must be >= 1");
  return o;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deterministic, finite, distinct per buffer and element; exp_avg_sq is non-negative like the real moment.
void fill(Tensor& t, int buffer) {
  float* p = t.data_as<float>();
  const uint64_t seed = 0x5eed0000ull + static_cast<uint64_t>(buffer);
  const float scale = buffer == 0 ? 1.0f : buffer == 1 ? 1e-3f : 1e-6f;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t x = splitmix64(seed * 0x100000001b3ull ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    p[i] = buffer == 2 ? u * scale : (u - 0.5f) * scale;
  }
}

// The model's tensor index: a few 2-D "weights" of 4096 columns and a 1-D remainder covering [0, numel).
void add_tensor_index(ampdist::Manifest& m, int64_t numel) {
  constexpr int64_t kCols = 4096;
  const int64_t rows_total = numel / kCols;
  const int64_t rows[3] = {rows_total / 2, rows_total / 4, rows_total - rows_total / 2 - rows_total / 4};
  int64_t off = 0;
  for (int i = 0; i < 3; ++i) {
    if (rows[i] == 0) continue;
    ampdist::TensorIndexEntry* e = m.add_tensors();
    e->set_name("layer" + std::to_string(i) + ".weight");
    e->add_shape(rows[i]);
    e->add_shape(kCols);
    e->set_offset(off);
    e->set_numel(rows[i] * kCols);
    off += rows[i] * kCols;
  }
  if (off < numel) {
    ampdist::TensorIndexEntry* e = m.add_tensors();
    e->set_name("head.bias");
    e->add_shape(numel - off);
    e->set_offset(off);
    e->set_numel(numel - off);
  }
}

// read_bytes / write_bytes of /proc/self/io: what this process made the kernel fetch from / send to storage.
struct DeviceIo {
  int64_t read = -1, write = -1;
};
DeviceIo device_io() {
  DeviceIo io;
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t v;
  while (in >> key >> v) {
    if (key == "read_bytes:") io.read = v;
    if (key == "write_bytes:") io.write = v;
  }
  return io;
}

// This thread's time on a CPU and waiting in a run queue for one (/proc/thread-self/schedstat, ns), in seconds: the
// wait shows how much of a phase's time went to other processes competing for the CPUs.
struct Sched {
  double cpu = 0.0, wait = 0.0;
};
Sched sched_now() {
  Sched s;
  std::ifstream in("/proc/thread-self/schedstat");
  double cpu_ns = 0.0, wait_ns = 0.0;
  if (in >> cpu_ns >> wait_ns) s = {cpu_ns * 1e-9, wait_ns * 1e-9};
  return s;
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// sync + echo 3 > /proc/sys/vm/drop_caches. Returns "" on success, else why not.
std::string drop_page_cache() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return std::string("open /proc/sys/vm/drop_caches: ") + std::strerror(errno);
  const bool ok = ::write(fd, "3\n", 2) == 2;
  const std::string err = ok ? "" : std::string("write /proc/sys/vm/drop_caches: ") + std::strerror(errno);
  ::close(fd);
  return err;
}

// Resident and total pages of every regular file under `dir` (mincore); {-1, -1} when it cannot tell.
std::pair<int64_t, int64_t> resident_pages(const std::string& dir) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t resident = 0, total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) return {-1, -1};
    struct stat st {};
    ::fstat(fd, &st);
    if (st.st_size == 0) {
      ::close(fd);
      continue;
    }
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return {-1, -1};
    const int64_t pages = (st.st_size + page - 1) / page;
    std::vector<unsigned char> vec(static_cast<size_t>(pages));
    const bool ok = ::mincore(map, static_cast<size_t>(st.st_size), vec.data()) == 0;
    ::munmap(map, static_cast<size_t>(st.st_size));
    if (!ok) return {-1, -1};
    for (unsigned char c : vec) resident += c & 1;
    total += pages;
  }
  return {resident, total};
}

double max_over_ranks(Communicator& comm, double v) {
  double a[1] = {v};
  comm.allreduce_f64(a, ReduceOp::kMax, "bench max");
  return a[0];
}

int64_t sum_over_ranks(Communicator& comm, int64_t v) {
  int64_t a[1] = {v};
  comm.allreduce_i64(a, ReduceOp::kSum, "bench sum");
  return a[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.6f", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  ampdist::MpiCommunicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.world_size();

  // Each buffer is gib/3 of FP32: numel elements, the same on every rank.
  const auto numel = static_cast<int64_t>(opt.gib * kGiB / 3.0 / sizeof(float));
  if (numel < world) usage("--gib too small for this world size");
  const double state_bytes = 3.0 * static_cast<double>(numel) * sizeof(float);
  const double state_gib = state_bytes / kGiB;

  std::vector<Tensor> src, dst;
  CheckpointState saved, loaded;
  const std::vector<int64_t> slices = ampdist::shard_counts(numel, world);
  int64_t begin = 0;
  for (int r = 0; r < rank; ++r) begin += slices[r];
  const int64_t held = opt.sharded ? slices[rank] : numel;
  for (int b = 0; b < 3; ++b) {
    src.push_back(Tensor::empty({held}, DType::kFloat32));
    dst.push_back(Tensor::zeros({held}, DType::kFloat32));
    fill(src.back(), b);
  }
  if (opt.sharded) {
    saved.numel = loaded.numel = numel;
    saved.begin = loaded.begin = begin;
  }
  for (int b = 0; b < 3; ++b) {
    saved.buffers.emplace_back(kBufferNames[b], &src[b]);
    loaded.buffers.emplace_back(kBufferNames[b], &dst[b]);
  }
  saved.meta.set_run_id("bench-checkpoint");
  saved.meta.set_optimizer("adamw");
  add_tensor_index(saved.meta, numel);
  loaded.meta = saved.meta;  // what load_checkpoint checks the checkpoint against

  if (rank == 0) {
    std::printf("ampdist_bench_checkpoint: %d rank(s), dir %s, state %.3f GiB (3 buffers x %lld FP32), repeat %d\n",
                world, opt.dir.c_str(), state_gib, static_cast<long long>(numel), opt.repeat);
    std::fflush(stdout);
  }

  std::vector<double> save_s, load_s;
  std::vector<double> save_cpu, save_wait, load_cpu, load_wait;  // max over ranks, per repeat
  const std::string loadavg_start = loadavg();
  std::vector<std::string> written;
  double file_bytes = 0.0;  // sum of the shard files and the manifest of one checkpoint
  double read_bytes_per_load = 0.0;  // shard bytes read by all ranks in the last load (LoadStats)
  int64_t dev_read_total = 0, dev_write_total = 0;
  int drops_ok = 0;
  std::string drop_error;
  double resident_after_drop = -1.0;  // fraction of the checkpoint's pages in the page cache before each load (max)

  for (int it = 0; it < opt.repeat; ++it) {
    const int64_t step = 1000 + it;
    saved.meta.set_step(step);
    saved.meta.set_optimizer_step_count(step);

    // ---- save
    comm.barrier("bench save start");
    const DeviceIo io0 = device_io();
    Sched s0 = sched_now();
    double t0 = MPI_Wtime();
    const std::string path = ampdist::save_checkpoint(comm, saved, opt.dir, /*keep_last=*/1);
    const double ts_local = MPI_Wtime() - t0;
    Sched s1 = sched_now();
    const double ts = max_over_ranks(comm, ts_local);
    const DeviceIo io1 = device_io();
    save_cpu.push_back(max_over_ranks(comm, s1.cpu - s0.cpu));
    save_wait.push_back(max_over_ranks(comm, s1.wait - s0.wait));
    save_s.push_back(ts);
    written.push_back(path);
    dev_write_total += sum_over_ranks(comm, io1.write - io0.write);

    // ---- page cache
    if (opt.drop_caches) {
      std::string err;
      if (comm.local_rank() == 0) err = drop_page_cache();
      const int64_t failed = sum_over_ranks(comm, err.empty() ? 0 : 1);
      if (failed == 0) ++drops_ok;
      else if (drop_error.empty()) drop_error = err.empty() ? "failed on another rank" : err;
    }
    if (rank == 0) {
      const auto [res, tot] = resident_pages(path);
      if (tot > 0) resident_after_drop = std::max(resident_after_drop, static_cast<double>(res) / tot);
    }

    // ---- load into a zeroed state
    for (Tensor& t : dst) std::memset(t.data(), 0, t.nbytes());
    comm.barrier("bench load start");
    const DeviceIo io2 = device_io();
    s0 = sched_now();
    t0 = MPI_Wtime();
    ampdist::LoadStats stats;
    const ampdist::Manifest m = ampdist::load_checkpoint(comm, path, loaded, &stats);
    read_bytes_per_load = static_cast<double>(sum_over_ranks(comm, stats.bytes_read));
    const double tl_local = MPI_Wtime() - t0;
    s1 = sched_now();
    const double tl = max_over_ranks(comm, tl_local);
    const DeviceIo io3 = device_io();
    load_cpu.push_back(max_over_ranks(comm, s1.cpu - s0.cpu));
    load_wait.push_back(max_over_ranks(comm, s1.wait - s0.wait));
    load_s.push_back(tl);
    dev_read_total += sum_over_ranks(comm, io3.read - io2.read);

    file_bytes = 0.0;
    for (const auto& s : m.shards()) file_bytes += static_cast<double>(s.bytes());
    std::error_code ec;
    file_bytes += static_cast<double>(fs::file_size(fs::path(path) / "manifest.pb", ec));

    // ---- bitwise check, on every rank
    int64_t mismatches = 0;
    std::string first;
    for (int b = 0; b < 3; ++b) {
      if (std::memcmp(src[b].data(), dst[b].data(), src[b].nbytes()) == 0) continue;
      const auto* a = static_cast<const uint32_t*>(src[b].data());
      const auto* c = static_cast<const uint32_t*>(dst[b].data());
      for (int64_t i = 0; i < numel; ++i) {
        if (a[i] == c[i]) continue;
        if (first.empty()) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "buffer %s element %lld: saved bits 0x%08x, loaded 0x%08x", kBufferNames[b],
                        static_cast<long long>(i), a[i], c[i]);
          first = buf;
        }
        ++mismatches;
      }
    }
    if (!first.empty())
      std::fprintf(stderr, "ampdist_bench_checkpoint: rank %d: LOADED STATE DIFFERS FROM SAVED (step %lld): %lld "
                   "elements, first at %s\n", rank, static_cast<long long>(step), static_cast<long long>(mismatches),
                   first.c_str());
    if (sum_over_ranks(comm, mismatches) > 0) {
      if (rank == 0) std::fprintf(stderr, "ampdist_bench_checkpoint: FAILED: load is not bitwise equal to save\n");
      return 1;
    }
    if (rank == 0) {
      std::printf("  step %lld: save %.3f s (%.2f GiB/s; on CPU %.2f s, waiting for a CPU %.2f s), load %.3f s "
                  "(%.2f GiB/s state; on CPU %.2f s, waiting for a CPU %.2f s), bitwise check OK\n",
                  static_cast<long long>(step), ts, state_gib / ts, save_cpu.back(), save_wait.back(), tl,
                  state_gib / tl, load_cpu.back(), load_wait.back());
      std::fflush(stdout);
    }
  }

  // keep_last=1: only the last checkpoint is left. Remove it (and `latest`) unless --keep.
  comm.barrier("bench done");
  if (rank == 0 && !opt.keep) {
    std::error_code ec;
    for (const auto& p : written) fs::remove_all(p, ec);
    fs::remove(fs::path(opt.dir) / "latest", ec);
  }

  if (rank == 0) {
    const double read_bytes = read_bytes_per_load;
    const double read_gib = read_bytes / kGiB;
    const double best_save = *std::min_element(save_s.begin(), save_s.end()), med_save = median(save_s);
    const double best_load = *std::min_element(load_s.begin(), load_s.end()), med_load = median(load_s);
    const char* cache = !opt.drop_caches         ? "not dropped: load numbers are from the page cache"
                        : drops_ok == opt.repeat ? "dropped before every load"
                                                 : "drop failed: load numbers are from the page cache";
    std::printf("\nstate                       %.3f GiB (files %.3f GiB per checkpoint, %d rank(s))\n", state_gib,
                file_bytes / kGiB, world);
    std::printf("save  state GiB/s           best %.2f  median %.2f\n", state_gib / best_save, state_gib / med_save);
    std::printf("load  state GiB/s           best %.2f  median %.2f\n", state_gib / best_load, state_gib / med_load);
    std::printf("load  read() GiB/s (x%d)     best %.2f  median %.2f   (%.3f GiB read per load across ranks)\n", world,
                read_gib / best_load, read_gib / med_load, read_gib);
    std::printf("device I/O (/proc/self/io)  written %.3f GiB per save, read %.3f GiB per load (summed over ranks)\n",
                dev_write_total / kGiB / opt.repeat, dev_read_total / kGiB / opt.repeat);
    std::printf("page cache                  %s%s%s", cache, drop_error.empty() ? "" : " (", drop_error.c_str());
    std::printf("%s", drop_error.empty() ? "" : ")");
    if (resident_after_drop >= 0) std::printf("; %.1f%% of the files resident before load", 100 * resident_after_drop);
    std::printf("\nper-rank main thread, median  save: on CPU %.2f s, run-queue wait %.2f s; load: on CPU %.2f s, "
                "run-queue wait %.2f s (max over ranks)\n",
                median(save_cpu), median(save_wait), median(load_cpu), median(load_wait));
    std::printf("load average                %s at start, %s at end (%ld CPUs online)", loadavg_start.c_str(),
                loadavg().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN));
    std::printf("\nbitwise check               OK (%d of %d loads equal to the saved state)\n", opt.repeat, opt.repeat);

    if (!opt.json.empty()) {
      std::FILE* f = std::fopen(opt.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "ampdist_bench_checkpoint: cannot write %s\n", opt.json.c_str());
        return 1;
      }
      std::fprintf(f,
                   "{\n  \"world_size\": %d,\n  \"state_gib\": %.6f,\n  \"numel_per_buffer\": %lld,\n"
                   "  \"file_gib_per_checkpoint\": %.6f,\n  \"load_read_gib_across_ranks\": %.6f,\n"
                   "  \"repeat\": %d,\n  \"save_s\": %s,\n  \"load_s\": %s,\n"
                   "  \"save_gib_s_best\": %.4f,\n  \"save_gib_s_median\": %.4f,\n"
                   "  \"load_state_gib_s_best\": %.4f,\n  \"load_state_gib_s_median\": %.4f,\n"
                   "  \"load_read_gib_s_best\": %.4f,\n  \"load_read_gib_s_median\": %.4f,\n"
                   "  \"device_write_gib_per_save\": %.6f,\n  \"device_read_gib_per_load\": %.6f,\n"
                   "  \"drop_caches_requested\": %s,\n  \"drop_caches_ok\": %s,\n"
                   "  \"resident_fraction_before_load\": %.4f,\n"
                   "  \"save_cpu_s\": %s,\n  \"save_runqueue_wait_s\": %s,\n"
                   "  \"load_cpu_s\": %s,\n  \"load_runqueue_wait_s\": %s,\n"
                   "  \"save_s_median\": %.6f,\n  \"save_cpu_s_median\": %.6f,\n"
                   "  \"save_runqueue_wait_s_median\": %.6f,\n"
                   "  \"load_s_median\": %.6f,\n  \"load_cpu_s_median\": %.6f,\n"
                   "  \"load_runqueue_wait_s_median\": %.6f,\n"
                   "  \"loadavg_start\": \"%s\",\n  \"loadavg_end\": \"%s\",\n  \"bitwise_check\": \"ok\"\n}\n",
                   world, state_gib, static_cast<long long>(numel), file_bytes / kGiB, read_gib, opt.repeat,
                   json_list(save_s).c_str(), json_list(load_s).c_str(), state_gib / best_save,
                   state_gib / med_save, state_gib / best_load, state_gib / med_load, read_gib / best_load,
                   read_gib / med_load, dev_write_total / kGiB / opt.repeat, dev_read_total / kGiB / opt.repeat,
                   opt.drop_caches ? "true" : "false", drops_ok == opt.repeat && opt.drop_caches ? "true" : "false",
                   resident_after_drop, json_list(save_cpu).c_str(), json_list(save_wait).c_str(),
                   json_list(load_cpu).c_str(), json_list(load_wait).c_str(), med_save, median(save_cpu),
                   median(save_wait), med_load, median(load_cpu), median(load_wait), loadavg_start.c_str(),
                   loadavg().c_str());
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ampdist::MpiRuntime mpi(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const ampdist::Error& e) {
    if (!e.secondary()) std::fprintf(stderr, "ampdist_bench_checkpoint: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist_bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
