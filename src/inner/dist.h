// The ranks of one provider as a c10d process group: ProcessGroupNCCL when they train on CUDA
// (a LibTorch built with NCCL), else ProcessGroupGloo (LibTorch's own, on the system Gloo);
// rendezvous through a FileStore (one host) or a TCPStore. World size 1 needs no group at all.
// The collectives take tensors on any device: a CPU tensor given to an NCCL group goes through
// the rank's GPU and back (the small control tensors; θ and the gradients live on the GPU).
// c10d headers stay in dist.cpp: they are the slowest headers in LibTorch.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <torch/types.h>

namespace xloco::inner {

struct DistOptions {
  int rank = 0;
  int world = 1;
  std::string store;        // "file:/path" or "tcp://host:port" (rank 0 serves the TCPStore)
  std::string hostname = "127.0.0.1";  // Gloo device address of this rank
  std::chrono::seconds timeout{300};
  torch::Device device{torch::kCPU};  // where this rank trains (resolve_device): CUDA → NCCL
};

// Reads XLOCO_RANK, XLOCO_WORLD_SIZE, XLOCO_STORE, XLOCO_GLOO_HOST (set by `--nproc`).
DistOptions dist_options_from_env();

class Group {
 public:
  explicit Group(const DistOptions& opts);
  ~Group();
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool leader() const { return rank_ == 0; }
  torch::Device device() const { return device_; }
  const char* backend() const;  // "nccl", "gloo" or "none" (one rank)
  // In-place sum over ranks of a flat float tensor, in buckets of `bucket_bytes` (all issued,
  // then all awaited, so Gloo can pipeline them).
  void allreduce_sum(torch::Tensor& flat, int64_t bucket_bytes);
  void broadcast(torch::Tensor& t, int root = 0);
  void barrier();
  // Throws common::Error when `hex` differs on any rank (a replica has drifted).
  void check_same(const std::string& what, const std::string& hex);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int world_ = 1;
  torch::Device device_{torch::kCPU};
};

}  // namespace xloco::inner
