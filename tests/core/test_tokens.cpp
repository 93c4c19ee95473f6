// Bring-your-own-text (issue 16): llm.c token files, the tokens data set, `xloco prepare`, GPT
// presets and Hugging Face checkpoints in and out.
#include "doctest_torch.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "common/error.h"
#include "common/safetensors.h"
#include "helpers.h"
#include "inner/checkpoint.h"
#include "inner/data.h"
#include "inner/hf.h"
#include "inner/model.h"
#include "inner/prepare.h"
#include "inner/tokenizer.h"
#include "inner/tokens.h"
#include "inner/trainer.h"

using namespace xloco;
namespace fs = std::filesystem;

namespace {

// Deterministic English-like text from a small word list (no dependency on installed data).
std::string synthetic_text(size_t bytes, uint64_t seed) {
  static const char* kWords[] = {"the", "and", "of", "LORD", "unto", "said", "God", "land",
                                 "people", "house", "children", "king", "day", "earth", "Israel",
                                 "father", "son", "hand", "which", "shall", "ye", "thee", "thou",
                                 "café", "naïve", "über", "1611", "42,", "verily;", "\"behold\""};
  std::mt19937_64 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    const int words = 3 + static_cast<int>(rng() % 20);
    static const char* kSyllables[] = {"ka", "lo", "mi", "tha", "ne", "ru", "sh", "ei", "qu", "on"};
    for (int w = 0; w < words; ++w) {
      if (w) out += (rng() % 17 == 0) ? "  " : " ";
      if (rng() % 3 == 0) {  // a made-up word: many distinct words for the BPE to merge
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) out += kSyllables[rng() % 10];
      } else {
        out += kWords[rng() % (sizeof(kWords) / sizeof(*kWords))];
      }
    }
    out += (rng() % 9 == 0) ? ".\n\n" : (rng() % 23 == 0 ? "\t\n" : ".\n");
  }
  return out;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every token of a prepared directory, train and val blocks put back in stream order.
std::vector<uint32_t> stream_of(const std::string& dir) {
  const auto names = inner::list_token_files(dir);
  auto all = [](const std::vector<std::string>& files) {
    std::vector<uint32_t> out;
    for (const auto& f : files) {
      inner::TokenFile t(f);
      for (int64_t i = 0; i < t.size(); ++i) out.push_back(t.at(i));
    }
    return out;
  };
  const auto train = all(names.train), val = all(names.val);
  const auto meta = nlohmann::json::parse(read_bytes(fs::path(dir) / "meta.json"));
  const size_t block = meta["split_block_tokens"];
  const double f = meta["val_fraction"];
  std::vector<uint32_t> out;
  size_t ti = 0, vi = 0;
  for (int64_t j = 0; ti < train.size() || vi < val.size(); ++j) {
    auto [src, at] = inner::is_val_block(j, f) ? std::tie(val, vi) : std::tie(train, ti);
    const size_t n = std::min(block, src.size() - at);
    out.insert(out.end(), src.begin() + at, src.begin() + at + n);
    at += n;
  }
  return out;
}

void write_meta(const fs::path& dir, int64_t vocab) {
  write_text(dir / "meta.json", nlohmann::json{{"vocab_size", vocab}}.dump());
}

common::Config tokens_config(const std::string& dir) {
  auto c = test::tiny_gpt_config();
  c.data.dataset = common::DatasetKind::kTokens;
  c.data.path = dir;
  c.model.seq_len = 32;
  return c;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_SUITE("tokens") {
  TEST_CASE("llm.c token files: uint16 and uint32 round trip, header as llm.c writes it") {
    test::ScratchDir dir("tokfile");
    const std::vector<uint32_t> small = {0, 1, 65535, 7, 42};
    const std::vector<uint32_t> wide = {0, 65536, 128255, 3};
    inner::write_token_file((dir.path / "a.bin").string(), small, 65536);
    inner::write_token_file((dir.path / "b.bin").string(), wide, 128256);
    const auto bytes = read_bytes(dir.path / "a.bin");
    REQUIRE(bytes.size() == 1024 + 2 * small.size());
    int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof header);
    CHECK(header[0] == 20240520);
    CHECK(header[1] == 1);
    CHECK(header[2] == 5);
    inner::TokenFile a((dir.path / "a.bin").string()), b((dir.path / "b.bin").string());
    CHECK(a.bytes_per_token() == 2);
    CHECK(b.bytes_per_token() == 4);
    for (size_t i = 0; i < small.size(); ++i) CHECK(a.at(static_cast<int64_t>(i)) == small[i]);
    for (size_t i = 0; i < wide.size(); ++i) CHECK(b.at(static_cast<int64_t>(i)) == wide[i]);
    CHECK(b.max_token() == 128255);
    std::memcpy(header, read_bytes(dir.path / "b.bin").data(), sizeof header);
    CHECK(header[0] == 20240801);
    CHECK(header[1] == 7);
    CHECK_THROWS_AS(inner::write_token_file((dir.path / "c.bin").string(), {5, 9}, 8),
                    common::IoError);
  }

  TEST_CASE("bad token files are refused with the file and the byte offset") {
    test::ScratchDir dir("tokbad");
    inner::write_token_file((dir.path / "good.bin").string(), {1, 2, 3, 4}, 100);
    const auto good = read_bytes(dir.path / "good.bin");
    auto variant = [&](const std::string& name, const std::function<void(std::string&)>& edit) {
      std::string b = good;
      edit(b);
      write_text(dir.path / name, b);
      return (dir.path / name).string();
    };
    const auto magic = variant("magic.bin", [](std::string& b) { b[0] = 'X'; });
    const auto version = variant("version.bin", [](std::string& b) { b[4] = 9; });
    const auto truncated = variant("truncated.bin", [](std::string& b) { b.resize(b.size() - 3); });
    const auto trailing = variant("trailing.bin", [](std::string& b) { b += "zz"; });
    const auto header = variant("header.bin", [](std::string& b) { b.resize(100); });
    auto msg = error_of([&] { inner::TokenFile f(magic); });
    CHECK(msg.find("magic.bin") != std::string::npos);
    CHECK(msg.find("bad magic") != std::string::npos);
    CHECK(msg.find("byte offset 0") != std::string::npos);
    msg = error_of([&] { inner::TokenFile f(version); });
    CHECK(msg.find("version.bin: version 9 at byte offset 4") != std::string::npos);
    msg = error_of([&] { inner::TokenFile f(truncated); });
    CHECK(msg.find("truncated.bin is truncated") != std::string::npos);
    CHECK(msg.find("byte offset 1029") != std::string::npos);
    msg = error_of([&] { inner::TokenFile f(trailing); });
    CHECK(msg.find("trailing.bin: 2 bytes after") != std::string::npos);
    msg = error_of([&] { inner::TokenFile f(header); });
    CHECK(msg.find("header.bin is 100 bytes") != std::string::npos);
    msg = error_of([&] { inner::TokenFile f((dir.path / "good.bin").string()); f.check_vocab(3); });
    CHECK(msg.find("good.bin: token 3 at byte offset 1028 (token index 2)") != std::string::npos);
    CHECK_NOTHROW(inner::TokenFile((dir.path / "good.bin").string()).check_vocab(5));
  }

  TEST_CASE("tokens data set: disjoint provider blocks, shifted targets, one validation set") {
    test::ScratchDir dir("tokdata");
    // Token value = its position in train (1.5 M + position in val): a window's origin is
    // visible in its values. uint32 files (vocabulary over 65536).
    const int64_t n_train = 5 * inner::kTokenBlock + 1234, n_val = 3000, vocab = 1 << 21;
    std::vector<uint32_t> train(n_train), val(n_val);
    for (int64_t i = 0; i < n_train; ++i) train[i] = static_cast<uint32_t>(i);
    for (int64_t i = 0; i < n_val; ++i) val[i] = static_cast<uint32_t>(1500000 + i);
    inner::write_token_file((dir.path / "x_train_000001.bin").string(), train, vocab);
    inner::write_token_file((dir.path / "x_val_000000.bin").string(), val, vocab);
    write_meta(dir.path, vocab);
    auto c = tokens_config(dir.str());
    inner::resolve_vocab(c);
    CHECK(c.model.vocab_size == vocab);
    c.model.d_model = 8;  // the embedding of 2 M tokens is large enough
    std::vector<torch::Tensor> evals;
    for (const auto sharding : {common::Sharding::kIid, common::Sharding::kContiguous}) {
      c.data.sharding = sharding;
      for (int k = 0; k < 2; ++k) {
        const auto data = inner::make_dataset(c, {k, 2});
        std::set<int64_t> blocks;
        for (int64_t step = 0; step < 20; ++step) {
          const auto b = data->train_batch(step, 0, 1);
          CHECK(b.x.sizes() == torch::IntArrayRef({8, 32}));
          CHECK(torch::equal(b.x.narrow(1, 1, 31), b.y.narrow(1, 0, 31)));
          for (int64_t r = 0; r < b.x.size(0); ++r) {
            const int64_t first = b.x[r][0].item<int64_t>(), last = b.y[r][31].item<int64_t>();
            CHECK(last == first + 32);                                        // contiguous
            CHECK(first / inner::kTokenBlock == last / inner::kTokenBlock);  // inside one block
            blocks.insert(first / inner::kTokenBlock);
          }
        }
        // Six blocks (the 1234-token tail is one too): iid deals 0,2,4 / 1,3,5, contiguous
        // 0,1,2 / 3,4,5.
        for (int64_t blk : blocks) {
          CHECK((sharding == common::Sharding::kIid ? blk % 2 == k : blk / 3 == k));
        }
        CHECK(blocks.size() >= 2);
        evals.push_back(torch::cat({data->eval_batches(0, 1)[0].x, data->eval_batches(0, 1)[1].x}));
        CHECK(torch::equal(data->train_batch(3, 0, 1).x, data->train_batch(3, 0, 1).x));
        // Two ranks split one provider batch exactly.
        CHECK(torch::equal(torch::cat({data->train_batch(5, 0, 2).x, data->train_batch(5, 1, 2).x}),
                           data->train_batch(5, 0, 1).x));
      }
    }
    for (const auto& e : evals) CHECK(torch::equal(e, evals.front()));  // one validation set
    CHECK(evals.front().min().item<int64_t>() >= 1500000);  // drawn from val only
    CHECK(evals.front().size(0) == 16);
  }

  TEST_CASE("tokens data set: a missing path, missing splits and vocabulary mismatches are named") {
    test::ScratchDir dir("tokmiss");
    auto c = tokens_config((dir.path / "nowhere").string());
    auto msg = error_of([&] { inner::resolve_vocab(c); });
    CHECK(msg.find("nowhere does not exist") != std::string::npos);
    c = tokens_config(dir.str());
    write_meta(dir.path, 100);
    inner::resolve_vocab(c);
    msg = error_of([&] { inner::make_dataset(c, {0, 1}); });
    CHECK(msg.find("has no train token files") != std::string::npos);
    CHECK(msg.find(dir.str()) != std::string::npos);
    inner::write_token_file((dir.path / "train_000000.bin").string(), std::vector<uint32_t>(5000, 7), 100);
    msg = error_of([&] { inner::make_dataset(c, {0, 1}); });
    CHECK(msg.find("has no validation token files") != std::string::npos);
    inner::write_token_file((dir.path / "val_000000.bin").string(), std::vector<uint32_t>(500, 99), 100);
    CHECK_NOTHROW(inner::make_dataset(c, {0, 1}));
    // model.vocab_size below the data's: refused before any model is built.
    c.model.vocab_size = 50;
    msg = error_of([&] { inner::resolve_vocab(c); });
    CHECK(msg.find("model.vocab_size = 50 is smaller than the data's vocabulary of 100") != std::string::npos);
    CHECK(msg.find("meta.json") != std::string::npos);
    // meta.json says 100 but a token is 150: the file and offset are named.
    c.model.vocab_size = 0;
    write_meta(dir.path, 100);
    inner::write_token_file((dir.path / "val_000000.bin").string(), {1, 2, 150, 3}, 200);
    inner::resolve_vocab(c);
    msg = error_of([&] { inner::make_dataset(c, {0, 1}); });
    CHECK(msg.find("val_000000.bin: token 150 at byte offset 1028") != std::string::npos);
    // llm.c shards without meta.json or tokenizer: the user must say the vocabulary.
    fs::remove(dir.path / "meta.json");
    c.model.vocab_size = 0;
    msg = error_of([&] { inner::resolve_vocab(c); });
    CHECK(msg.find("set model.vocab_size") != std::string::npos);
  }

  TEST_CASE("xloco prepare: deterministic, byte-exact round trip, tokenizer/vocab mismatch refused") {
    test::ScratchDir dir("prepare");
    fs::create_directories(dir.path / "in" / "sub");
    // b holds bytes that are not UTF-8 (a cp1252 apostrophe, a lone continuation byte, 0xff):
    // they must round-trip too, through the byte pieces.
    const std::string a = synthetic_text(300000, 1),
                      b = synthetic_text(60000, 2) + "the stock market\x92s drop \x80\xff caf\xe9\n" +
                          synthetic_text(60000, 4);
    write_text(dir.path / "in" / "a.txt", a);
    write_text(dir.path / "in" / "sub" / "b.txt", b);
    inner::PrepareOptions o;
    o.inputs = {(dir.path / "in").string()};
    o.out = (dir.path / "d1").string();
    o.vocab_size = 600;
    o.val_fraction = 0.1;
    o.shard_tokens = 40000;  // several train files
    const auto r = inner::prepare_tokens(o);
    CHECK(r.vocab_size == 600);
    CHECK(r.input_bytes == static_cast<int64_t>(a.size() + b.size()));
    CHECK(r.val_tokens > 0);
    CHECK(inner::list_token_files(o.out).train.size() >= 2);
    // The whole stream decodes to the input, files in path order (eos between them decodes to
    // nothing).
    const auto tok = inner::load_sentencepiece(o.out + "/tokenizer.model");
    const auto stream = stream_of(o.out);
    CHECK(static_cast<int64_t>(stream.size()) == r.train_tokens + r.val_tokens);
    CHECK(tok->decode(stream) == a + b);
    CHECK(std::count(stream.begin(), stream.end(), static_cast<uint32_t>(tok->eos_id())) == 2);
    const auto meta = nlohmann::json::parse(read_bytes(fs::path(o.out) / "meta.json"));
    CHECK(meta["vocab_size"] == 600);
    CHECK(meta["sources"].size() == 2);
    CHECK(meta["train"]["bytes"].get<int64_t>() + meta["val"]["bytes"].get<int64_t>() ==
          static_cast<int64_t>(a.size() + b.size()));
    // Deterministic: the same input (and another thread count) gives byte-identical files.
    o.out = (dir.path / "d2").string();
    o.threads = 1;
    inner::prepare_tokens(o);
    for (const auto& f : fs::directory_iterator(dir.path / "d1")) {
      CHECK_MESSAGE(read_bytes(f.path()) == read_bytes(dir.path / "d2" / f.path().filename()),
                    f.path().filename().string());
    }
    // A given tokenizer gives the same tokens; a --vocab-size that contradicts it is refused.
    o.out = (dir.path / "d3").string();
    o.tokenizer = (dir.path / "d1" / "tokenizer.model").string();
    o.vocab_size = 0;
    inner::prepare_tokens(o);
    CHECK(stream_of(o.out) == stream);
    o.out = (dir.path / "d4").string();
    o.vocab_size = 512;
    auto msg = error_of([&] { inner::prepare_tokens(o); });
    CHECK(msg.find("--vocab-size 512 does not match the tokenizer") != std::string::npos);
    CHECK(msg.find("tokenizer.model (600 pieces)") != std::string::npos);
    CHECK(!fs::exists(o.out));
    // An existing output is not overwritten without --overwrite; a missing input is named.
    o.vocab_size = 0;
    o.out = (dir.path / "d1").string();
    CHECK(error_of([&] { inner::prepare_tokens(o); }).find("already exists") != std::string::npos);
    o.inputs = {(dir.path / "missing.txt").string()};
    CHECK(error_of([&] { inner::prepare_tokens(o); }).find("missing.txt does not exist") !=
          std::string::npos);
    // A tokenizer.model that does not belong to the token files: meta.json disagrees.
    fs::copy_file(dir.path / "d1" / "tokenizer.model", dir.path / "other.model");
    inner::PrepareOptions o2;
    o2.inputs = {(dir.path / "in" / "sub").string()};
    o2.out = (dir.path / "d5").string();
    o2.vocab_size = 400;
    inner::prepare_tokens(o2);
    fs::copy_file(dir.path / "other.model", dir.path / "d5" / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    auto c = tokens_config(o2.out);
    msg = error_of([&] { inner::resolve_vocab(c); });
    CHECK(msg.find("meta.json says vocab_size 400") != std::string::npos);
    CHECK(msg.find("tokenizer.model has 600 pieces") != std::string::npos);
  }

  TEST_CASE("the tokens run end to end: train on prepared shards, the eval in nats per byte") {
    test::ScratchDir dir("tokrun");
    write_text(dir.path / "a.txt", synthetic_text(200000, 3));
    inner::PrepareOptions o;
    o.inputs = {(dir.path / "a.txt").string()};
    o.out = (dir.path / "data").string();
    o.vocab_size = 400;
    inner::prepare_tokens(o);
    auto c = tokens_config(o.out);
    inner::resolve_vocab(c);
    auto model = inner::make_model(c);
    CHECK(model->named_parameters()["transformer.wte.weight"].size(0) == 400);
    auto data = inner::make_dataset(c, {0, 1});
    inner::Group solo(inner::DistOptions{});
    inner::InnerTrainer trainer(c, model, solo, torch::kCPU);
    const double before = trainer.evaluate(*data).loss;
    for (int64_t s = 0; s < 30; ++s) trainer.train_step(*data, s);
    const double after = trainer.evaluate(*data).loss;
    CHECK(after < before - 0.5);
    const auto tok = inner::tokenizer_for(c.data);
    REQUIRE(tok != nullptr);
    const auto sample = tok->decode(inner::generate(*model, tok->encode("the LORD"), 20, 0.5, 10, 1));
    CHECK(!sample.empty());
  }

  TEST_CASE("presets: gpt2-small is GPT-2's 124.4 M parameters, and fields next to a preset win") {
    nlohmann::json j = {{"model", {{"preset", "gpt2-small"}, {"vocab_size", 50257}}},
                        {"run", {{"threads", 1}}}};
    auto c = common::parse_config(j);
    CHECK(c.model.d_model == 768);
    CHECK(c.model.n_layer == 12);
    CHECK(c.model.n_head == 12);
    CHECK(c.model.seq_len == 1024);
    auto model = inner::make_model(c);
    CHECK(inner::count_parameters(*model) == 124439808);  // GPT-2 small, tied head
    // One forward and backward on a short window: it builds and trains.
    auto x = torch::randint(0, 50257, {1, 16}, torch::kInt64);
    auto loss = model->loss(x, x);
    loss.backward();
    CHECK(std::isfinite(loss.item<double>()));
    CHECK(model->named_parameters()["transformer.h.11.mlp.c_fc.weight"].grad().defined());
    j["model"]["n_layer"] = 2;
    j["model"]["preset"] = "gpt2-medium";
    c = common::parse_config(j);
    CHECK(c.model.d_model == 1024);
    CHECK(c.model.n_layer == 2);  // the explicit field wins
    CHECK(common::parse_config(common::to_json(c)).model.n_layer == 2);  // and survives a dump
    // Hashes: a preset hashes as its fields; a byte-level run as before model.vocab_size.
    common::Config spelled = c, kjv0, kjv256;
    spelled.model.preset = "";
    CHECK(common::config_hash(spelled) == common::config_hash(c));
    kjv256.model.vocab_size = 256;
    CHECK(common::config_hash(kjv0) == common::config_hash(kjv256));
    kjv256.model.vocab_size = 512;
    CHECK(common::config_hash(kjv0) != common::config_hash(kjv256));
    j["model"]["preset"] = "gpt3";
    CHECK(error_of([&] { common::parse_config(j); }).find("model.preset") != std::string::npos);
  }

  TEST_CASE("Hugging Face export and --init: transposed Conv1D weights, both directions agree") {
    test::ScratchDir dir("hf");
    auto c = test::tiny_gpt_config();
    c.model.vocab_size = 256;
    auto model = inner::make_model(c);
    inner::Group solo(inner::DistOptions{});
    inner::InnerTrainer trainer(c, model, solo, torch::kCPU);
    const auto ckpt = inner::save_train_checkpoint((dir.path / "ckpt").string(), trainer, c, 7);
    inner::HfExportOptions o;
    o.checkpoint = ckpt;
    o.out = (dir.path / "hf").string();
    inner::export_hf(o);
    const auto file = common::read_safetensors(o.out + "/model.safetensors");
    CHECK(file.metadata.at("format") == "pt");
    const auto* attn = file.find("transformer.h.0.attn.c_attn.weight");
    REQUIRE(attn != nullptr);
    CHECK((attn->shape == std::vector<int64_t>{64, 192}));  // [in, out]: Conv1D layout
    CHECK(file.find("lm_head.weight") == nullptr);        // tied
    const auto config = nlohmann::json::parse(read_bytes(fs::path(o.out) / "config.json"));
    CHECK(config["model_type"] == "gpt2");
    CHECK(config["n_embd"] == 64);
    CHECK(config["activation_function"] == "gelu");
    // --init reads the export back to the same parameters, and so it does a nanoGPT-named file
    // and a hub-style file without the "transformer." prefix.
    auto same = [&](const common::SafetensorsFile& f) {
      auto other = inner::make_model([&] { auto d = c; d.run.seed = 99; return d; }());
      inner::InnerTrainer t2(c, other, solo, torch::kCPU);
      t2.load_model(f);
      return t2.param_hash() == trainer.param_hash();
    };
    CHECK(same(inner::load_init_weights(o.out)));
    CHECK(same(inner::load_init_weights(ckpt)));
    CHECK(same(inner::load_init_weights(ckpt + "/model.safetensors")));
    auto hub = file.tensors;
    for (auto& t : hub) t.name = t.name.substr(std::string("transformer.").size());
    fs::create_directories(dir.path / "hub");
    common::write_safetensors((dir.path / "hub" / "model.safetensors").string(), hub);
    fs::copy_file(fs::path(o.out) / "config.json", dir.path / "hub" / "config.json");
    CHECK(same(inner::load_init_weights((dir.path / "hub").string())));
    CHECK(error_of([&] { inner::load_init_weights((dir.path / "none").string()); })
              .find("none does not exist") != std::string::npos);
    CHECK(error_of([&] { inner::export_hf(o); }).find("already exists") != std::string::npos);
  }
}
