// Shared by the fuzz targets: a per-process scratch directory (the library readers take paths) and file writing.
#pragma once

#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace ampdist_fuzz {

// <base>/ampdist_fuzz_<name>_<pid>, created on first use and removed at a normal exit (a crash leaves it: run_fuzz.sh
// sets the base, AMPDIST_FUZZ_SCRATCH, to a directory of its own that it removes). The base is otherwise /dev/shm,
// or $TMPDIR (/tmp) when /dev/shm is missing. One per process, so parallel jobs (-jobs, -fork) never share files.
inline const std::string& scratch_dir(const char* name) {
  static const std::string dir = [name] {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::string base = "/dev/shm";
    if (const char* s = std::getenv("AMPDIST_FUZZ_SCRATCH"); s && *s) {
      base = s;
    } else if (!fs::is_directory(base, ec) || ::access(base.c_str(), W_OK) != 0) {
      const char* t = std::getenv("TMPDIR");
      base = t && *t ? t : "/tmp";
    }
    std::string d = base + "/ampdist_fuzz_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(d, ec);
    fs::create_directories(d);
    static std::string to_remove = d;
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(to_remove, e);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

inline std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz harness: cannot read %s\n", path.c_str());
    std::abort();
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Silences libprotobuf's log lines (invalid UTF-8 in string fields, ...): fuzzed input provokes them by the
// thousand, which slows the run and buries a finding's report. A FATAL log still aborts.
inline void quiet_protobuf() { google::protobuf::SetLogHandler(nullptr); }

// Empties `dir` (creating it if needed).
inline void reset_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
}

}  // namespace ampdist_fuzz
