#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "common/config.h"
#include "common/error.h"
#include "helpers.h"

using nlohmann::json;
using xloco::common::ConfigError;
using xloco::common::parse_config;

namespace {
// parse_config's refusal, or "" where it accepts the document.
std::string config_refusal(const json& j) {
  try {
    parse_config(j);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
  return std::string();
}
}  // namespace

TEST_SUITE("config") {
  TEST_CASE("defaults parse and round-trip through JSON") {
    auto c = parse_config(json::object());
    CHECK(c.inner.beta2 == doctest::Approx(0.95));
    auto again = parse_config(xloco::common::to_json(c));
    CHECK(again.model.d_model == c.model.d_model);
    CHECK(again.run.seed == c.run.seed);
  }

  TEST_CASE("torchscript: model.path required, any data set, the module's bytes in the hash") {
    CHECK(config_refusal(json{{"model", {{"kind", "torchscript"}}}}).find("needs model.path") != std::string::npos);
    CHECK(config_refusal(json{{"model", {{"kind", "gpt"}, {"path", "m.pt"}}}}).find("model.path is for") != std::string::npos);
    auto a = parse_config(json{{"model", {{"kind", "torchscript"}, {"path", "/a/m.pt"}}}});
    CHECK(config_refusal(json{{"model", {{"kind", "torchscript"}, {"path", "m.pt"}}},
                     {"data", {{"dataset", "fmnist"}}}}).empty());
    auto b = a;
    b.model.path = "/elsewhere/m.pt";  // the same module in another place: the same run
    a.model.file_hash = b.model.file_hash = "0123";
    CHECK(xloco::common::config_hash(a) == xloco::common::config_hash(b));
    b.model.file_hash = "4567";  // another module: another run
    CHECK(xloco::common::config_hash(a) != xloco::common::config_hash(b));
  }

  TEST_CASE("unknown key is rejected by name with the known keys listed") {
    try {
      parse_config(json{{"inner", {{"lrr", 1e-3}}}});
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("inner.lrr") != std::string::npos);
      CHECK(msg.find("inner.lr,") != std::string::npos);
    }
    CHECK_THROWS_AS(parse_config(json{{"bogus", 1}}), ConfigError);
  }

  TEST_CASE("out-of-range value names the field and the allowed range") {
    try {
      parse_config(json{{"inner", {{"lr", -1}}}});
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("inner.lr") != std::string::npos);
      CHECK(msg.find("[0, 10]") != std::string::npos);
    }
  }

  TEST_CASE("wrong type, bad choice, non-integer and cross-field errors") {
    CHECK_THROWS_WITH_AS(parse_config(json{{"inner", {{"steps", "many"}}}}),
                         doctest::Contains("inner.steps must be a number"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_config(json{{"data", {{"sharding", "random"}}}}),
                         doctest::Contains("data.sharding"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_config(json{{"inner", {{"steps", 10.5}}}}),
                         doctest::Contains("inner.steps must be an integer"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_config(json{{"model", {{"d_model", 100}, {"n_head", 3}}}}),
                         doctest::Contains("model.n_head"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_config(json{{"data", {{"dataset", "fmnist"}}}}),
                         doctest::Contains("model.kind = cnn"), ConfigError);
    // relay is the downlink's strategy (outer.downlink), not a codec: an old config naming it as
    // one is refused with the new key named; and outer SGD only.
    // A checkpoint written before outer.downlink (its state.json's config) still reads, as relay.
    const auto stored = xloco::common::parse_stored_config(
        json{{"outer", {{"codec_down", "relay"}, {"momentum", 0}}}});
    CHECK(stored.outer.downlink == xloco::common::Downlink::kRelay);
    CHECK(xloco::common::config_hash(stored) ==
          xloco::common::config_hash(parse_config(json{{"outer", {{"downlink", "relay"}, {"momentum", 0}}}})));
    for (const char* key : {"codec_up", "codec_down"}) {
      CAPTURE(key);
      CHECK_THROWS_WITH_AS(parse_config(json{{"outer", {{key, "relay"}, {"momentum", 0}}}}),
                           doctest::Contains("set outer.downlink = \"relay\" instead"), ConfigError);
    }
    CHECK_THROWS_WITH_AS(parse_config(json{{"outer", {{"downlink", "relay"}, {"momentum", 0.9}}}}),
                         doctest::Contains("outer.momentum must be 0"), ConfigError);
    CHECK(parse_config(json{{"outer", {{"downlink", "relay"}, {"momentum", 0}}}}).outer.downlink ==
          xloco::common::Downlink::kRelay);
    // outer.relay_mean: "all" (the default), "present" or "clipped", the last two on a relayed downlink only;
    // hashed only away from its default (runs from before it hash as before).
    const json relay{{"outer", {{"downlink", "relay"}, {"momentum", 0}}}};
    json present = relay;
    present["outer"]["relay_mean"] = "present";
    CHECK(parse_config(present).outer.relay_mean == xloco::common::RelayMean::kPresent);
    CHECK(parse_config(relay).outer.relay_mean == xloco::common::RelayMean::kAll);
    json all = relay;
    all["outer"]["relay_mean"] = "all";
    CHECK(xloco::common::config_hash(parse_config(all)) == xloco::common::config_hash(parse_config(relay)));
    CHECK(xloco::common::config_hash(parse_config(present)) != xloco::common::config_hash(parse_config(relay)));
    CHECK_THROWS_WITH_AS(parse_config(json{{"outer", {{"relay_mean", "present"}}}}),
                         doctest::Contains("needs outer.downlink = \"relay\" (it is \"quantized\")"),
                         ConfigError);
    // "clipped" with its outer.relay_clip (default 2), hashed only with "clipped".
    json clipped = relay;
    clipped["outer"]["relay_mean"] = "clipped";
    CHECK(parse_config(clipped).outer.relay_mean == xloco::common::RelayMean::kClipped);
    CHECK(parse_config(clipped).outer.relay_clip == 2.0);
    json clip3 = clipped;
    clip3["outer"]["relay_clip"] = 3;
    CHECK(parse_config(clip3).outer.relay_clip == 3.0);
    CHECK(xloco::common::config_hash(parse_config(clip3)) != xloco::common::config_hash(parse_config(clipped)));
    json present_clip3 = present;
    present_clip3["outer"]["relay_clip"] = 3;
    CHECK(xloco::common::config_hash(parse_config(present_clip3)) == xloco::common::config_hash(parse_config(present)));
    clip3["outer"]["relay_clip"] = -1;
    CHECK_THROWS_WITH_AS(parse_config(clip3), doctest::Contains("outer.relay_clip"), ConfigError);
    present["outer"]["relay_mean"] = "median";
    CHECK_THROWS_WITH_AS(parse_config(present), doctest::Contains("outer.relay_mean"), ConfigError);
  }

  TEST_CASE("dotted overrides parse numbers and strings") {
    json j = json::object();
    xloco::common::apply_override(j, "inner.lr=3e-4");
    xloco::common::apply_override(j, "run.name=abc");
    auto c = parse_config(j);
    CHECK(c.inner.lr == doctest::Approx(3e-4));
    CHECK(c.run.name == "abc");
    CHECK_THROWS_AS(xloco::common::apply_override(j, "noequals"), ConfigError);
  }

  TEST_CASE("a key set where it does nothing is refused, naming the key that governs it") {
    xloco::test::ScratchDir dir("inert");
    const std::string file = dir.str() + "/c.json";
    std::ofstream(file) << "{}";
    auto refusal = [&](const std::vector<std::string>& sets) {
      try {
        xloco::common::load_config(file, sets);
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    struct Case {
      std::vector<std::string> sets;
      const char* key;
      const char* governing;
      std::vector<std::string> fixed;  // the same key where it applies: accepted
    };
    const Case cases[] = {
        {{"outer.fold=arrival"}, "outer.fold", "outer.overlap", {"outer.overlap=delayed"}},
        {{"outer.delay_steps=5"}, "outer.delay_steps", "outer.overlap", {"outer.overlap=delayed"}},
        {{"outer.topk=8"}, "outer.topk", "outer.codec_up", {"outer.codec_up=topk"}},
        {{"outer.topk_bits=4"}, "outer.topk_bits", "outer.codec_up", {"outer.codec_up=topk"}},
        {{"outer.codec_up=topk", "outer.topk_down=8"}, "outer.topk_down", "outer.codec_down",
         {"outer.codec_down=topk"}},
        {{"outer.codec_up=topk", "outer.topk_bits_down=4"}, "outer.topk_bits_down",
         "outer.codec_down", {"outer.codec_down=topk"}},
        {{"outer.downlink=relay", "outer.momentum=0", "outer.relay_clip=3"}, "outer.relay_clip",
         "outer.relay_mean", {"outer.relay_mean=clipped"}},
        {{"outer.downlink=relay", "outer.momentum=0", "outer.codec_down=int4"}, "outer.codec_down",
         "outer.downlink", {"outer.downlink=quantized"}},
        {{"outer.min_inner_steps=5"}, "outer.min_inner_steps", "outer.round_budget_s",
         {"outer.round_budget_s=60"}},
        {{"data.dataset=fmnist", "model.kind=cnn", "data.dirichlet_alpha=0.1"},
         "data.dirichlet_alpha", "data.sharding", {"data.sharding=dirichlet"}},
    };
    for (const auto& c : cases) {
      INFO(c.key);
      const std::string msg = refusal(c.sets);
      CHECK(msg.find(std::string(c.key) + " = ") != std::string::npos);
      CHECK(msg.find("does nothing here") != std::string::npos);
      CHECK(msg.find(std::string("set ") + c.governing) != std::string::npos);
      auto fixed = c.sets;
      fixed.insert(fixed.end(), c.fixed.begin(), c.fixed.end());
      CHECK(refusal(fixed).empty());
    }
    // Its default value, given, is no refusal; nor is a checkpoint's config (every key, parsed).
    CHECK(refusal({"outer.relay_clip=2", "outer.delay_steps=0"}).empty());
    auto all = xloco::common::to_json(parse_config(json::object()));
    all["outer"]["delay_steps"] = 5;
    CHECK(parse_config(all).outer.delay_steps == 5);
    // H larger than the run: refused for a DiLoCo run.
    auto c = xloco::common::load_config(file, {"inner.steps=400", "outer.inner_steps=1000"});
    try {
      xloco::common::check_diloco_schedule(c);
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("outer.inner_steps = 1000 exceeds inner.steps = 400") !=
            std::string::npos);
    }
    c.outer.inner_steps = 400;
    CHECK_NOTHROW(xloco::common::check_diloco_schedule(c));
  }

  TEST_CASE("a JSON syntax error names the line and column; an unknown key the nearest one") {
    xloco::test::ScratchDir dir("jsonerr");
    const std::string file = dir.str() + "/c.json";
    std::ofstream(file) << "{\n  \"inner\": {\n    \"lr\": 3e-4,\n  }\n}\n";  // trailing comma
    try {
      xloco::common::load_config(file);
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(file + ":4:3: not valid JSON") != std::string::npos);
      CHECK(msg.find("json.exception") == std::string::npos);
    }
    CHECK(xloco::common::line_and_column("ab\ncd", 5) == std::pair<size_t, size_t>{2, 2});
    CHECK(xloco::common::line_and_column("ab", 1) == std::pair<size_t, size_t>{1, 1});
    try {
      parse_config(json{{"outer", {{"inner_step", 10}}}});
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("(did you mean \"outer.inner_steps\"?)") != std::string::npos);
    }
    try {
      parse_config(json{{"outer", {{"zzzzzzzzzzzz", 10}}}});
      FAIL("expected ConfigError");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("did you mean") == std::string::npos);
    }
  }

  // Hashes of configs as the config_hash of before issue 53's field table computed them (commit
  // c51a71f): a head's checkpoint and a provider's saved state are refused on resume unless the
  // hash is equal, so a table-derived hash that moved any of these would strand every run in
  // flight. New keys hash only when set away from their default.
  TEST_CASE("config_hash: configs hash as they did before the field table (checkpoints resume)") {
    const std::string root = xloco::test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/";
    struct Pinned {
      const char* file;
      std::vector<std::string> sets;
      const char* hash;
    };
    const std::vector<std::string> sparse = {
        "outer.codec_up=topk", "outer.downlink=relay", "outer.block_size=4096", "outer.topk=176",
        "outer.momentum=0", "outer.lr=2.5", "outer.lr_end=1.25", "outer.ef_decay=0.6",
        "outer.relay_mean=clipped"};
    const std::vector<Pinned> pinned = {
        {"kjv-tiny.json", {}, "e1afcfca56545096c457229074df3837"},
        {"kjv-tiny-4p.json", {}, "4d263052f6287e04c2d660cdedc0715e"},
        {"fmnist-cnn.json", {}, "47520f11d1e4ab57f481a158e5cc2e99"},
        {"fmnist-ddpm.json", {}, "178f6b08cb871a5e3f2104b0d6967d96"},
        {"kjv-small-gpu.json", {}, "67d8b234318ab6f75f766a0e4244a0f7"},
        {"tokens-gpt2-small.json", {}, "8fbe28854b95265111e714244495b891"},
        {"kjv-tiny-4p.json", sparse, "8a90e34a1fdcad1a3abfcc1c4c608242"},
        {"kjv-tiny-4p.json", {"outer.codec_up=topk", "outer.codec_down=topk", "outer.topk_down=640", "outer.topk_bits=4", "outer.topk_bits_down=2", "outer.block_size=4096", "outer.momentum=0"}, "31921c2b5539047287912115cc2ab9db"},
        {"kjv-tiny-4p.json", {"outer.overlap=delayed", "outer.fold=arrival", "outer.delay_steps=10", "outer.keep_local=0.5", "outer.momentum=0.8"}, "cb20b3bde315ef0af83a7660b1d76fab"},
        {"kjv-tiny-4p.json", {"outer.fragments=5", "outer.inner_steps=10", "outer.round_budget_s=4.6", "outer.min_inner_steps=3"}, "07171fe1c21907e76dd439f15797bdb4"},
        {"kjv-tiny-4p.json", {"outer.score=true", "outer.norm_bound=3", "outer.trust_region=2", "outer.providers=7", "run.threads=1", "inner.bucket_kb=64"}, "0765ff6c7c610aa2e23e532bdded870c"},
        {"kjv-tiny-4p.json", {"data.sharding=contiguous", "model.vocab_size=256", "outer.lr_end=0.3", "outer.relay_mean=present", "outer.downlink=relay", "outer.momentum=0"}, "4d24f63f6377eb9648fc9d5f9faf970b"},
        {"fmnist-cnn.json", {"data.sharding=dirichlet", "data.dirichlet_alpha=0.3"}, "2770bff6ce4a235fd81c4faebdf33afb"},
    };
    for (const auto& p : pinned) {
      CAPTURE(p.file);
      CAPTURE(p.sets.size());
      const auto c = xloco::common::load_config(root + p.file, p.sets);
      CHECK(xloco::common::config_hash(c) == p.hash);
    }
  }
}

TEST_SUITE("config") {
  // outer.recipe sets its keys under the user's: a key given beside it wins; it hashes as the
  // same keys set by hand would (a provider with the recipe and one with its --set line agree).
  TEST_CASE("recipes: each sets its keys, a key beside it wins, the shipped files load") {
    const std::string root = xloco::test::env_or("XLOCO_SOURCE_DIR", ".") + "/configs/";
    const auto lan = parse_config(json{{"outer", {{"recipe", "lan"}}}});
    CHECK(xloco::common::to_string(lan.outer.codec_up) == std::string("int8"));
    CHECK(lan.outer.momentum == doctest::Approx(0.9));
    const auto sparse = parse_config(json{{"outer", {{"recipe", "wan-sparse"}}}});
    CHECK(xloco::common::to_string(sparse.outer.codec_up) == std::string("topk"));
    CHECK(xloco::common::to_string(sparse.outer.downlink) == std::string("relay"));
    CHECK(sparse.outer.topk == 176);
    CHECK(sparse.outer.momentum == doctest::Approx(0.0));
    const auto wan = parse_config(json{{"outer", {{"recipe", "wan"}, {"lr", 0.5}}}});
    CHECK(xloco::common::to_string(wan.outer.overlap) == std::string("delayed"));
    CHECK(wan.outer.lr == doctest::Approx(0.5));  // the key beside the recipe wins
    // Each recipe names when to pick it, in the README's order.
    REQUIRE(xloco::common::recipes().size() == 4);
    for (const auto& r : xloco::common::recipes()) CHECK(!r.pick_when.empty());
    // Unknown recipe, unequal without a budget, and the combinations never measured: refused.
    CHECK(config_refusal(json{{"outer", {{"recipe", "fast"}}}}).find("outer.recipe") != std::string::npos);
    CHECK(config_refusal(json{{"outer", {{"recipe", "unequal"}}}}).find("outer.round_budget_s") !=
          std::string::npos);
    CHECK(config_refusal(json{{"outer", {{"recipe", "wan-sparse"}, {"fragments", 5}}}})
              .find("outer.fragments") != std::string::npos);
    CHECK(config_refusal(json{{"outer", {{"recipe", "wan-sparse"}, {"round_budget_s", 10}}}})
              .find("outer.round_budget_s") != std::string::npos);
    // A recipe's key overridden into a refusal: the message says the recipe set its keys first.
    const std::string why = config_refusal(json{{"outer", {{"recipe", "wan-sparse"}, {"momentum", 0.9}}}});
    CHECK(why.find("outer.recipe = \"wan-sparse\"") != std::string::npos);
    // Hashes: recipe-lan.json is kjv-tiny-4p.json; recipe-wan-sparse.json is kjv-tiny-4p.json
    // with the README's sparse --set line (the pinned hash above).
    using xloco::common::config_hash;
    using xloco::common::load_config;
    CHECK(config_hash(load_config(root + "recipe-lan.json", {"run.name=kjv-tiny-4p"})) ==
          "4d263052f6287e04c2d660cdedc0715e");
    CHECK(config_hash(load_config(root + "recipe-wan-sparse.json", {"run.name=kjv-tiny-4p"})) ==
          "8a90e34a1fdcad1a3abfcc1c4c608242");
    // A recipe chosen by --set goes over the file's keys (kjv-tiny-4p.json sets int8 and
    // momentum 0.9 itself), and the other --set keys over the recipe.
    const auto by_set = load_config(root + "kjv-tiny-4p.json", {"outer.recipe=wan-sparse"});
    CHECK(xloco::common::to_string(by_set.outer.codec_up) == std::string("topk"));
    CHECK(by_set.outer.momentum == doctest::Approx(0.0));
    CHECK(config_hash(by_set) == "8a90e34a1fdcad1a3abfcc1c4c608242");
    CHECK(load_config(root + "kjv-tiny-4p.json", {"outer.lr=2", "outer.recipe=wan-sparse"})
              .outer.lr == doctest::Approx(2.0));
    for (const char* f : {"recipe-lan.json", "recipe-wan.json", "recipe-wan-sparse.json",
                          "recipe-unequal.json"}) {
      CAPTURE(f);
      const auto c = load_config(root + f);
      CHECK(!c.outer.recipe.empty());
      CHECK_NOTHROW(xloco::common::check_diloco_schedule(c));
    }
  }
}
