#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <unistd.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "helpers.h"

using namespace xloco;
namespace fs = std::filesystem;

namespace {

common::TensorBlob f32(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
  common::TensorBlob b{name, "F32", std::move(shape), {}};
  b.data.resize(v.size() * 4);
  std::memcpy(b.data.data(), v.data(), b.data.size());
  return b;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  CHECK(pclose(p) == 0);
  return out;
}

}  // namespace

TEST_SUITE("files") {
  TEST_CASE("safetensors written by xloco round-trip and load in Python") {
    test::ScratchDir dir("st");
    const auto path = dir.str() + "/m.safetensors";
    common::write_safetensors(path, {f32("transformer.wte.weight", {2, 3}, {1, 2, 3, 4, 5, 6.5f}),
                                     f32("b", {3}, {-1, 0, 1})},
                              {{"format", "pt"}});
    auto back = common::read_safetensors(path);
    REQUIRE(back.tensors.size() == 2);
    CHECK(back.find("b")->shape == std::vector<int64_t>{3});
    CHECK(back.metadata.at("format") == "pt");

    const std::string src = test::env_or("XLOCO_SOURCE_DIR", ".");
    if (!fs::exists("/usr/bin/python3")) {
      XLOCO_SKIP_CASE("the Python half: /usr/bin/python3 missing");
    }
    const auto j = nlohmann::json::parse(
        run_capture("/usr/bin/python3 " + src + "/tests/read_safetensors.py " + path));
    const auto& w = j["tensors"]["transformer.wte.weight"];
    CHECK(w["dtype"] == "F32");
    CHECK(w["shape"] == nlohmann::json::array({2, 3}));
    CHECK(w["sum"].get<double>() == doctest::Approx(21.5));
    CHECK(j["tensors"]["b"]["first"][0].get<double>() == -1.0);
    CHECK(j["metadata"]["format"] == "pt");
  }

  TEST_CASE("hostile safetensors files give a clear error naming the file") {
    test::ScratchDir dir("st-bad");
    const auto path = dir.str() + "/bad.safetensors";
    common::write_safetensors(path, {f32("a", {4}, {1, 2, 3, 4})});
    const auto size = fs::file_size(path);
    fs::resize_file(path, size - 3);  // truncated data
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("outside the"),
                         common::IoError);
    std::ofstream(path, std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("header length"),
                         common::IoError);
    std::ofstream(path, std::ios::binary) << "abc";
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("truncated"),
                         common::IoError);
  }

  TEST_CASE("safetensors whose data_offsets overlap, leave gaps or hold unprintable names are refused, as the reference implementation does") {
    test::ScratchDir dir("st-offsets");
    const auto path = dir.str() + "/bad.safetensors";
    // Writes a header of `entries` over `data_bytes` zero bytes.
    const auto write_raw = [&](const nlohmann::json& entries, size_t data_bytes) {
      const std::string h = entries.dump();
      std::string out(8, '\0');
      for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
      out += h + std::string(data_bytes, '\0');
      std::ofstream(path, std::ios::binary) << out;
    };
    const auto f32x = [](uint64_t n, uint64_t begin) {
      return nlohmann::json{{"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {begin, begin + 4 * n}}};
    };
    write_raw({{"a", f32x(4, 0)}, {"b", f32x(4, 16)}}, 32);
    CHECK(common::read_safetensors(path).tensors.size() == 2);  // contiguous: read
    // 1000 entries over the same 4 KiB: each would be read (and allocated) on its own.
    nlohmann::json many;
    for (int i = 0; i < 1000; ++i) many[fmt::format("t{}", i)] = f32x(1024, 0);
    write_raw(many, 4096);
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("overlap the tensor before"),
                         common::IoError);
    write_raw({{"a", f32x(4, 0)}, {"b", f32x(4, 20)}}, 36);
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("leave a gap after byte 16"),
                         common::IoError);
    write_raw({{"a", f32x(4, 0)}}, 20);  // trailing bytes no tensor owns
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("the tensors end at data byte 16"),
                         common::IoError);
    write_raw({{"a\u001b[2J", f32x(4, 0)}}, 16);
    CHECK_THROWS_WITH_AS(common::read_safetensors(path), doctest::Contains("a\\x1b[2J is not printable"),
                         common::IoError);
  }

  TEST_CASE("checkpoint manifests of any content give a reason, never an exception") {
    test::ScratchDir dir("ckpt-manifest-types");
    common::CheckpointContents c;
    c.files["model.safetensors"] = {f32("a", {3}, {1, 2, 3})};
    c.state = {{"round", 1}};
    const auto ck = common::write_checkpoint(dir.str(), "round-000001", c, 3);
    const auto manifest = fs::path(ck) / common::kManifestFile;
    const auto good = nlohmann::json::parse(std::ifstream(manifest));
    for (const auto& bytes : {nlohmann::json("12"), nlohmann::json(nullptr), nlohmann::json(-1),
                              nlohmann::json::array()}) {
      CAPTURE(bytes.dump());
      auto bad = good;
      bad["model.safetensors"]["bytes"] = bytes;
      std::ofstream(manifest) << bad.dump();
      std::optional<std::string> problem;
      CHECK_NOTHROW(problem = common::verify_checkpoint(ck));
      REQUIRE(problem);
      CHECK(problem->find("no byte count and hash") != std::string::npos);
    }
    auto bad = good;
    bad["model.safetensors"]["blake2b"] = 7;
    std::ofstream(manifest) << bad.dump();
    CHECK(common::verify_checkpoint(ck)->find("no byte count and hash") != std::string::npos);
    std::ofstream(manifest) << good.dump();
    CHECK(!common::verify_checkpoint(ck));
  }

  TEST_CASE("checkpoint directories: latest names the newest; a half-written one is ignored") {
    test::ScratchDir dir("ckpt");
    common::CheckpointContents c;
    c.files["model.safetensors"] = {f32("a", {1}, {1})};
    c.state = {{"step", 1}};
    common::write_checkpoint(dir.str(), "step-0000001", c, 2);
    c.state["step"] = 2;
    common::write_checkpoint(dir.str(), "step-0000002", c, 2);
    c.state["step"] = 3;
    const auto third = common::write_checkpoint(dir.str(), "step-0000003", c, 2);
    CHECK(common::latest_checkpoint(dir.str()) == third);
    CHECK(!fs::exists(dir.path / "step-0000001"));  // keep = 2
    // a crash mid-write: the temp dir exists, `latest` still names the complete one
    fs::create_directories(dir.path / ".tmp-step-0000004-1");
    CHECK(common::latest_checkpoint(dir.str()) == third);
    // `latest` pointing at a directory without state.json falls back to the newest complete one
    fs::create_directories(dir.path / "step-0000004");
    std::ofstream(dir.path / "latest") << "step-0000004\n";
    CHECK(common::latest_checkpoint(dir.str()) == third);
  }

  TEST_CASE("checkpoint manifests: a missing or corrupted file is found, and readers fall back to the previous checkpoint saying why") {
    test::ScratchDir dir("ckpt-verify");
    common::CheckpointContents c;
    c.files["model.safetensors"] = {f32("a", {3}, {1, 2, 3})};
    c.state = {{"round", 1}};
    const auto first = common::write_checkpoint(dir.str(), "round-000001", c, 3);
    c.state["round"] = 2;
    const auto second = common::write_checkpoint(dir.str(), "round-000002", c, 3);
    CHECK(!common::verify_checkpoint(second));
    CHECK(fs::exists(fs::path(second) / common::kManifestFile));
    // corrupted: one byte of the model flipped, same size
    {
      std::fstream f(fs::path(second) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-1, std::ios::end);
      f.put('\x7f');
    }
    const auto problem = common::verify_checkpoint(second);
    REQUIRE(problem);
    CHECK(problem->find("model.safetensors does not match its hash") != std::string::npos);
    std::vector<std::string> skipped;
    CHECK(common::latest_checkpoint(dir.str(), &skipped) == first);
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("round-000002") != std::string::npos);
    // missing: state.json stays, model.safetensors is gone (a crash between the two, by hand)
    fs::remove(fs::path(first) / "model.safetensors");
    CHECK(common::verify_checkpoint(first)->find("model.safetensors is missing") != std::string::npos);
    CHECK(!common::latest_checkpoint(dir.str()));
  }

  TEST_CASE("re-writing a checkpoint of the same round never removes the good copy first; a failed write leaves no temp directory and the old checkpoint") {
    test::ScratchDir dir("ckpt-rewrite");
    common::CheckpointContents c;
    c.files["model.safetensors"] = {f32("a", {1}, {1})};
    c.state = {{"round", 5}};
    const auto path = common::write_checkpoint(dir.str(), "round-000005", c, 3);
    c.files["model.safetensors"] = {f32("a", {1}, {2})};
    CHECK(common::write_checkpoint(dir.str(), "round-000005", c, 3) == path);
    CHECK(!common::verify_checkpoint(path));
    CHECK(common::read_safetensors(path + "/model.safetensors").find("a")->data[3] == 0x40);  // 2.0f
    // An unwritable root (a file in the way of the temp directory's parent): refused, nothing left.
    c.state["round"] = 6;
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    const bool root_user = ::geteuid() == 0;  // root writes anyway: the case needs a real user
    if (!root_user) {
      CHECK_THROWS_AS(common::write_checkpoint(dir.str(), "round-000006", c, 3), common::IoError);
      CHECK(common::latest_checkpoint(dir.str()) == path);
    }
    fs::permissions(dir.path, fs::perms::owner_all);
    // What an interrupted write leaves is removed at the next start, and only that.
    fs::create_directories(dir.path / ".tmp-round-000007-4242");
    fs::create_directories(dir.path / ".old-round-000005-4242");
    std::ofstream(dir.path / "latest.tmp") << "x";
    const auto removed = common::remove_stale_temp(dir.str());
    CHECK(removed.size() == 3);
    CHECK(!fs::exists(dir.path / ".tmp-round-000007-4242"));
    CHECK(fs::exists(path));
    CHECK(common::latest_checkpoint(dir.str()) == path);
  }
}
