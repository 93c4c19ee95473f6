// Starting R rank processes of this program (a Gloo group over a FileStore) and reaping them;
// shared by `train --nproc` and `worker --nproc`.
#pragma once

#include <string>
#include <vector>

namespace xloco::cli {

// Re-runs `argv` as `nproc` rank processes (XLOCO_RANK, XLOCO_WORLD_SIZE, XLOCO_STORE set),
// forwarding Ctrl+C; returns 0, 130 when interrupted, or the first failing rank's code.
int launch_ranks(const std::vector<std::string>& argv, int nproc, const std::string& store_dir);

// True in a process started by launch_ranks.
bool is_rank_process();

// How many training processes share this host (XLOCO_RANKS_ON_HOST, set by the launchers).
int ranks_on_host(int fallback);

}  // namespace xloco::cli
