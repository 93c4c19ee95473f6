// CURVE key pairs and the head's allow-list: generation, key files, and the checks on them.
// A secret key file holds one Z85 line and must be readable by its owner only (refused
// otherwise, as ssh does); a public key file holds one Z85 line. The sockets that use the
// keys are in zmq/; `xloco keygen` (src/cli/cmd_keygen.cpp) is a thin wrapper over this.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "net/errors.h"

namespace xloco::net {

inline constexpr std::size_t kZ85KeyLength = 40;  // 32 key bytes in Z85

struct KeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; never logged
};

bool is_z85_key(std::string_view text);

KeyPair generate_keypair();

// The public half of a secret key (so a .key file alone is enough to run).
std::string public_key_of(std::string_view secret_key);

struct KeyFiles {
  std::filesystem::path secret_file;  // STEM.key
  std::filesystem::path public_file;  // STEM.pub
};

// Writes STEM.key (created 0600 with O_EXCL, so it never exists with wider rights and is
// never overwritten) and STEM.pub, creating STEM's directory if needed. Throws KeyError if
// either file exists.
KeyFiles write_keypair(const std::filesystem::path& stem, const KeyPair& pair);

// Reads a secret key file; refuses it if group or others may read or write it.
KeyPair load_keypair(const std::filesystem::path& secret_file);

std::string load_public_key(const std::filesystem::path& public_file);

// A secret key given as a file (checked as load_keypair does) or as its Z85 text, e.g. from an
// environment variable set by a container orchestrator. `what` names the setting in errors;
// the secret itself is never put in a message.
KeyPair keypair_from(const std::string& file_or_z85, const std::string& what);
// A public key given as a file or as Z85 text; a file wins (a 40-character path is valid Z85).
std::string public_key_from(const std::string& file_or_z85, const std::string& what);

// Public keys admitted by the head, each with a name that identifies the provider in logs
// and to the outer loop (the file stem: keys/alice.pub is "alice").
class AllowList {
 public:
  // Each path is a .pub file or a directory whose *.pub files are all loaded.
  static AllowList load(const std::vector<std::filesystem::path>& paths);
  // As load(), and an entry NAME=Z85KEY lists that key under that name (no file needed).
  static AllowList parse(const std::vector<std::string>& entries);

  // Throws KeyError if the key is malformed or the key or name is already listed.
  void add(const std::string& name, const std::string& public_key);

  // The name listed for `public_key`, or nullptr when it is not listed.
  const std::string* find(const std::string& public_key) const;

  std::size_t size() const noexcept { return names_.size(); }
  bool empty() const noexcept { return names_.empty(); }

 private:
  std::map<std::string, std::string> names_;  // public key (Z85) → name
};

}  // namespace xloco::net
