#include "inner/dist.h"

#include <cstdlib>
#include <cstring>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>
#include <torch/version.h>

#include "common/error.h"

namespace xloco::inner {

// What both backends derive from: c10d::Backend in LibTorch 2.x, ProcessGroup in 1.13.
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<BackendBase> pg;  // ProcessGroupGloo or ProcessGroupNCCL
  bool nccl = false;

  // NCCL reduces GPU tensors only: a CPU tensor goes through this rank's GPU and back.
  template <class Op>
  void on_device(torch::Tensor& t, torch::Device device, Op&& op) {
    if (!nccl || t.device() == device) return op(t);
    torch::Tensor d = t.to(device);
    op(d);
    t.copy_(d);
  }
};

DistOptions dist_options_from_env() {
  DistOptions o;
  auto get = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v ? v : "";
  };
  if (!get("XLOCO_RANK").empty()) o.rank = std::atoi(get("XLOCO_RANK").c_str());
  if (!get("XLOCO_WORLD_SIZE").empty()) o.world = std::atoi(get("XLOCO_WORLD_SIZE").c_str());
  o.store = get("XLOCO_STORE");
  if (!get("XLOCO_GLOO_HOST").empty()) o.hostname = get("XLOCO_GLOO_HOST");
  XLOCO_ENFORCE(o.world >= 1 && o.rank >= 0 && o.rank < o.world, common::ConfigError,
                "XLOCO_RANK={} / XLOCO_WORLD_SIZE={} are inconsistent", o.rank, o.world);
  return o;
}

Group::Group(const DistOptions& opts) : impl_(std::make_unique<Impl>()), rank_(opts.rank),
                                        world_(opts.world), device_(opts.device) {
  if (world_ == 1) return;
  XLOCO_ENFORCE(!opts.store.empty(), common::ConfigError,
                "rank {} of {}: no rendezvous store (XLOCO_STORE)", rank_, world_);
  if (opts.store.rfind("file:", 0) == 0) {
    impl_->store = c10::make_intrusive<c10d::FileStore>(opts.store.substr(5), world_);
  } else if (opts.store.rfind("tcp://", 0) == 0) {
    const std::string hp = opts.store.substr(6);
    const auto colon = hp.rfind(':');
    XLOCO_ENFORCE(colon != std::string::npos, common::ConfigError, "bad store {}", opts.store);
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(std::atoi(hp.substr(colon + 1).c_str()));
    so.isServer = rank_ == 0;
    so.numWorkers = world_;
    so.timeout = opts.timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(hp.substr(0, colon), so);
  } else {
    throw common::ConfigError(fmt::format("unknown store \"{}\" (file:PATH or tcp://HOST:PORT)",
                                          opts.store));
  }
#ifdef USE_C10D_NCCL
  if (device_.is_cuda()) {
    c10::cuda::set_device(device_.index());
    auto no = c10d::ProcessGroupNCCL::Options::create();
    no->timeout = opts.timeout;
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, rank_, world_, no);
    impl_->nccl = true;
    return;
  }
#endif
  auto go = c10d::ProcessGroupGloo::Options::create();
  go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(opts.hostname));
  go->timeout = opts.timeout;
  go->threads = 1;
  impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, rank_, world_, go);
}

Group::~Group() = default;

const char* Group::backend() const {
  if (world_ == 1) return "none";
  return impl_->nccl ? "nccl" : "gloo";
}

void Group::allreduce_sum(torch::Tensor& flat, int64_t bucket_bytes) {
  if (world_ == 1) return;
  const int64_t per = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(flat.element_size()));
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<torch::Tensor>> buckets;
  impl_->on_device(flat, device_, [&](torch::Tensor& t) {
    for (int64_t off = 0; off < t.numel(); off += per) {
      buckets.push_back({t.narrow(0, off, std::min(per, t.numel() - off))});
    }
    for (auto& b : buckets) works.push_back(impl_->pg->allreduce(b));
    for (auto& w : works) w->wait();
  });
}

void Group::broadcast(torch::Tensor& t, int root) {
  if (world_ == 1) return;
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->on_device(t, device_, [&](torch::Tensor& d) {
    std::vector<torch::Tensor> v{d};
    impl_->pg->broadcast(v, o)->wait();
  });
}

void Group::barrier() {
  if (world_ == 1) return;
  impl_->pg->barrier()->wait();
}

void Group::check_same(const std::string& what, const std::string& hex) {
  if (world_ == 1) return;
  // Every rank contributes its hash bytes; max == min per byte iff all are equal.
  auto mine = torch::zeros({static_cast<int64_t>(hex.size())}, torch::kFloat64);
  for (size_t i = 0; i < hex.size(); ++i) mine[static_cast<int64_t>(i)] = static_cast<double>(hex[i]);
  auto hi = mine.clone(), lo = -mine;
  c10d::AllreduceOptions mx;
  mx.reduceOp = c10d::ReduceOp::MAX;
  for (torch::Tensor* t : {&hi, &lo}) {
    impl_->on_device(*t, device_, [&](torch::Tensor& d) {
      std::vector<torch::Tensor> v{d};
      impl_->pg->allreduce(v, mx)->wait();
    });
  }
  XLOCO_ENFORCE(torch::equal(hi, -lo), common::Error,
                "{} differ across the {} ranks of this provider (rank {} has {}): replicas "
                "drifted apart", what, world_, rank_, hex);
}

}  // namespace xloco::inner
