// `xloco keygen NAME`: a CURVE key pair for a head or a provider. The work (and the file
// permission rules) is in src/net/keys; this file only parses and prints.
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "net/keys.h"

namespace xloco::cli {

void add_keygen_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "keygen", "Write NAME.key (secret, mode 0600) and NAME.pub (public) for a CURVE link");
  auto name = std::make_shared<std::string>();
  cmd->add_option("NAME", *name,
                  "Path stem of the key files: keys/alice writes keys/alice.key and keys/alice.pub")
      ->required();
  cmd->callback([name] {
    const net::KeyPair pair = net::generate_keypair();
    const net::KeyFiles files = net::write_keypair(*name, pair);
    std::cout << "wrote " << files.secret_file.string() << " (secret: keep it, mode 0600)\n"
              << "wrote " << files.public_file.string()
              << " (public: give it to the head's allow-list, or to providers if this is "
                 "the head)\n"
              << "public key " << pair.public_key << "\n";
  });
}

}  // namespace xloco::cli
