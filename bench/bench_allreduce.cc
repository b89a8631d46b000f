// Gradient all-reduce: the Reducer on a model-like set of parameters and buckets against one raw MPI_Allreduce
// of the same bytes, side by side in one run (bench/run_all.sh).
//
//   mpirun -np 2 build/bench/ampdist_bench_allreduce --min-bytes 1024 --max-bytes 268435456 --json out.json
//
// For each size S (powers of 4 from --min-bytes to --max-bytes) the FP32 gradient buffer of S bytes is split into
// parameters of at most --param-mib MiB, registered in order and laid out back to back by MasterWeights, and bucketed
// by the Reducer with --bucket-cap-mb (DDP's 25 MiB default). One iteration of the Reducer: begin_backward(true),
// mark_ready() for every parameter in backward order (last registered first), wait(). One iteration of the raw
// baseline: MPI_Allreduce(MPI_IN_PLACE, S bytes of MPI_FLOAT, MPI_SUM). Iterations alternate between the two so
// that a noisy neighbour hits both alike. Each iteration starts at a barrier after the buffer is refilled and its
// time is the maximum over ranks; the tables use the median.
//
// Bandwidths as nccl-tests define them: algbw = S / time, busbw = algbw * 2 (n - 1) / n.
// Results are checked inside the benchmark, as nccl-tests do: rank r fills element i with (r + 1) * ((i % 7) - 3),
// so every element of the sum is n (n + 1) / 2 * ((i % 7) - 3) exactly (small integers are exact in FP32); any
// mismatch stops the program with exit code 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/mpi_communicator.h"
#include "runtime/dist/reducer.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/error.h"
#include "runtime/nn/module.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fill(float* g, int64_t n, int rank) {
  const float r = static_cast<float>(rank + 1);
  for (int64_t i = 0; i < n; ++i) g[i] = r * static_cast<float>((i % 7) - 3);
}

void check(const float* g, int64_t n, int world, const char* what, int64_t bytes) {
  const float w = static_cast<float>(world * (world + 1) / 2);
  for (int64_t i = 0; i < n; ++i) {
    const float want = w * static_cast<float>((i % 7) - 3);
    if (g[i] != want)
      throw ampdist::Error(std::string(what) + ", " + std::to_string(bytes) + " bytes: element " + std::to_string(i) +
                           " is " + std::to_string(g[i]) + ", expected " + std::to_string(want));
  }
}

double timed_max(Clock::time_point t0) {
  double t = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

struct Args {
  int64_t min_bytes = 1024, max_bytes = 256ll << 20;
  double bucket_cap_mb = 25.0, param_mib = 4.0, target_bytes = 1024.0 * 1024 * 1024;
  int min_iters = 3, max_iters = 40;
  std::string json;
};

int run(const Args& a, ampdist::MpiCommunicator& comm) {
  using namespace ampdist;
  const int world = comm.world_size(), rank = comm.rank();
  if (world < 2) throw Error("needs at least 2 ranks (busbw is 0 on one)", ErrorKind::kBadInput);
  nlohmann::json rows = nlohmann::json::array();
  const int64_t param_elems = std::max<int64_t>(1, static_cast<int64_t>(a.param_mib * 1024 * 1024 / 4));
  for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
    const int64_t n = bytes / 4;
    std::vector<std::unique_ptr<Parameter>> owned;
    std::vector<Parameter*> params;
    for (int64_t off = 0; off < n; off += param_elems) {
      auto p = std::make_unique<Parameter>();
      p->name = "p" + std::to_string(owned.size());
      p->shape = {std::min(param_elems, n - off)};
      params.push_back(p.get());
      owned.push_back(std::move(p));
    }
    auto masters = bind_parameters(params, DType::kFloat32, Device::kCPU, 0);
    Tensor& grads = masters->grads();
    float* g = grads.data_as<float>();
    Reducer reducer(comm, grads, masters->layout(), static_cast<int64_t>(a.bucket_cap_mb * 1024 * 1024),
                    DType::kFloat32);  // all-reduce mode
    const int iters = static_cast<int>(
        std::clamp<int64_t>(static_cast<int64_t>(a.target_bytes / bytes), a.min_iters, a.max_iters));
    std::vector<double> t_reducer, t_mpi;
    for (int it = -1; it < iters; ++it) {  // iteration -1 warms up both paths and is not counted
      fill(g, n, rank);
      comm.barrier("reducer iteration");
      auto t0 = Clock::now();
      reducer.begin_backward(true);
      for (size_t i = params.size(); i-- > 0;) reducer.mark_ready(params[i]->index);
      reducer.wait();
      const double tr = timed_max(t0);
      check(g, n, world, "Reducer", bytes);

      fill(g, n, rank);
      comm.barrier("MPI_Allreduce iteration");
      t0 = Clock::now();
      MPI_Allreduce(MPI_IN_PLACE, g, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double tm = timed_max(t0);
      check(g, n, world, "MPI_Allreduce", bytes);
      if (it >= 0) t_reducer.push_back(tr), t_mpi.push_back(tm);
    }
    const double tr = median(t_reducer), tm = median(t_mpi);
    const double bus = 2.0 * (world - 1) / world;
    nlohmann::json row = {{"bytes", bytes},
                          {"params", params.size()},
                          {"buckets", reducer.buckets().size()},
                          {"iters", iters},
                          {"reducer_s", tr},
                          {"mpi_s", tm},
                          {"reducer_algbw_gb_s", bytes / tr / 1e9},
                          {"reducer_busbw_gb_s", bytes / tr / 1e9 * bus},
                          {"mpi_algbw_gb_s", bytes / tm / 1e9},
                          {"mpi_busbw_gb_s", bytes / tm / 1e9 * bus},
                          {"ratio_busbw", tm / tr}};
    if (rank == 0)
      std::printf("%10lld B  %4zu params %3zu buckets  Reducer %9.3f ms %7.3f GB/s busbw  MPI %9.3f ms %7.3f GB/s "
                  "busbw  ratio %.3f\n",
                  static_cast<long long>(bytes), params.size(), reducer.buckets().size(), tr * 1e3,
                  bytes / tr / 1e9 * bus, tm * 1e3, bytes / tm / 1e9 * bus, tm / tr);
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (rank == 0 && !a.json.empty()) {
    nlohmann::json j = {{"world_size", world}, {"bucket_cap_mb", a.bucket_cap_mb}, {"param_mib", a.param_mib},
                        {"rows", rows}};
    std::ofstream out(a.json);
    out << j.dump(2) << "\n";
    if (!out) throw Error("cannot write " + a.json);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ampdist::MpiRuntime mpi(&argc, &argv);
  Args a;
  CLI::App app("Reducer vs raw MPI_Allreduce bandwidth benchmark");
  app.add_option("--min-bytes", a.min_bytes, "smallest size (bytes, a multiple of 4)")->check(CLI::Range(4ll, 1ll << 31));
  app.add_option("--max-bytes", a.max_bytes, "largest size (bytes)")->check(CLI::Range(4ll, 1ll << 31));
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "Reducer bucket cap, MiB")->check(CLI::PositiveNumber);
  app.add_option("--param-mib", a.param_mib, "largest parameter, MiB")->check(CLI::PositiveNumber);
  app.add_option("--target-bytes", a.target_bytes, "bytes to move per size; sets the iteration count")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-iters", a.min_iters, "fewest timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("--max-iters", a.max_iters, "most timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("--json", a.json, "write the rows here (rank 0)");
  try {
    app.parse(argc, argv);
    if (a.min_bytes % 4 != 0) throw CLI::ValidationError("--min-bytes", "must be a multiple of 4");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  ampdist::MpiCommunicator comm;
  try {
    return run(a, comm);
  } catch (const ampdist::Error& e) {
    std::fprintf(stderr, "ampdist_bench_allreduce: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.abort(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist_bench_allreduce: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.abort(1);
  }
}
