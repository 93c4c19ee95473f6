// xloco: one binary, one sub-command per role (design §1).
#include <filesystem>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/alloc.h"
#include "common/error.h"
#include "inner/blas_core.h"

namespace xloco::cli {
namespace {
std::vector<std::string> g_argv;
}
const std::vector<std::string>& original_argv() { return g_argv; }
void set_argv_for_main(int argc, char** argv) { g_argv.assign(argv, argv + argc); }
void warn_if_in_argv(const std::string& secret, const std::string& option, const std::string& env) {
  if (secret.empty() || std::filesystem::exists(secret)) return;  // a file's path, not the secret
  for (const auto& arg : g_argv) {
    if (arg == secret || arg == option + "=" + secret) {
      spdlog::warn("{} was given on the command line, where every user of this machine can read "
                   "it (ps, /proc); pass it in {} or a file instead",
                   option, env);
      return;
    }
  }
}
}  // namespace xloco::cli

int main(int argc, char** argv) {
  // Before anything else: OpenBLAS's kernels can only be chosen before it loads (blas_core.h).
  if (argc > 1 && xloco::inner::command_uses_blas(argv[1])) {
    const std::string note = xloco::inner::reexec_with_blas_core(argv);
    if (!note.empty()) std::fprintf(stderr, "xloco: warning: %s\n", note.c_str());
  }
  xloco::cli::set_argv_for_main(argc, argv);
  // Every command trains or evaluates unless it says otherwise (`xloco head` does).
  xloco::common::set_alloc_policy(xloco::common::AllocPolicy::kTrainer);
  spdlog::set_pattern("%H:%M:%S %^%l%$ %v");
  CLI::App app{"xloco — DiLoCo training across GPU providers joined by slow, untrusted links"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "xloco 0.1.0");
  xloco::cli::add_train_command(app);
  xloco::cli::add_eval_command(app);
  xloco::cli::add_sample_command(app);
  xloco::cli::add_keygen_command(app);
  xloco::cli::add_head_command(app);
  xloco::cli::add_worker_command(app);
  xloco::cli::add_local_command(app);
  xloco::cli::add_status_command(app);
  xloco::cli::add_config_command(app);
  xloco::cli::add_prepare_command(app);
  xloco::cli::add_export_command(app);
  xloco::cli::add_advise_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const xloco::common::Error& e) {
    std::fprintf(stderr, "xloco: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xloco: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
