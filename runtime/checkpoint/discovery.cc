// Resume discovery: the newest checkpoint, what is wrong with a damaged one, and moving damaged ones aside
// (checkpoint.h).
#include <fcntl.h>  // AT_FDCWD

#include <cerrno>
#include <cstdio>  // renameat2
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/shard_format.h"
#include "runtime/core/error.h"

namespace ampdist {

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
// The step directory the `latest` file of dir names (dir/step_N), when there is one and it names a step.
std::optional<fs::path> named_latest(const std::string& dir) {
  std::error_code ec;
  const fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest, ec)) return std::nullopt;
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  if (step_of(name) < 0) return std::nullopt;
  return fs::path(dir) / name;
}
}  // namespace

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  if (const auto p = named_latest(dir); p && verify_checkpoint(p->string()).empty()) return p->string();
  auto all = complete_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (verify_checkpoint(it->second).empty()) return it->second;
  return std::nullopt;
}

std::string whole_checkpoint_problem(const std::string& path) {
  try {
    const Manifest m = read_manifest(path);
    if (m.shards_size() != m.world_size())
      return (fs::path(path) / "manifest.pb").string() + ": lists " + std::to_string(m.shards_size()) +
             " shards for world size " + std::to_string(m.world_size());
    std::error_code ec;
    for (const ShardFileInfo& s : m.shards()) {
      const fs::path f = fs::path(path) / s.file();
      if (!fs::is_regular_file(f, ec)) return f.string() + ": missing";
      const auto size = static_cast<int64_t>(fs::file_size(f, ec));
      if (size != s.bytes())
        return f.string() + ": " + std::to_string(size) + " bytes, the manifest lists " + std::to_string(s.bytes());
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

ResumeScan scan_for_resume(const std::string& dir) {
  std::vector<std::string> order;
  std::error_code ec;
  if (const auto p = named_latest(dir); p && fs::is_directory(*p, ec)) order.push_back(p->string());
  // Every step_* directory, a manifest or not: one without is damaged too (a save publishes the manifest before the
  // directory gets its step_* name).
  std::vector<std::pair<int64_t, std::string>> all;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const int64_t s = step_of(e.path().filename().string());
      if (s >= 0 && e.is_directory(ec)) all.emplace_back(s, e.path().string());
    }
  std::sort(all.begin(), all.end());
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (std::find(order.begin(), order.end(), it->second) == order.end()) order.push_back(it->second);
  ResumeScan out;
  for (const std::string& path : order) {
    std::string problem = whole_checkpoint_problem(path);
    if (problem.empty())
      out.candidates.push_back(path);
    else
      out.damaged.emplace_back(path, std::move(problem));
  }
  return out;
}

bool is_moved_aside(const std::string& dirname) {
  const size_t dot = dirname.find(".damaged");
  if (dot != 13 || step_of(dirname.substr(0, 13)) < 0) return false;
  const std::string rest = dirname.substr(dot + 8);  // "" or ".N"
  return rest.empty() || (rest.size() > 1 && rest[0] == '.' &&
                          std::all_of(rest.begin() + 1, rest.end(), [](char c) { return c >= '0' && c <= '9'; }));
}

std::string move_aside_damaged(const std::string& path) {
  const fs::path from = fs::path(path).lexically_normal();
  // RENAME_NOREPLACE: never onto anything already there (an earlier damaged copy of the same step keeps its name).
  for (int n = 1;; ++n) {
    std::string to = from.string() + ".damaged";
    if (n > 1) to.append(".").append(std::to_string(n));
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      fsync_path(from.parent_path().string());
      return to;
    }
    if (errno != EEXIST || n >= 1000)
      throw Error("cannot move the damaged checkpoint " + from.string() + " aside to " + to + ": " + errno_text());
  }
}

}  // namespace ampdist
