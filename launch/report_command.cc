#include "launch/report_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "runtime/core/error.h"
#include "runtime/obs/report.h"

namespace ampdist {

int run_report_command(const ReportArgs& args) {
  try {
    std::vector<RunData> runs;
    for (const std::string& d : args.run_dirs) runs.push_back(load_run(d));
    const std::string html = render_report(runs);
    const std::string tmp = args.output + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw BadInput(args.output, "cannot be written");
      out << html;
      if (!out.flush()) throw BadInput(args.output, "write failed");
    }
    std::filesystem::rename(tmp, args.output);
    std::cout << "report: " << args.output << " (" << runs.size() << " runs)\n";
  } catch (const Error& e) {
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace ampdist
