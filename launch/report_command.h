// `ampdist report RUN_DIR... -o report.html`: the runs' metrics.jsonl side by side in one self-contained HTML page
// (runtime/obs/report.h). Single-process; under mpirun rank 0 writes it.
#pragma once

#include <string>
#include <vector>

namespace ampdist {

struct ReportArgs {
  std::vector<std::string> run_dirs;  // RUN_DIR...
  std::string output;                 // -o FILE (written to FILE.tmp, then renamed)
};

// Returns the exit code: 0, or 2 with one "ampdist: error:" line naming the file for bad input.
int run_report_command(const ReportArgs& args);

}  // namespace ampdist
