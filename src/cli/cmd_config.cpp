// `xloco config --config FILE [--set k=v]...`: the config a run with these arguments uses, every
// field filled in (defaults included) and validated, as the JSON that `xloco head` and
// `xloco train` write to runs/NAME/config.json. Tools read it instead of guessing defaults.
#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "common/config.h"
#include "inner/data.h"

namespace xloco::cli {

void add_config_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    bool explain = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("config", "print the resolved run config (defaults filled in) as JSON");
  cmd->add_option("--config", a->config, "JSON run config")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config value, e.g. --set outer.inner_steps=25");
  cmd->add_flag("--explain", a->explain,
                "one line per key: its value, where it came from (default, recipe, preset, file, "
                "--set), who must agree on it (agreed: head and providers, in the config hash; "
                "own: each machine's; head: the head's alone) and whether it does anything here");
  cmd->callback([a]() {
    const auto cfg = inner::load_run_config(a->config, a->overrides);
    if (!a->explain) {
      std::cout << common::to_json_string(cfg) << "\n";
      return;
    }
    size_t width = 0;
    const auto keys = common::explain_config(a->config, a->overrides, cfg);
    for (const auto& k : keys) width = std::max(width, k.key.size() + 3 + k.value.size());
    for (const auto& k : keys) {
      const std::string kv = k.key + " = " + k.value;
      std::cout << kv << std::string(width + 2 - kv.size(), ' ') << k.source
                << std::string(9 - std::min<size_t>(8, k.source.size()), ' ') << k.scope
                << (k.inert.empty() ? "" : "  (" + k.inert + ")") << "\n";
    }
  });
}

}  // namespace xloco::cli
