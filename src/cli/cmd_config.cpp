// `xloco config --config FILE [--set k=v]...`: the config a run with these arguments uses, every
// field filled in (defaults included) and validated, as the JSON that `xloco head` and
// `xloco train` write to runs/NAME/config.json. Tools read it instead of guessing defaults.
#include <iostream>

#include "cli/commands.h"
#include "common/config.h"
#include "inner/data.h"

namespace xloco::cli {

void add_config_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("config", "print the resolved run config (defaults filled in) as JSON");
  cmd->add_option("--config", a->config, "JSON run config")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config value, e.g. --set outer.inner_steps=25");
  cmd->callback([a]() {
    std::cout << common::to_json_string(inner::load_run_config(a->config, a->overrides)) << "\n";
  });
}

}  // namespace xloco::cli
