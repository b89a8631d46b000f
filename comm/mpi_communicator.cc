#include "comm/mpi_communicator.h"

#include <climits>
#include <cstdio>
#include <numeric>

#include "runtime/core/error.h"

namespace ampdist {
namespace {

template <typename T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

// The user-defined sum ops for 16-bit floats, created once per process (MPI_Op_create after MPI_Init).
MPI_Op sum_op(DType dtype) {
  static MPI_Op fp16 = MPI_OP_NULL, bf16 = MPI_OP_NULL;
  if (fp16 == MPI_OP_NULL) {
    MPI_Op_create(&sum16<half>, /*commute=*/1, &fp16);
    MPI_Op_create(&sum16<bfloat16>, /*commute=*/1, &bf16);
  }
  switch (dtype) {
    case DType::kFloat16: return fp16;
    case DType::kBFloat16: return bf16;
    case DType::kFloat32: break;
  }
  return MPI_SUM;
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T; }

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (op == ReduceOp::kSum) return sum_op(dtype);
  if (dtype != DType::kFloat32) throw Error("MPI max over 16-bit floats is not supported");
  return MPI_MAX;
}

int to_int(int64_t n, const std::string& what) {
  if (n < 0 || n > INT_MAX)
    throw Error(what + ": " + std::to_string(n) + " elements exceed one MPI call's int count; lower comm.bucket_cap_mb");
  return static_cast<int>(n);
}

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(what + " failed: " + std::string(msg, len));
}

class MpiWork : public Work {
 public:
  MpiWork(MPI_Request req, Watchdog& wd, std::string what, std::vector<int> counts, std::vector<int> displs)
      : req_(req), wd_(wd), what_(std::move(what)), counts_(std::move(counts)), displs_(std::move(displs)) {}
  ~MpiWork() override {
    // A Work dropped without wait() (an exception unwinding mid-step) must not leave MPI writing into freed memory.
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    wd_.arm(what_);
    int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
    wd_.disarm();
    check(rc, what_);
  }
  std::vector<int>& counts() { return counts_; }
  std::vector<int>& displs() { return displs_; }
  MPI_Request* request() { return &req_; }

 private:
  MPI_Request req_;
  Watchdog& wd_;
  std::string what_;
  // Nonblocking collectives read their count arrays until completion: they live here until then.
  std::vector<int> counts_, displs_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : watchdog_(0, timeout_s) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("MpiCommunicator: MPI is not initialised (create an MpiRuntime first)");
  MPI_Comm_dup(comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  // Errors come back as return codes and become ampdist::Error with the collective's name.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  watchdog_.set_rank(rank_);
  sum_op(DType::kFloat16);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op,
                                                       const std::string& what) {
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count, what), mpi_type(dtype), mpi_op(op, dtype), comm_, &req),
        what);
  ++stats_.allreduce;
  stats_.bytes += count * static_cast<int64_t>(dtype_size(dtype));
  return std::make_unique<MpiWork>(req, watchdog_, what, std::vector<int>{}, std::vector<int>{});
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                            std::span<const int64_t> counts, DType dtype,
                                                            const std::string& what) {
  if (static_cast<int>(counts.size()) != size_) throw Error(what + ": need one count per rank");
  std::vector<int> c(counts.size());
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) total += (c[i] = to_int(counts[i], what));
  auto work = std::make_unique<MpiWork>(MPI_REQUEST_NULL, watchdog_, what, std::move(c), std::vector<int>{});
  check(MPI_Ireduce_scatter(send, recv, work->counts().data(), mpi_type(dtype), sum_op(dtype), comm_,
                            work->request()),
        what);
  ++stats_.reduce_scatter;
  stats_.bytes += total * static_cast<int64_t>(dtype_size(dtype));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::allgather_inplace_async(void* buf, std::span<const int64_t> counts,
                                                               DType dtype, const std::string& what) {
  if (static_cast<int>(counts.size()) != size_) throw Error(what + ": need one count per rank");
  std::vector<int> c(counts.size()), d(counts.size());
  int64_t displ = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    c[i] = to_int(counts[i], what);
    d[i] = to_int(displ, what);
    displ += counts[i];
  }
  auto work = std::make_unique<MpiWork>(MPI_REQUEST_NULL, watchdog_, what, std::move(c), std::move(d));
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, work->counts().data(), work->displs().data(),
                        mpi_type(dtype), comm_, work->request()),
        what);
  ++stats_.allgather;
  stats_.bytes += counts[rank_] * static_cast<int64_t>(dtype_size(dtype));
  return work;
}

void MpiCommunicator::allreduce_host(void* values, size_t count, MPI_Datatype type, ReduceOp op,
                                     const std::string& what) {
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, values, to_int(count, what), type, op == ReduceOp::kSum ? MPI_SUM : MPI_MAX,
                       comm_, &req),
        what);
  ++stats_.allreduce;
  MpiWork(req, watchdog_, what, {}, {}).wait();
}

void MpiCommunicator::allreduce_f64(std::span<double> values, ReduceOp op, const std::string& what) {
  allreduce_host(values.data(), values.size(), MPI_DOUBLE, op, what);
}

void MpiCommunicator::allreduce_i64(std::span<int64_t> values, ReduceOp op, const std::string& what) {
  allreduce_host(values.data(), values.size(), MPI_INT64_T, op, what);
}

std::vector<uint64_t> MpiCommunicator::allgather_u64(uint64_t value, const std::string& what) {
  std::vector<uint64_t> out(size_);
  MPI_Request req;
  check(MPI_Iallgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, comm_, &req), what);
  ++stats_.allgather;
  MpiWork(req, watchdog_, what, {}, {}).wait();
  return out;
}

void MpiCommunicator::barrier(const std::string& what) {
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), what);
  MpiWork(req, watchdog_, what, {}, {}).wait();
}

void MpiCommunicator::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(comm_ == MPI_COMM_NULL ? MPI_COMM_WORLD : comm_, exit_code);
  std::_Exit(exit_code);
}

}  // namespace ampdist
