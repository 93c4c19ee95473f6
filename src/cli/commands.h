// One registration function per sub-command, each in its own cmd_*.cpp (CLI11).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace xloco::cli {

// The command line as given, for re-launching this program as child processes.
const std::vector<std::string>& original_argv();
// Warns when `secret` (a Z85 secret key, a bearer token) was given on the command line, where
// every user of the machine reads it in `ps`; `env` names the variable to use instead.
void warn_if_in_argv(const std::string& secret, const std::string& option, const std::string& env);

// The end-of-run summary of a DiLoCo run directory (its summary.json), as `xloco local` prints it
// at the end and `xloco status --run` prints it for a run that has ended; `wall` < 0: the
// summary's own wall time.
void print_summary(const std::filesystem::path& run_dir, double wall = -1);

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_keygen_command(CLI::App& app);
void add_head_command(CLI::App& app);
void add_worker_command(CLI::App& app);
void add_local_command(CLI::App& app);
void add_status_command(CLI::App& app);
void add_config_command(CLI::App& app);
void add_prepare_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_advise_command(CLI::App& app);

}  // namespace xloco::cli
