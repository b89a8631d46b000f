#include "comm/nccl_communicator.h"

#ifdef AMPDIST_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace ampdist {

namespace {

void check_nccl(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(what + ": " + ncclGetErrorString(r) + (r == ncclSystemError || r == ncclRemoteError
                                                          ? " (another rank or the network failed; see NCCL_DEBUG=WARN)"
                                                          : ""));
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat32: break;
  }
  return ncclFloat32;
}

cudaStream_t compute() { return static_cast<cudaStream_t>(device::compute_stream()); }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", s);
  return buf;
}

std::string last_error(ncclComm_t comm) {
  const char* e = ncclGetLastError(comm);
  return e && *e ? std::string(" (") + e + ")" : "";
}

using Clock = std::chrono::steady_clock;
Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Polls the communicator's state until it is no longer ncclInProgress or `deadline` passes. Returns the state
// (ncclInProgress on a timeout).
ncclResult_t poll_state(ncclComm_t comm, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Event pool: completion events are returned here by their last owner (the pending list or a Work handle), which
// may outlive the communicator, hence the shared ownership.
struct EventPool {
  std::mutex mu;
  std::vector<cudaEvent_t> free;
  ~EventPool() {
    for (cudaEvent_t e : free) cudaEventDestroy(e);
  }
};

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0, rank = 0;
  std::atomic<int64_t> step{0};
  std::atomic<double> timeout_s{600.0};
  std::shared_ptr<EventPool> pool = std::make_shared<EventPool>();

  using Event = std::shared_ptr<CUevent_st>;  // shared by the pending list and the Work; back to the pool after
  Event make_event() {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      if (!pool->free.empty()) {
        e = pool->free.back();
        pool->free.pop_back();
      }
    }
    if (!e) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    std::shared_ptr<EventPool> p = pool;
    return Event(e, [p](cudaEvent_t x) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->free.push_back(x);
    });
  }

  // After an NCCL call that returned ncclInProgress (non-blocking mode): no other NCCL call until the state is
  // ncclSuccess (NCCL documentation). Bounded by the timeout; an error or a timeout aborts the communicator.
  void settle(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) check_nccl(r, what);
    const ncclResult_t state =
        poll_state(comm, after(timeout_s.load()));
    if (state == ncclSuccess) return;
    fail(what + (state == ncclInProgress ? " did not complete within " + seconds(timeout_s.load()) + " s (comm.timeout_s)"
                                         : std::string(": ") + ncclGetErrorString(state) + last_error(comm)) +
         "; aborting the NCCL communicator");
  }

  struct Pending {
    Event done;
    std::string what;
    int64_t step;
    std::chrono::steady_clock::time_point issued;
  };
  std::mutex mu;
  std::deque<Pending> pending;  // in issue order; completed ones are popped from the front
  cudaEvent_t ready = nullptr;  // marks the compute stream's position for each collective (re-recorded every time:
                                // a stream wait uses the record current when it is issued)
  std::atomic<bool> stop{false};
  std::thread monitor;

  [[noreturn]] void fail(const std::string& msg) {
    std::fprintf(stderr, "ampdist: error: [rank %d] %s\n", rank, msg.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm);  // unblocks the kernels of this rank; the launcher then stops the others
    std::_Exit(1);
  }

  void run_monitor() {
    cudaSetDevice(device);  // the runtime's current device is per thread
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        fail(std::string("asynchronous NCCL error at step ") + std::to_string(step.load()) + ": " +
             ncclGetErrorString(async) + "; aborting the NCCL communicator");
      std::lock_guard<std::mutex> lock(mu);
      while (!pending.empty()) {
        Pending& p = pending.front();
        const cudaError_t q = cudaEventQuery(p.done.get());
        if (q == cudaSuccess) {
          pending.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady)
          fail("step " + std::to_string(p.step) + ": " + p.what + " failed on the device: " + cudaGetErrorName(q));
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - p.issued).count();
        if (waited > timeout_s.load()) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.0f", timeout_s.load());
          fail("step " + std::to_string(p.step) + ": " + p.what + " did not complete within " + buf +
               " s (comm.timeout_s); another rank stopped or the network is down; aborting the NCCL communicator");
        }
        break;  // later collectives cannot finish before this one
      }
    }
  }

  // Orders the communication stream after the compute stream's work so far.
  void after_compute() {
    check_cuda(cudaEventRecord(ready, compute()), "cudaEventRecord (compute)");
    check_cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent (communication)");
  }

  Event issued(const std::string& what) {
    Event done = make_event();
    check_cuda(cudaEventRecord(done.get(), stream), "cudaEventRecord (communication)");
    std::lock_guard<std::mutex> lock(mu);
    pending.push_back(Pending{done, what, step.load(), std::chrono::steady_clock::now()});
    return done;
  }
};

namespace {

class NcclWork : public Work {
 public:
  explicit NcclWork(NcclCommunicator::State::Event done) : done_(std::move(done)) {}
  // Stream order, not a host wait: kernels queued on the compute stream after this see the collective's result.
  void wait() override {
    if (waited_) return;
    waited_ = true;
    check_cuda(cudaStreamWaitEvent(compute(), done_.get(), 0), "cudaStreamWaitEvent (compute)");
  }

 private:
  NcclCommunicator::State::Event done_;
  bool waited_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, double timeout_s, NcclSetupFault fault)
    : host_(comm, timeout_s), state_(std::make_unique<State>()) {
  State& s = *state_;
  s.rank = host_.rank();
  s.device = device::current_device();
  s.timeout_s = timeout_s;
  const int world = host_.world_size();
  const std::string where = "rank " + std::to_string(s.rank) + " of " + std::to_string(world) + ", device " +
                            std::to_string(s.device);

  // 1. The unique id, from rank 0, with its status word.
  ncclUniqueId id{};
  broadcast_from_rank0(
      host_.comm(), &id, sizeof id,
      [&](void* out) {
        if (fault.stage == NcclSetupFault::Stage::kUniqueId)
          throw Error("ncclGetUniqueId: injected failure (fault.nccl_setup_error, stage UNIQUE_ID) on rank 0");
        check_nccl(ncclGetUniqueId(static_cast<ncclUniqueId*>(out)), "ncclGetUniqueId");
      },
      timeout_s, "NCCL unique id broadcast");

  // 2. Every rank starts joining without blocking, then the ranks agree that every one of them did: a rank that
  //    failed before joining would leave the others inside the join until the deadline.
  std::string start_error;
  try {
    if (fault.stage == NcclSetupFault::Stage::kInit && fault.rank == s.rank)
      throw Error("ncclCommInitRankConfig (" + where + "): injected failure (fault.nccl_setup_error, stage INIT)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&s.comm, world, id, s.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error("ncclCommInitRankConfig (" + where + "): " + ncclGetErrorString(r) + last_error(s.comm));
  } catch (const Error& e) {
    start_error = e.what();
  }
  int64_t failed[2] = {start_error.empty() ? 0 : 1, start_error.empty() ? 0 : world - s.rank};
  host_.allreduce_i64(failed, ReduceOp::kMax, "NCCL set-up status all-reduce");
  if (failed[0] != 0) {
    if (s.comm) ncclCommAbort(s.comm);
    s.comm = nullptr;
    if (!start_error.empty()) throw Error(start_error);
    Error e("NCCL set-up: rank " + std::to_string(world - failed[1]) +
            " failed before joining the communicator; rank " + std::to_string(s.rank) + " aborted its join");
    e.set_secondary();
    throw e;
  }

  // 3. The join itself, bounded by comm.timeout_s.
  const ncclResult_t state = poll_state(s.comm, after(timeout_s));
  if (state != ncclSuccess) {
    const std::string why = state == ncclInProgress
                                ? "did not complete within " + seconds(timeout_s) +
                                      " s (comm.timeout_s): a rank stopped during set-up, or the network between "
                                      "the ranks is blocked (NCCL_SOCKET_IFNAME, firewalls)"
                                : std::string(ncclGetErrorString(state)) + last_error(s.comm);
    ncclCommAbort(s.comm);
    s.comm = nullptr;
    throw Error("ncclCommInitRankConfig (" + where + ") " + why + "; the NCCL communicator was aborted");
  }
  check_cuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate (communication)");
  check_cuda(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming), "cudaEventCreate");
  s.monitor = std::thread([&s] { s.run_monitor(); });
}

NcclCommunicator::~NcclCommunicator() {
  State& s = *state_;
  s.stop = true;
  if (s.monitor.joinable()) s.monitor.join();
  // Bounded: a peer that died leaves the stream's collectives unfinished forever; then abort instead of destroy.
  const double limit = std::min(s.timeout_s.load(), 60.0);
  const Clock::time_point deadline = after(limit);
  bool clean = true;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s.stream);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady || Clock::now() > deadline) {
      clean = false;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaGetLastError();
  if (clean) {
    const ncclResult_t r = ncclCommFinalize(s.comm);
    clean = (r == ncclSuccess || r == ncclInProgress) && poll_state(s.comm, deadline) == ncclSuccess;
  }
  if (clean) {
    ncclCommDestroy(s.comm);
  } else {
    std::fprintf(stderr, "ampdist: warning: [rank %d] NCCL communicator not finished within %.0f s at shut-down; "
                 "aborting it\n", s.rank, limit);
    ncclCommAbort(s.comm);
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.pending.clear();
  }
  cudaEventDestroy(s.ready);
  cudaStreamDestroy(s.stream);
}

std::unique_ptr<Work> NcclCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op,
                                                        const std::string& what) {
  State& s = *state_;
  s.after_compute();
  s.settle(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(dtype), op == ReduceOp::kMax ? ncclMax : ncclSum,
                         s.comm, s.stream),
           what);
  ++stats_.allreduce;
  stats_.bytes += count * static_cast<int64_t>(dtype_size(dtype));
  return std::make_unique<NcclWork>(s.issued(what));
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                             std::span<const int64_t> counts, DType dtype,
                                                             const std::string& what) {
  State& s = *state_;
  const size_t es = dtype_size(dtype);
  s.after_compute();
  bool even = true;
  for (int64_t c : counts) even &= c == counts[0];
  if (even) {
    s.settle(ncclReduceScatter(send, recv, static_cast<size_t>(counts[0]), nccl_type(dtype), ncclSum, s.comm, s.stream),
             what);
  } else {
    check_nccl(ncclGroupStart(), what);
    int64_t displ = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      check_nccl(ncclReduce(static_cast<const char*>(send) + displ * es, recv, static_cast<size_t>(counts[r]),
                            nccl_type(dtype), ncclSum, static_cast<int>(r), s.comm, s.stream),
                 what);
      displ += counts[r];
    }
    s.settle(ncclGroupEnd(), what);
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  ++stats_.reduce_scatter;
  stats_.bytes += total * static_cast<int64_t>(es);
  return std::make_unique<NcclWork>(s.issued(what));
}

std::unique_ptr<Work> NcclCommunicator::allgather_inplace_async(void* buf, std::span<const int64_t> counts,
                                                                DType dtype, const std::string& what) {
  State& s = *state_;
  const size_t es = dtype_size(dtype);
  s.after_compute();
  check_nccl(ncclGroupStart(), what);
  int64_t displ = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    char* p = static_cast<char*>(buf) + displ * es;
    check_nccl(ncclBroadcast(p, p, static_cast<size_t>(counts[r]), nccl_type(dtype), static_cast<int>(r), s.comm,
                             s.stream),
               what);
    displ += counts[r];
  }
  s.settle(ncclGroupEnd(), what);
  ++stats_.allgather;
  stats_.bytes += counts[rank()] * static_cast<int64_t>(es);
  return std::make_unique<NcclWork>(s.issued(what));
}

void NcclCommunicator::allreduce_f64(std::span<double> values, ReduceOp op, const std::string& what) {
  host_.allreduce_f64(values, op, what);
}
void NcclCommunicator::allreduce_i64(std::span<int64_t> values, ReduceOp op, const std::string& what) {
  host_.allreduce_i64(values, op, what);
}
std::vector<uint64_t> NcclCommunicator::allgather_u64(uint64_t value, const std::string& what) {
  return host_.allgather_u64(value, what);
}
void NcclCommunicator::barrier(const std::string& what) { host_.barrier(what); }

void NcclCommunicator::abort(int exit_code) {
  ncclCommAbort(state_->comm);
  host_.abort(exit_code);
}

void NcclCommunicator::set_step(int64_t step) {
  state_->step = step;
  host_.set_step(step);
}

void NcclCommunicator::set_timeout(double timeout_s) {
  state_->timeout_s = timeout_s;
  host_.set_timeout(timeout_s);
}

std::string NcclCommunicator::nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (2.9 and later).
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace ampdist

#endif  // AMPDIST_HAVE_CUDA
