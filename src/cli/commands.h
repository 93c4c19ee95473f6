// One registration function per sub-command, each in its own cmd_*.cpp (CLI11).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace xloco::cli {

// The command line as given, for re-launching this program as child processes.
const std::vector<std::string>& original_argv();

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_keygen_command(CLI::App& app);
void add_head_command(CLI::App& app);
void add_worker_command(CLI::App& app);
void add_local_command(CLI::App& app);
void add_status_command(CLI::App& app);
void add_config_command(CLI::App& app);

}  // namespace xloco::cli
