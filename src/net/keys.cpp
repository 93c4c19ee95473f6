#include "net/keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <utility>
#include <cerrno>
#include <cstring>

#include <zmq.h>

#include "net/errors.h"

namespace xloco::net {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
constexpr std::size_t kMaxKeyFileBytes = 1024;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string trim(std::string text) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  text.erase(text.begin(), std::find_if(text.begin(), text.end(), not_space));
  text.erase(std::find_if(text.rbegin(), text.rend(), not_space).base(), text.end());
  return text;
}

std::string read_small_file(int fd, const fs::path& path) {
  std::string text(kMaxKeyFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    XLOCO_ENFORCE(n >= 0, KeyError, "cannot read key file {}: {}", path.string(),
                  std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  XLOCO_ENFORCE(got <= kMaxKeyFileBytes, KeyError,
                "{} is larger than a key file can be ({} bytes at most)", path.string(),
                kMaxKeyFileBytes);
  text.resize(got);
  return trim(std::move(text));
}

std::string checked_key(std::string key, const fs::path& path) {
  XLOCO_ENFORCE(is_z85_key(key), KeyError,
                "{} does not hold a CURVE key (one line of {} Z85 characters)", path.string(),
                kZ85KeyLength);
  return key;
}

void write_new_file(const fs::path& path, const std::string& text, mode_t mode) {
  // O_EXCL: never follow a planted symlink, never replace a key; the mode is set at creation
  // so the secret never exists with wider rights, even for an instant.
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  XLOCO_ENFORCE(fd.get() >= 0, KeyError, "cannot create {}: {}", path.string(),
                std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    XLOCO_ENFORCE(n > 0, KeyError, "cannot write {}: {}", path.string(), std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  XLOCO_ENFORCE(::fsync(fd.get()) == 0, KeyError, "cannot sync {}: {}", path.string(),
                std::strerror(errno));
  XLOCO_ENFORCE(::close(fd.release()) == 0, KeyError, "cannot close {}: {}", path.string(),
                std::strerror(errno));
}

fs::path with_suffix(const fs::path& stem, const char* suffix) {
  fs::path path = stem;
  path += suffix;  // not replace_extension: "alice.v2" must become "alice.v2.key"
  return path;
}

}  // namespace

bool is_z85_key(std::string_view text) {
  if (text.size() != kZ85KeyLength) return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return kZ85Alphabet.find(c) != std::string_view::npos; });
}

KeyPair generate_keypair() {
  char public_key[kZ85KeyLength + 1];
  char secret_key[kZ85KeyLength + 1];
  XLOCO_ENFORCE(zmq_curve_keypair(public_key, secret_key) == 0, KeyError,
                "cannot generate a CURVE key pair: {} (is libzmq built with CURVE?)",
                zmq_strerror(zmq_errno()));
  KeyPair pair{public_key, secret_key};
  std::fill(std::begin(secret_key), std::end(secret_key), '\0');
  return pair;
}

std::string public_key_of(std::string_view secret_key) {
  XLOCO_ENFORCE(is_z85_key(secret_key), KeyError, "a secret key is {} Z85 characters",
                kZ85KeyLength);
  const std::string secret(secret_key);
  char public_key[kZ85KeyLength + 1];
  XLOCO_ENFORCE(zmq_curve_public(public_key, secret.c_str()) == 0, KeyError,
                "cannot derive a public key: {}", zmq_strerror(zmq_errno()));
  return public_key;
}

KeyFiles write_keypair(const fs::path& stem, const KeyPair& pair) {
  XLOCO_ENFORCE(is_z85_key(pair.public_key) && is_z85_key(pair.secret_key), KeyError,
                "refusing to write a malformed key pair");
  KeyFiles files{with_suffix(stem, ".key"), with_suffix(stem, ".pub")};
  if (stem.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(stem.parent_path(), ec);
    XLOCO_ENFORCE(!ec, KeyError, "cannot create {}: {}", stem.parent_path().string(), ec.message());
  }
  write_new_file(files.secret_file, pair.secret_key + "\n", 0600);
  try {
    write_new_file(files.public_file, pair.public_key + "\n", 0644);
  } catch (...) {
    ::unlink(files.secret_file.c_str());  // a lone secret is of no use, and confusing
    throw;
  }
  return files;
}

KeyPair load_keypair(const fs::path& secret_file) {
  Fd fd(::open(secret_file.c_str(), O_RDONLY | O_CLOEXEC));
  XLOCO_ENFORCE(fd.get() >= 0, KeyError, "cannot open secret key {}: {}", secret_file.string(),
                std::strerror(errno));
  struct stat st {};
  XLOCO_ENFORCE(::fstat(fd.get(), &st) == 0, KeyError, "cannot stat {}: {}",
                secret_file.string(), std::strerror(errno));
  XLOCO_ENFORCE(S_ISREG(st.st_mode), KeyError, "secret key {} is not a regular file",
                secret_file.string());
  // fstat on the opened file, not stat on the name: the file checked is the file read.
  XLOCO_ENFORCE(st.st_uid == ::geteuid() || st.st_uid == 0, KeyError,
                "secret key {} belongs to uid {}, not to this user (uid {}) or root: another user "
                "could replace it; refusing to use it. Fix with: chown $(id -u) {}",
                secret_file.string(), st.st_uid, ::geteuid(), secret_file.string());
  XLOCO_ENFORCE((st.st_mode & 077) == 0, KeyError,
                "secret key {} has mode {:04o}, so group or others can read or change it; "
                "refusing to use it. Fix with: chmod 600 {}",
                secret_file.string(), st.st_mode & 07777, secret_file.string());
  KeyPair pair;
  pair.secret_key = checked_key(read_small_file(fd.get(), secret_file), secret_file);
  pair.public_key = public_key_of(pair.secret_key);
  return pair;
}

std::string load_public_key(const fs::path& public_file) {
  Fd fd(::open(public_file.c_str(), O_RDONLY | O_CLOEXEC));
  XLOCO_ENFORCE(fd.get() >= 0, KeyError, "cannot open public key {}: {}", public_file.string(),
                std::strerror(errno));
  return checked_key(read_small_file(fd.get(), public_file), public_file);
}

KeyPair keypair_from(const std::string& file_or_z85, const std::string& what) {
  std::error_code ec;
  if (fs::exists(file_or_z85, ec)) return load_keypair(file_or_z85);
  XLOCO_ENFORCE(is_z85_key(file_or_z85), KeyError,
                "{}: neither a secret key file nor a 40-character Z85 secret key ({} characters)",
                what, file_or_z85.size());
  return KeyPair{public_key_of(file_or_z85), file_or_z85};
}

std::string public_key_from(const std::string& file_or_z85, const std::string& what) {
  std::error_code ec;
  if (fs::exists(file_or_z85, ec)) return load_public_key(file_or_z85);
  XLOCO_ENFORCE(is_z85_key(file_or_z85), KeyError,
                "{} \"{}\": neither a public key file nor a 40-character Z85 key", what,
                file_or_z85);
  return file_or_z85;
}

AllowList AllowList::parse(const std::vector<std::string>& entries) {
  AllowList list;
  std::vector<fs::path> paths;
  for (const std::string& e : entries) {
    const auto eq = e.find('=');
    std::error_code ec;
    if (eq != std::string::npos && !fs::exists(e, ec)) {
      list.add(e.substr(0, eq), e.substr(eq + 1));
    } else {
      paths.push_back(e);
    }
  }
  for (const auto& [key, name] : load(paths).names_) list.add(name, key);
  return list;
}

AllowList AllowList::load(const std::vector<fs::path>& paths) {
  AllowList list;
  for (const fs::path& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.path().extension() == ".pub") files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // deterministic order for the duplicate error
      for (const fs::path& file : files) list.add(file.stem().string(), load_public_key(file));
    } else {
      list.add(path.stem().string(), load_public_key(path));
    }
  }
  return list;
}

void AllowList::add(const std::string& name, const std::string& public_key) {
  XLOCO_ENFORCE(is_z85_key(public_key), KeyError, "allow-list entry \"{}\" is not a Z85 key",
                name);
  XLOCO_ENFORCE(!name.empty(), KeyError, "allow-list entry for {} has an empty name",
                public_key);
  for (const auto& [key, listed] : names_) {
    XLOCO_ENFORCE(listed != name, KeyError,
                  "two allow-listed keys are both named \"{}\"; names identify providers", name);
  }
  XLOCO_ENFORCE(names_.emplace(public_key, name).second, KeyError,
                "key {} is listed twice (as \"{}\" and \"{}\")", public_key, names_[public_key],
                name);
}

const std::string* AllowList::find(const std::string& public_key) const {
  const auto it = names_.find(public_key);
  return it == names_.end() ? nullptr : &it->second;
}

}  // namespace xloco::net
