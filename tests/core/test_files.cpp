#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

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
      MESSAGE("skipped the Python half: /usr/bin/python3 missing");
      return;
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
}
