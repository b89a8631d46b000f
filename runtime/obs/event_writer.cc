#include "runtime/obs/event_writer.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "runtime/core/error.h"
#include "tensorboard/tb_event.pb.h"

namespace ampdist {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  // Castagnoli: polynomial 0x1EDC6F41, reflected input and output, init and final xor all ones (RFC 3720 B.4).
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, mask_crc(crc32c(out)), 4);
  out.append(data);
  put_le(out, mask_crc(crc32c(data)), 4);
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const auto secs = static_cast<long long>(unix_seconds());
  path_ = dir + "/events.out.tfevents." + std::to_string(secs) + "." + host;
  // A second writer in the same second (a resumed run) must not truncate the first file: TensorBoard reads every
  // events file of a directory, so a numbered sibling is as good.
  for (int i = 1; std::filesystem::exists(path_); ++i)
    path_ = dir + "/events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(i);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error(path_ + ": cannot create the TensorBoard event file: " + std::strerror(errno));
  tensorboard::Event e;
  e.set_wall_time(unix_seconds());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  for (const auto& [tag, v] : scalars) {
    tensorboard::Summary::Value* value = e.mutable_summary()->add_value();
    value->set_tag(tag);
    value->set_simple_value(static_cast<float>(v));
  }
  write_record(e.SerializeAsString());
}

void EventFileWriter::write_record(const std::string& data) {
  const std::string rec = tfrecord_frame(data);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    throw Error(path_ + ": write failed: " + std::strerror(errno));
}

void EventFileWriter::flush() {
  if (std::fflush(file_) != 0) throw Error(path_ + ": flush failed: " + std::strerror(errno));
}

}  // namespace ampdist
