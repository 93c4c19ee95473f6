// Key files: generation, the 0600-at-creation rule, refusal of readable secrets (as ssh
// does), the allow-list directory, and `xloco keygen` on top of them.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "helpers.h"

namespace xloco::net::test {
namespace {

namespace fs = std::filesystem;

mode_t mode_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// Runs with the given umask, restoring the old one.
template <typename F>
void with_umask(mode_t mask, F&& body) {
  const mode_t old = ::umask(mask);
  try {
    body();
  } catch (...) {
    ::umask(old);
    throw;
  }
  ::umask(old);
}

}  // namespace

TEST_SUITE("net.keys") {
  TEST_CASE("a generated key pair is Z85 and its public half derives from the secret") {
    const KeyPair pair = generate_keypair();
    CHECK(is_z85_key(pair.public_key));
    CHECK(is_z85_key(pair.secret_key));
    CHECK(pair.public_key != pair.secret_key);
    CHECK(public_key_of(pair.secret_key) == pair.public_key);
    CHECK(generate_keypair().public_key != pair.public_key);
    CHECK_FALSE(is_z85_key("short"));
    CHECK_FALSE(is_z85_key(std::string(40, ' ')));
  }

  TEST_CASE("key files are written 0600 from creation and read back") {
    TempDir dir;
    const KeyPair pair = generate_keypair();
    KeyFiles files;
    with_umask(0, [&] { files = write_keypair(dir.path() / "keys" / "alice", pair); });
    CHECK(files.secret_file == dir.path() / "keys" / "alice.key");
    CHECK(files.public_file == dir.path() / "keys" / "alice.pub");
    CHECK(mode_of(files.secret_file) == 0600);  // even with umask 0: set at creation
    CHECK(mode_of(files.public_file) == 0644);
    const KeyPair loaded = load_keypair(files.secret_file);
    CHECK(loaded.secret_key == pair.secret_key);
    CHECK(loaded.public_key == pair.public_key);
    CHECK(load_public_key(files.public_file) == pair.public_key);
  }

  TEST_CASE("existing key files are never overwritten") {
    TempDir dir;
    const KeyPair first = generate_keypair();
    const KeyFiles files = write_keypair(dir.path() / "head", first);
    CHECK_THROWS_AS(write_keypair(dir.path() / "head", generate_keypair()), KeyError);
    CHECK(load_keypair(files.secret_file).secret_key == first.secret_key);

    // A stray .pub alone also blocks, and leaves no orphan secret behind.
    write_text(dir.path() / "bob.pub", "stale\n");
    CHECK_THROWS_AS(write_keypair(dir.path() / "bob", generate_keypair()), KeyError);
    CHECK_FALSE(fs::exists(dir.path() / "bob.key"));
  }

  TEST_CASE("a secret key readable by group or others is refused, as ssh does") {
    TempDir dir;
    const KeyFiles files = write_keypair(dir.path() / "alice", generate_keypair());
    for (mode_t mode : {0644, 0640, 0604, 0660, 0602}) {
      CAPTURE(mode);
      REQUIRE(::chmod(files.secret_file.c_str(), mode) == 0);
      CHECK_THROWS_WITH_AS(load_keypair(files.secret_file), doctest::Contains("chmod 600"),
                           KeyError);
    }
    REQUIRE(::chmod(files.secret_file.c_str(), 0400) == 0);
    CHECK_NOTHROW(load_keypair(files.secret_file));
  }

  TEST_CASE("malformed or missing key files are clear errors") {
    TempDir dir;
    with_umask(077, [&] { write_text(dir.path() / "bad.key", "not a key\n"); });
    CHECK_THROWS_WITH_AS(load_keypair(dir.path() / "bad.key"), doctest::Contains("Z85"),
                         KeyError);
    CHECK_THROWS_AS(load_keypair(dir.path() / "missing.key"), KeyError);
    write_text(dir.path() / "bad.pub", std::string(5000, 'a'));
    CHECK_THROWS_AS(load_public_key(dir.path() / "bad.pub"), KeyError);
  }

  TEST_CASE("an allow-list loads a directory of .pub files, named by file") {
    TempDir dir;
    const KeyPair alice = generate_keypair();
    const KeyPair bob = generate_keypair();
    write_keypair(dir.path() / "providers" / "alice", alice);
    write_keypair(dir.path() / "providers" / "bob", bob);
    write_text(dir.path() / "providers" / "README", "not a key");
    const KeyPair carol = generate_keypair();
    write_keypair(dir.path() / "carol", carol);

    const AllowList list =
        AllowList::load({dir.path() / "providers", dir.path() / "carol.pub"});
    CHECK(list.size() == 3);
    REQUIRE(list.find(alice.public_key) != nullptr);
    CHECK(*list.find(alice.public_key) == "alice");
    CHECK(*list.find(carol.public_key) == "carol");
    CHECK(list.find(generate_keypair().public_key) == nullptr);

    CHECK_THROWS_AS(AllowList::load({dir.path() / "providers", dir.path() / "providers"}),
                    KeyError);  // same keys twice
    AllowList manual;
    manual.add("alice", alice.public_key);
    CHECK_THROWS_AS(manual.add("alice", bob.public_key), KeyError);  // same name twice
    CHECK_THROWS_AS(manual.add("x", "not a key"), KeyError);
  }

  TEST_CASE("keys from the environment: Z85 text or a file, and NAME=KEY allow-list entries") {
    TempDir dir;
    const KeyPair pair = generate_keypair();
    write_keypair(dir.path() / "p", pair);
    // Z85 secret text gives the same pair as the file.
    const KeyPair from_text = keypair_from(pair.secret_key, "XLOCO_KEY");
    CHECK(from_text.public_key == pair.public_key);
    CHECK(from_text.secret_key == pair.secret_key);
    CHECK(keypair_from((dir.path() / "p.key").string(), "XLOCO_KEY").public_key == pair.public_key);
    CHECK(public_key_from(pair.public_key, "XLOCO_HEAD_PUB") == pair.public_key);
    CHECK(public_key_from((dir.path() / "p.pub").string(), "XLOCO_HEAD_PUB") == pair.public_key);
    // A bad value names the setting and never echoes a secret.
    try {
      (void)keypair_from("not-a-key-and-not-a-file", "XLOCO_KEY");
      FAIL("accepted a malformed key");
    } catch (const KeyError& e) {
      CHECK(std::string(e.what()).find("XLOCO_KEY") != std::string::npos);
      CHECK(std::string(e.what()).find("not-a-key") == std::string::npos);
    }
    const KeyPair other = generate_keypair();
    const AllowList list = AllowList::parse({"zed=" + other.public_key, (dir.path() / "p.pub").string()});
    CHECK(list.size() == 2);
    REQUIRE(list.find(other.public_key) != nullptr);
    CHECK(*list.find(other.public_key) == "zed");
    CHECK(*list.find(pair.public_key) == "p");
    CHECK_THROWS_AS(AllowList::parse({"bad=xyz"}), KeyError);
  }

  TEST_CASE("xloco keygen writes a usable pair") {
    TempDir dir;
    const std::string stem = (dir.path() / "head").string();
    CLI::App app("xloco");
    cli::add_keygen_command(app);
    const char* argv[] = {"xloco", "keygen", stem.c_str()};
    app.parse(3, argv);
    CHECK(mode_of(stem + ".key") == 0600);
    const KeyPair pair = load_keypair(stem + ".key");
    CHECK(load_public_key(stem + ".pub") == pair.public_key);

    CLI::App again("xloco");
    cli::add_keygen_command(again);
    CHECK_THROWS_AS(again.parse(3, argv), KeyError);
  }
}

}  // namespace xloco::net::test
