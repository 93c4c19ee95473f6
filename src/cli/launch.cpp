#include "cli/launch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "common/process.h"

namespace xloco::cli {

bool is_rank_process() { return std::getenv("XLOCO_RANK") != nullptr; }

int ranks_on_host(int fallback) {
  const char* v = std::getenv("XLOCO_RANKS_ON_HOST");
  return v ? std::max(1, std::atoi(v)) : fallback;
}

int launch_ranks(const std::vector<std::string>& argv, int nproc, const std::string& store_dir) {
  namespace fs = std::filesystem;
  fs::create_directories(store_dir);
  const std::string store = (fs::path(store_dir) / fmt::format(".store-{}", ::getpid())).string();
  fs::remove(store);
  common::install_forwarding_handlers();
  std::vector<pid_t> pids;
  std::vector<std::string> labels;
  const int on_host = ranks_on_host(1) * nproc;
  for (int r = 0; r < nproc; ++r) {
    common::ChildSpec spec;
    spec.label = fmt::format("rank {}", r);
    spec.argv = argv;
    spec.argv[0] = common::self_exe();
    spec.env = {fmt::format("XLOCO_RANK={}", r), fmt::format("XLOCO_WORLD_SIZE={}", nproc),
                "XLOCO_STORE=file:" + store, fmt::format("XLOCO_RANKS_ON_HOST={}", on_host)};
    pids.push_back(common::spawn_child(spec));
    labels.push_back(spec.label);
  }
  const auto results = common::wait_children(pids, labels);
  fs::remove(store);
  if (common::pending_signal() != 0) return 130;
  for (const auto& r : results) {
    if (r.exit_code != 0) return r.exit_code;
  }
  return 0;
}

}  // namespace xloco::cli
