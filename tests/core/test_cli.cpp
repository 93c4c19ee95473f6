// End-to-end: the real `xloco` binary as a user runs it (XLOCO_BIN set by ctest).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/config.h"
#include "helpers.h"

using namespace xloco;
namespace fs = std::filesystem;

namespace {

test::RunResult run(const std::string& args) { return test::run_xloco(args); }

std::string config_path() {
  return test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/kjv-tiny.json";
}

std::string small(const std::string& dir, const std::string& name) {
  return " --set run.dir=" + dir + " --set run.name=" + name +
         " --set model.d_model=32 --set model.n_layer=1 --set model.n_head=2"
         " --set model.seq_len=32 --set inner.batch_size=8 --set inner.warmup_steps=2"
         " --set inner.eval_batches=2 --set inner.log_every=2 --set inner.eval_every=4";
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("a bad config value is refused naming the field") {
    auto r = run("train --config " + config_path() + " --set inner.lr=-1");
    CHECK(r.code == 2);
    CHECK(r.out.find("inner.lr") != std::string::npos);
    r = run("train --config " + config_path() + " --set inner.typo=1");
    CHECK(r.code == 2);
    CHECK(r.out.find("unknown key \"inner.typo\"") != std::string::npos);
  }

  TEST_CASE("head --insecure binds only loopback addresses, and says so") {
    test::ScratchDir dir("insecure");
    const std::string base = "head --insecure --config " + config_path() + " --set run.dir=" + dir.str();
    for (const char* bind : {"tcp://0.0.0.0:0", "tcp://10.1.2.3:0", "tcp://[::]:0"}) {
      INFO(bind);
      const auto r = run(base + " --bind " + bind);
      CHECK(r.code == 2);
      CHECK(r.out.find("bind only a loopback address") != std::string::npos);
    }
    const auto r = run(base + " --bind tcp://0.0.0.0");  // no port: named, not guessed
    CHECK(r.code == 2);
    CHECK(r.out.find("must be HOST:PORT") != std::string::npos);
  }

  TEST_CASE("xloco config prints the resolved config: overrides applied, defaults filled in, kinds by name") {
    auto r = run("config --config " + config_path() + " --set outer.codec_up=int4");
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["outer"]["codec_up"] == "int4");
    CHECK(j["outer"]["codec_down"] == "int8");          // a default the file does not set
    CHECK(j["outer"]["deadline_multiple"] == 3.0);
    CHECK(j["model"]["kind"] == "gpt");
    CHECK(common::load_config(config_path(), {"outer.codec_up=int4"}).outer.codec_up ==
          common::CodecKind::kInt4);
    r = run("config --config " + config_path() + " --set outer.codec_up=int3");
    CHECK(r.code == 2);
    CHECK(r.out.find("outer.codec_up") != std::string::npos);
    CHECK(r.out.find("fp32, bf16, int8, int4") != std::string::npos);
  }

  TEST_CASE("xloco config --explain: each key's value, its source, and whether it does anything") {
    test::ScratchDir dir("explain");
    const std::string file = dir.str() + "/c.json";
    std::ofstream(file) << R"({"model": {"preset": "gpt2-small"}, "inner": {"steps": 600}})";
    const auto r = run("config --config " + file + " --set outer.lr=0.5 --set model.n_layer=2 --explain");
    REQUIRE(r.code == 0);
    auto line_of = [&](const std::string& key) {
      const auto at = r.out.find("\n" + key + " = ");
      if (at == std::string::npos) return std::string();
      return r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    };
    INFO(r.out);
    CHECK(line_of("outer.lr").find("0.5") != std::string::npos);
    CHECK(line_of("outer.lr").find("--set") != std::string::npos);
    CHECK(line_of("inner.steps").find("600") != std::string::npos);
    CHECK(line_of("inner.steps").find("file") != std::string::npos);
    CHECK(line_of("model.d_model").find("768") != std::string::npos);
    CHECK(line_of("model.d_model").find("preset") != std::string::npos);
    CHECK(line_of("model.n_layer").find("2") != std::string::npos);
    CHECK(line_of("model.n_layer").find("--set") != std::string::npos);
    CHECK(line_of("model.vocab_size").find("derived") != std::string::npos);  // kjv: 256 bytes
    CHECK(line_of("outer.momentum").find("default") != std::string::npos);
    CHECK(line_of("outer.relay_clip").find("inert: applies only with outer.relay_mean") != std::string::npos);
    CHECK(line_of("outer.topk").find("inert") != std::string::npos);
    CHECK(line_of("outer.lr").find("inert") == std::string::npos);
  }

  TEST_CASE("xloco advise prints the advice and its flags; --at-h every setting's prediction") {
    auto r = run("advise --params 101e6 --step-s 2.4 --link-mbit 100,100,50,10");
    CHECK(r.code == 0);
    CHECK(r.out.find("provider-3's link needs 161.6 s") != std::string::npos);
    CHECK(r.out.find("--set outer.inner_steps=100") != std::string::npos);
    r = run("advise --params 842496 --step-s 0.365 --link-mbit 5 --providers 4 --at-h 50");
    CHECK(r.code == 0);
    CHECK(r.out.find("int8/int8 ") != std::string::npos);
    CHECK(r.out.find("topk/relay, overlap") != std::string::npos);
    r = run("advise --params 101e6 --step-s 2.4 --link-mbit 1 --providers 4 --max-h 25");
    CHECK(r.code == 1);  // nothing reaches the target: the closest, and a failing exit
    CHECK(r.out.find("no setting reaches the target") != std::string::npos);
  }

  TEST_CASE("train --nproc 2, then --resume, eval and sample from the checkpoint") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("cli");
    auto r = run("train --config " + config_path() + " --nproc 2" + small(dir.str(), "two") +
                 " --set inner.steps=6 --set inner.checkpoint_every=4");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("final eval loss") != std::string::npos);
    CHECK(r.out.find("2 rank(s)") != std::string::npos);
    const auto run_dir = dir.path / "two";
    CHECK(fs::exists(run_dir / "config.json"));
    CHECK(fs::exists(run_dir / "ckpt" / "step-0000006" / "model.safetensors"));
    CHECK(fs::exists(run_dir / "metrics" / "provider-0.jsonl"));
    CHECK(!fs::exists(run_dir / (".store-" + std::to_string(0))));

    r = run("train --config " + config_path() + " --nproc 2 --resume" + small(dir.str(), "two") +
            " --set inner.steps=10");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("resumed from") != std::string::npos);
    CHECK(r.out.find("at step 6") != std::string::npos);

    const auto ckpt = (run_dir / "ckpt" / "step-0000010").string();
    r = run("eval --checkpoint " + ckpt);
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("eval loss") != std::string::npos);
    r = run("sample --checkpoint " + ckpt + " --prompt 'And God' --tokens 20");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.rfind("And God") != std::string::npos);
  }

  TEST_CASE("Ctrl+C on train --nproc 2 saves a checkpoint and leaves no rank behind") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    test::ScratchDir dir("sigint");
    const std::string log = dir.str() + "/out.log";
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setpgid(0, 0);
      const std::string cmd = "exec " + test::env_or("XLOCO_BIN", "xloco") + " train --config " +
                              config_path() + " --nproc 2" + small(dir.str(), "int") +
                              " --set inner.steps=100000 > " + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // wait until training has started (a progress line), then interrupt the launcher only
    bool started = false;
    for (int i = 0; i < 600 && !started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream in(log);
      std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      started = s.find("step 4/") != std::string::npos;
    }
    REQUIRE(started);
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    // no process of the group is left
    CHECK(kill(-pid, 0) == -1);
    std::ifstream in(log);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(s);
    CHECK(s.find("interrupted at step") != std::string::npos);
    CHECK(fs::exists(dir.path / "int" / "ckpt" / "latest"));
  }
}
