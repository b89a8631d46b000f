// Streaming shard-file I/O (direct_io.h).
#include "runtime/checkpoint/direct_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <new>

#include "runtime/checkpoint/shard_format.h"
#include "runtime/core/error.h"

namespace ampdist::ckpt {
namespace {

constexpr int kBlocks = 3;       // writer: one being filled, two in flight
constexpr int kReadBlocks = 4;   // reader: one being consumed, the rest read ahead
constexpr int kReadThreads = 2;  // reads in flight

int64_t align_down(int64_t v) { return v / static_cast<int64_t>(kDirectAlign) * static_cast<int64_t>(kDirectAlign); }
int64_t align_up(int64_t v) { return align_down(v + static_cast<int64_t>(kDirectAlign) - 1); }

// Opens with O_DIRECT when enabled and the file system takes it, else without. direct: which one it got.
int open_maybe_direct(const std::string& path, int flags, bool try_direct, bool& direct) {
  direct = false;
  if (try_direct) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      direct = true;
      return fd;
    }
    if (errno != EINVAL) return -1;  // a real error: the same open without O_DIRECT would fail too
  }
  return ::open(path.c_str(), flags | O_CLOEXEC, 0644);
}

// After EINVAL from an O_DIRECT transfer: the same descriptor without O_DIRECT.
bool drop_direct(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

}  // namespace

bool direct_io_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("AMPDIST_CKPT_DIRECT_IO");
    if (v == nullptr || *v == '\0') return true;
    std::string s(v);
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "0" || s == "false" || s == "off" || s == "no") return false;
    if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
    throw BadInput("AMPDIST_CKPT_DIRECT_IO", "is '" + std::string(v) + "': expected 1/true/on/yes or 0/false/off/no");
  }();
  return enabled;
}

AlignedBlock::AlignedBlock(size_t bytes) : p_(static_cast<char*>(std::aligned_alloc(kDirectAlign, bytes))) {
  if (p_ == nullptr) throw std::bad_alloc();
}
AlignedBlock::~AlignedBlock() { std::free(p_); }

// ---- writer ------------------------------------------------------------------------------------------------------

ShardFileWriter::ShardFileWriter(const std::string& path, bool try_direct) : path_(path), blocks_(kBlocks) {
  fd_ = open_maybe_direct(path, O_WRONLY | O_CREAT | O_TRUNC, try_direct, direct_);
  if (fd_ < 0) throw Error(path + ": cannot create: " + errno_text());
  worker_direct_ = direct_;
  for (AlignedBlock& b : blocks_) free_.push_back(&b);
  filling_ = free_.back();
  free_.pop_back();
  worker_ = std::thread([this] { run(); });
}

ShardFileWriter::~ShardFileWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  ::close(fd_);
}

void ShardFileWriter::append(const char* data, size_t n) {
  while (n > 0) {
    if (filling_ == nullptr) throw Error(path_ + ": write after flush");
    const size_t take = std::min(n, kStreamBlockBytes - filled_);
    std::memcpy(filling_->data() + filled_, data, take);
    filled_ += take;
    appended_ += static_cast<int64_t>(take);
    data += take;
    n -= take;
    if (filled_ == kStreamBlockBytes) submit(kStreamBlockBytes);
  }
}

// Hands the filled block to the worker and takes a free one (waiting for the worker when none is free).
void ShardFileWriter::submit(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (error_ != 0) {
    errno = error_;
    throw Error(path_ + ": write failed: " + errno_text());
  }
  jobs_.push_back(Job{filling_, submitted_, bytes});
  submitted_ += static_cast<int64_t>(bytes);
  ++in_flight_;
  filling_ = nullptr;
  filled_ = 0;
  cv_.notify_all();
  cv_.wait(lock, [&] { return !free_.empty(); });
  filling_ = free_.back();
  free_.pop_back();
}

void ShardFileWriter::flush() {
  if (flushed_) return;
  if (filling_ != nullptr && filled_ > 0) {
    // The tail block: zero-padded to the alignment an O_DIRECT write needs, cut back to the true size below.
    const size_t padded = direct_ ? static_cast<size_t>(align_up(static_cast<int64_t>(filled_))) : filled_;
    std::memset(filling_->data() + filled_, 0, padded - filled_);
    submit(padded);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    if (filling_ != nullptr) {
      free_.push_back(filling_);
      filling_ = nullptr;
    }
  }
  throw_if_failed();
  if (submitted_ != appended_ && ::ftruncate(fd_, appended_) != 0)
    throw Error(path_ + ": write failed: " + errno_text());
  flushed_ = true;
}

void ShardFileWriter::finish() {
  flush();
  if (::fsync(fd_) != 0) throw Error(path_ + ": fsync failed: " + errno_text());
}

void ShardFileWriter::throw_if_failed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_ != 0) {
    errno = error_;
    throw Error(path_ + ": write failed: " + errno_text());
  }
}

bool ShardFileWriter::write_block(const Job& job) {
  size_t done = 0;
  while (done < job.bytes) {
    const ssize_t w = ::pwrite(fd_, job.block->data() + done, job.bytes - done, job.offset + static_cast<int64_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && worker_direct_ && done == 0 && drop_direct(fd_)) {
      worker_direct_ = false;  // refused after open: buffered from here (once: a second EINVAL is an error)
      continue;
    }
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}

void ShardFileWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_ with nothing left
    const Job job = jobs_.front();
    jobs_.pop_front();
    const bool skip = error_ != 0;
    lock.unlock();
    const bool ok = skip || write_block(job);
    const int err = errno;
    lock.lock();
    if (!ok && error_ == 0) error_ = err;
    free_.push_back(job.block);
    --in_flight_;
    cv_.notify_all();
  }
}

// ---- reader ------------------------------------------------------------------------------------------------------

ShardFileReader::ShardFileReader(const std::string& path, std::vector<std::pair<int64_t, int64_t>> ranges,
                                 bool try_direct)
    : ranges_(std::move(ranges)) {
  fd_ = open_maybe_direct(path, O_RDONLY, try_direct, direct_);
  if (fd_ < 0) {
    open_error_ = errno_text();
    return;
  }
  for (const auto& [offset, length] : ranges_) {
    if (length <= 0) continue;  // consume() takes it without a piece
    // Blocks of the range: aligned for O_DIRECT (the bytes around the range are read and skipped).
    const int64_t end = offset + length;
    for (int64_t at = direct_ ? align_down(offset) : offset; at < end;) {
      Transfer t;
      t.at = at;
      t.end = std::min(at + static_cast<int64_t>(kStreamBlockBytes), direct_ ? align_up(end) : end);
      t.offset = std::max(at, offset);
      t.len = static_cast<size_t>(std::min(t.end, end) - t.offset);
      transfers_.push_back(t);
      at = t.end;
    }
  }
  // A small file (a test's, a tiny model's) gets one small block and one thread, not 4 x 8 MiB and two.
  int64_t largest = 0;
  for (const Transfer& t : transfers_) largest = std::max(largest, t.end - t.at);
  const size_t n = transfers_.size();
  for (size_t i = 0; i < std::min<size_t>(kReadBlocks, n); ++i)
    blocks_.emplace_back(static_cast<size_t>(align_up(largest)));
  for (AlignedBlock& b : blocks_) free_.push_back(&b);
  for (size_t i = 0; i < std::min<size_t>(kReadThreads, n); ++i) workers_.emplace_back([this] { run(); });
}

ShardFileReader::~ShardFileReader() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& w : workers_) w.join();
  ::close(fd_);
}

// A worker: claims the next transfer (in file order) and a free block, reads, hands the piece over. Every transfer
// is handed over, read or failed, so the consumer never waits for one that will not come.
void ShardFileReader::run() {
  bool direct = direct_;
  for (;;) {
    size_t i;
    AlignedBlock* block;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || next_transfer_ >= transfers_.size() || !free_.empty(); });
      if (stop_ || next_transfer_ >= transfers_.size()) return;
      i = next_transfer_++;
      block = free_.back();
      free_.pop_back();
    }
    const Transfer& t = transfers_[i];
    const size_t want = static_cast<size_t>(t.end - t.at);
    size_t got = 0;
    while (got < want) {
      const ssize_t r = ::pread(fd_, block->data() + got, want - got, t.at + static_cast<int64_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL && direct && got == 0 && drop_direct(fd_)) {
        direct = false;  // refused after open: buffered from here, same offsets
        continue;
      }
      if (r <= 0) break;  // EOF (a short file) or an error
      got += static_cast<size_t>(r);
    }
    Piece piece;
    piece.block = block;
    piece.ok = static_cast<int64_t>(got) >= t.offset + static_cast<int64_t>(t.len) - t.at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[i] = piece;
    }
    cv_.notify_all();
  }
}

bool ShardFileReader::consume(int64_t offset, int64_t length, const std::function<void(const char*, size_t)>& fn) {
  if (fd_ < 0 || next_range_ >= ranges_.size() || ranges_[next_range_] != std::make_pair(offset, length)) {
    next_range_ = ranges_.size();  // the stream no longer matches the plan: nothing more is read
    return false;
  }
  ++next_range_;
  for (int64_t seen = 0; seen < length;) {
    Piece piece;
    const Transfer& t = transfers_[next_piece_];
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return ready_.count(next_piece_) > 0; });
      piece = ready_[next_piece_];
      ready_.erase(next_piece_);
      ++next_piece_;
    }
    const bool ok = piece.ok && t.offset == offset + seen;
    if (ok) fn(piece.block->data() + (t.offset - t.at), t.len);
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(piece.block);
    }
    cv_.notify_all();
    if (!ok) {
      next_range_ = ranges_.size();
      return false;
    }
    seen += static_cast<int64_t>(t.len);
  }
  return true;
}

}  // namespace ampdist::ckpt
