// TensorBoard event files written natively: TFRecord framing around serialized Event messages
// (proto/tensorboard/tb_event.proto), readable by TensorBoard and its event accumulator.
//
// TFRecord framing (the format of tensorflow/core/lib/io/record_writer): for each record
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 over the CRC-32C (Castagnoli) of x.
// The file is <dir>/events.out.tfevents.<unix seconds>.<hostname>; its first record carries file_version
// "brain.Event:2".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ampdist {

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, init and final xor 0xFFFFFFFF) of `data`;
// crc32c("123456789") = 0xE3069283. Computed by Boost.CRC.
uint32_t crc32c(std::string_view data);
// The TFRecord mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
uint32_t mask_crc(uint32_t crc);
// One TFRecord: length, masked CRC of the length, data, masked CRC of the data (16 + data.size() bytes).
std::string tfrecord_frame(std::string_view data);

class EventFileWriter {
 public:
  // Creates `dir` if missing and opens a new event file in it. Throws Error naming the path when it cannot.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // Writes one Event at `step` holding every (tag, value) pair as a scalar summary value. Non-finite values are
  // written as they are (TensorBoard shows NaN and inf).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // Flushes buffered records to the file (called at every log line, so a crash loses at most one window).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ampdist
