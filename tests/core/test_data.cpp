#include "doctest_torch.h"
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/error.h"
#include "helpers.h"
#include "inner/data.h"

using namespace xloco;

TEST_SUITE("data") {
  TEST_CASE("KJV blocks: shards are disjoint, cover the training blocks, never validation") {
    const int64_t n = 4400000;
    const auto val = inner::kjv_val_blocks(n);
    CHECK(val.size() == 3);
    for (const auto sharding : {common::Sharding::kIid, common::Sharding::kBooks}) {
      std::set<int64_t> seen;
      size_t total = 0;
      for (int k = 0; k < 4; ++k) {
        const auto mine = inner::kjv_train_blocks(n, {k, 4}, sharding);
        CHECK(!mine.empty());
        for (auto b : mine) {
          CHECK(b % 20 != 19);
          CHECK(seen.insert(b).second);  // disjoint
        }
        total += mine.size();
        CHECK(mine == inner::kjv_train_blocks(n, {k, 4}, sharding));  // deterministic
      }
      CHECK(total + val.size() == static_cast<size_t>((n + inner::kKjvBlock - 1) / inner::kKjvBlock));
    }
    // books are contiguous runs, iid interleaves
    const auto books0 = inner::kjv_train_blocks(n, {0, 4}, common::Sharding::kBooks);
    const auto iid0 = inner::kjv_train_blocks(n, {0, 4}, common::Sharding::kIid);
    CHECK(books0.back() < inner::kjv_train_blocks(n, {1, 4}, common::Sharding::kBooks).front());
    CHECK(iid0[1] - iid0[0] >= 4);
  }

  TEST_CASE("verse references are stripped") {
    const std::string raw = "Ge1:1 In the beginning.\n1Jo1:2 For the life.\nRev22:21 Amen.\n";
    CHECK(inner::strip_verse_references(raw) == "In the beginning.\nFor the life.\nAmen.\n");
  }

  TEST_CASE("the real KJV text loads (bible-kjv)") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing (Debian package bible-kjv not installed)");
    }
    test::ScratchDir dir("kjv");
    common::DataConfig d;
    d.cache_dir = dir.str();
    const auto text = inner::load_kjv_text(d);
    CHECK(text.size() > 4000000);
    CHECK(text.rfind("In the beginning God created the heaven and the earth.\n", 0) == 0);
    CHECK(text.find("Ge1:") == std::string::npos);
    CHECK(inner::load_kjv_text(d) == text);  // from the cache
  }

  TEST_CASE("batches are a pure function of (seed, provider, step, rank); ranks split the batch") {
    if (!test::have_kjv()) {
      XLOCO_SKIP_CASE("/usr/bin/bible missing");
    }
    auto c = test::tiny_gpt_config();
    auto a = inner::make_dataset(c, {0, 2});
    auto b = inner::make_dataset(c, {0, 2});
    auto other = inner::make_dataset(c, {1, 2});
    auto full = a->train_batch(7, 0, 1);
    CHECK(torch::equal(full.x, b->train_batch(7, 0, 1).x));
    CHECK(!torch::equal(full.x, a->train_batch(8, 0, 1).x));
    CHECK(!torch::equal(full.x, other->train_batch(7, 0, 1).x));
    auto r0 = a->train_batch(7, 0, 2), r1 = a->train_batch(7, 1, 2);
    CHECK(torch::equal(torch::cat({r0.x, r1.x}), full.x));
    CHECK(torch::equal(full.y.narrow(1, 0, c.model.seq_len - 1), full.x.narrow(1, 1, c.model.seq_len - 1)));
    CHECK(full.tokens == c.inner.batch_size * c.model.seq_len);
    auto e0 = a->eval_batches(0, 2), e1 = a->eval_batches(1, 2), e = a->eval_batches(0, 1);
    int64_t n0 = 0, n1 = 0, n = 0;
    for (auto& x : e0) n0 += x.x.size(0);
    for (auto& x : e1) n1 += x.x.size(0);
    for (auto& x : e) n += x.x.size(0);
    CHECK(n == c.inner.eval_batches * c.inner.batch_size);
    CHECK(n0 + n1 == n);
  }

  TEST_CASE("Fashion-MNIST shards: iid and dirichlet are disjoint and deterministic") {
    std::vector<uint8_t> labels(6000);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>((i * 7) % 10);
    for (const auto s : {common::Sharding::kIid, common::Sharding::kDirichlet}) {
      std::set<int64_t> seen;
      size_t total = 0;
      for (int k = 0; k < 4; ++k) {
        auto mine = inner::fmnist_shard(labels, {k, 4}, s, 0.5, 42);
        CHECK(mine == inner::fmnist_shard(labels, {k, 4}, s, 0.5, 42));
        for (auto i : mine) CHECK(seen.insert(i).second);
        total += mine.size();
      }
      CHECK(total == labels.size());
    }
    // dirichlet(0.1) skews labels: some shard's most common class is far above 10 %.
    auto skew = inner::fmnist_shard(labels, {0, 4}, common::Sharding::kDirichlet, 0.1, 42);
    std::vector<int> counts(10);
    for (auto i : skew) counts[labels[i]]++;
    CHECK(*std::max_element(counts.begin(), counts.end()) > 0.3 * skew.size());
  }

  TEST_CASE("IDX reader rejects truncated and wrong files with the path in the message") {
    test::ScratchDir dir("idx");
    const auto path = dir.str() + "/bad.gz";
    gzFile f = gzopen(path.c_str(), "wb");
    const unsigned char hdr[] = {0, 0, 8, 1, 0, 0, 0, 100, 1, 2, 3};
    gzwrite(f, hdr, sizeof(hdr));
    gzclose(f);
    CHECK_THROWS_WITH_AS(inner::read_idx(path), doctest::Contains("truncated IDX data"),
                         common::IoError);
    f = gzopen(path.c_str(), "wb");
    const unsigned char wrong[] = {1, 2, 3, 4};
    gzwrite(f, wrong, sizeof(wrong));
    gzclose(f);
    CHECK_THROWS_WITH_AS(inner::read_idx(path), doctest::Contains("bad.gz"), common::IoError);
    CHECK_THROWS_AS(inner::read_idx(dir.str() + "/missing.gz"), common::IoError);
  }

  TEST_CASE("the real Fashion-MNIST files load (dataset-fashion-mnist)") {
    if (!test::have_fmnist()) {
      XLOCO_SKIP_CASE("/usr/share/datasets/fashion-mnist missing (dataset-fashion-mnist)");
    }
    auto idx = inner::read_idx(inner::default_fmnist_dir() + "/t10k-labels-idx1-ubyte.gz");
    CHECK(idx.dims == std::vector<int64_t>{10000});
    auto c = test::tiny_gpt_config();
    c.data.dataset = common::DatasetKind::kFmnist;
    c.model.kind = common::ModelKind::kCnn;
    auto ds = inner::make_dataset(c, {1, 3});
    auto b = ds->train_batch(0, 0, 1);
    CHECK(b.x.sizes() == torch::IntArrayRef({c.inner.batch_size, 1, 28, 28}));
    CHECK(b.y.max().item<int64_t>() < 10);
  }
}
