#include "inner/trainer.h"

#include <cmath>
#include <cstring>

#include <torch/torch.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/metrics.h"
#include "inner/data.h"
#include "inner/runtime.h"

namespace xloco::inner {

common::TensorBlob to_blob(const std::string& name, const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU).contiguous();
  common::TensorBlob b;
  b.name = name;
  b.shape.assign(c.sizes().begin(), c.sizes().end());
  switch (c.scalar_type()) {
    case torch::kFloat32: b.dtype = "F32"; break;
    case torch::kFloat64: b.dtype = "F64"; break;
    case torch::kInt64: b.dtype = "I64"; break;
    default: throw common::Error(fmt::format("to_blob: unsupported dtype for {}", name));
  }
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  b.data.assign(p, p + c.numel() * c.element_size());
  return b;
}

common::TensorBlob view_blob(const std::string& name, const torch::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous() || t.scalar_type() != torch::kFloat32) {
    return to_blob(name, t);
  }
  common::TensorBlob b;
  b.name = name;
  b.dtype = "F32";
  b.shape.assign(t.sizes().begin(), t.sizes().end());
  b.borrowed = static_cast<const uint8_t*>(t.data_ptr());
  b.borrowed_size = static_cast<size_t>(t.numel()) * sizeof(float);
  return b;
}

torch::Tensor from_blob(const common::TensorBlob& blob) {
  torch::ScalarType st;
  if (blob.dtype == "F32") {
    st = torch::kFloat32;
  } else if (blob.dtype == "F64") {
    st = torch::kFloat64;
  } else if (blob.dtype == "I64") {
    st = torch::kInt64;
  } else if (blob.dtype == "F16") {
    st = torch::kHalf;
  } else if (blob.dtype == "BF16") {
    st = torch::kBFloat16;
  } else {
    throw common::IoError(fmt::format("tensor {}: unsupported dtype {}", blob.name, blob.dtype));
  }
  return torch::from_blob(const_cast<uint8_t*>(blob.data.data()), blob.shape, st).clone();
}

InnerTrainer::InnerTrainer(const common::Config& config, std::shared_ptr<Net> model,
                           Group& group, torch::Device device)
    : config_(config), model_(std::move(model)), group_(group), device_(device) {
  model_->to(device_);
  // θ's order: trained >=2-D weights (decayed), the other trained tensors, then float buffers.
  std::map<std::string, torch::Tensor> named;
  int64_t trained = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (const auto& t : model_->state()) {
      const int kind = !t.trained ? 2 : t.tensor.dim() >= 2 ? 0 : 1;
      if (kind != pass) continue;
      layout_.append(t.name, t.tensor.sizes().vec());
      named[t.name] = t.tensor;
    }
    if (pass == 0) decay_numel_ = layout_.numel;
    if (pass == 1) trained = layout_.numel;
  }
  if (trained < layout_.numel) layout_.buffers_offset = trained;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  params_ = torch::empty({layout_.numel}, opts);
  torch::NoGradGuard guard;
  for (const auto& s : layout_.slots) {
    auto& p = named.at(s.name);
    auto view = params_.narrow(0, s.offset, s.numel).view(s.shape);
    view.copy_(p);
    p.set_data(view);
  }
  // The module's original parameter tensors were just freed. They came from the heap (each is
  // under glibc's mmap threshold), and the trainer's allocator policy keeps freed heap memory
  // resident for speed, so give this one-off model-sized block back now: otherwise it counts
  // as a 1x-model RSS overhead for the life of the process.
  common::release_free_memory();
}

void InnerTrainer::ensure_training_buffers() {
  if (grads_.defined()) return;
  grads_ = torch::zeros({params_.numel() + 2}, params_.options());
  std::map<std::string, torch::Tensor> named;
  for (const auto& t : model_->state()) named[t.name] = t.tensor;
  for (const auto& s : layout_.slots) {
    if (s.offset >= layout_.trained_numel()) break;  // float buffers have no gradient
    named.at(s.name).mutable_grad() = grads_.narrow(0, s.offset, s.numel).view(s.shape);
  }
  if (!exp_avg_.defined()) reset_optimizer();
}

void InnerTrainer::reset_optimizer() {
  exp_avg_ = torch::zeros_like(params_);
  exp_avg_sq_ = torch::zeros_like(params_);
  adam_t_ = 0;
}

double InnerTrainer::lr_at_position(double step) const {
  const auto& in = config_.inner;
  if (step < in.warmup_steps) return in.lr * (step + 1) / in.warmup_steps;
  const double span = std::max(1, in.steps - in.warmup_steps);
  const double progress = std::min(1.0, (step - in.warmup_steps) / span);
  return in.min_lr + 0.5 * (in.lr - in.min_lr) * (1.0 + std::cos(M_PI * progress));
}

StepStats InnerTrainer::train_step(const Dataset& data, int64_t step, bool want_stop,
                                   double schedule_pos) {
  ensure_training_buffers();
  model_->train();
  const Batch b = data.train_batch(step, group_.rank(), group_.world());
  // Models that draw random numbers in forward (a diffusion model's noise and timesteps) draw
  // the same ones on a resumed run: the generator is a function of (seed, stream, step, rank).
  grads_.zero_();
  torch::Tensor loss;
  {
    std::lock_guard<std::mutex> rng(rng_mutex());  // from the seed to the backward pass
    torch::manual_seed(mix_seed(config_.run.seed, rng_stream_, static_cast<uint64_t>(step),
                                static_cast<uint64_t>(group_.rank())));
    {
      const Autocast autocast(config_.run.precision, device_);  // the forward only
      loss = model_->loss(b.x.to(device_), b.y.to(device_)).to(torch::kFloat32);
    }
    loss.backward();
  }
  {
    torch::NoGradGuard guard;
    // The loss and the stop request ride in the gradient buffer's last slots: one allreduce per
    // step carries all three.
    grads_.narrow(0, params_.numel(), 1).copy_(loss.detach().reshape({1}));
    grads_[params_.numel() + 1].fill_(want_stop ? 1.0 : 0.0);
    group_.allreduce_sum(grads_, static_cast<int64_t>(config_.inner.bucket_kb) * 1024);
    if (group_.world() > 1) grads_.div_(group_.world());
  }
  StepStats st;
  st.loss = grads_[params_.numel()].item<double>();
  st.stop = grads_[params_.numel() + 1].item<double>() > 0;
  XLOCO_ENFORCE(std::isfinite(st.loss), common::Error,
                "step {}: loss is {} (diverged); lower inner.lr or check the data", step, st.loss);
  auto g = grads_.narrow(0, 0, layout_.trained_numel());
  st.grad_norm = g.norm().item<double>();
  if (config_.inner.grad_clip > 0 && st.grad_norm > config_.inner.grad_clip) {
    g.mul_(config_.inner.grad_clip / (st.grad_norm + 1e-6));
  }
  st.lr = schedule_pos >= 0 ? lr_at_position(schedule_pos) : lr_at(step);
  apply_adamw(st.lr);
  st.tokens = b.tokens * group_.world();
  return st;
}

void InnerTrainer::apply_adamw(double lr) {
  torch::NoGradGuard guard;
  const auto& in = config_.inner;
  auto g = grads_.narrow(0, 0, layout_.trained_numel());
  ++adam_t_;
  // PyTorch's AdamW order: decoupled decay first, then the Adam update.
  if (in.weight_decay > 0 && decay_numel_ > 0) {
    params_.narrow(0, 0, decay_numel_).mul_(1.0 - lr * in.weight_decay);
  }
  const double bc1 = 1.0 - std::pow(in.beta1, static_cast<double>(adam_t_));
  const double bc2 = 1.0 - std::pow(in.beta2, static_cast<double>(adam_t_));
  // In chunks, so the one temporary (the denominator) is 4 MiB, not a copy of the model.
  constexpr int64_t kChunk = 1 << 20;
  const int64_t n = layout_.trained_numel();  // float buffers after it are not trained
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    auto p = params_.narrow(0, off, len), gc = g.narrow(0, off, len);
    auto m = exp_avg_.narrow(0, off, len), v = exp_avg_sq_.narrow(0, off, len);
    m.lerp_(gc, 1.0 - in.beta1);
    v.mul_(in.beta2).addcmul_(gc, gc, 1.0 - in.beta2);
    auto denom = v.sqrt();
    denom.div_(std::sqrt(bc2)).add_(in.eps);
    p.addcdiv_(m, denom, -lr / bc1);
  }
}

EvalStats InnerTrainer::evaluate(const Dataset& data, const std::function<void()>& between_batches) {
  torch::NoGradGuard guard;
  model_->eval();
  double sum = 0, correct = 0, count = 0;
  const bool classify = config_.model.kind == common::ModelKind::kCnn;
  int64_t index = 0;
  for (const auto& b : data.eval_batches(group_.rank(), group_.world())) {
    auto x = b.x.to(device_), y = b.y.to(device_);
    if (!model_->has_logits()) {
      // The model's own loss, weighted by the batch's tokens (or samples). Its random draws are
      // fixed per batch, so every evaluation of every run scores the same noise.
      const auto n = static_cast<double>(b.tokens);
      {
        std::lock_guard<std::mutex> rng(rng_mutex());
        torch::manual_seed(mix_seed(config_.run.seed, 0x45564c, static_cast<uint64_t>(index++),
                                    static_cast<uint64_t>(group_.rank())));
        sum += model_->loss(x, y).item<double>() * n;
      }
      count += n;
      if (between_batches) between_batches();
      continue;
    }
    auto logits = model_->logits(x);
    auto flat = logits.view({-1, logits.size(-1)});
    auto yy = y.reshape({-1});
    sum += torch::nn::functional::cross_entropy(
               flat, yy, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .item<double>();
    if (classify) correct += flat.argmax(-1).eq(yy).sum().item<double>();
    count += static_cast<double>(yy.numel());
    if (between_batches) between_batches();
  }
  auto totals = torch::tensor({sum, correct, count}, torch::kFloat64);
  group_.allreduce_sum(totals, 1 << 20);
  EvalStats e;
  e.count = static_cast<int64_t>(totals[2].item<double>());
  e.loss = totals[0].item<double>() / std::max(1.0, totals[2].item<double>());
  if (classify) e.accuracy = totals[1].item<double>() / std::max(1.0, totals[2].item<double>());
  return e;
}

std::string InnerTrainer::param_hash() const {
  auto c = params_.to(torch::kCPU).contiguous();
  return common::hash_hex(c.data_ptr(), static_cast<size_t>(c.numel()) * sizeof(float));
}

std::vector<common::TensorBlob> InnerTrainer::model_blobs() const {
  std::vector<common::TensorBlob> out;
  // In the model's own (nanoGPT) order, not the flat layout order; then per-rank state.
  for (const auto& t : model_->state()) out.push_back(view_blob(t.name, t.tensor));
  for (const auto& t : model_->local_state()) out.push_back(to_blob(t.name, t.tensor));
  return out;
}

std::vector<common::TensorBlob> InnerTrainer::optimizer_blobs() const {
  if (!exp_avg_.defined()) return {};
  return {view_blob("exp_avg", exp_avg_), view_blob("exp_avg_sq", exp_avg_sq_),
          to_blob("step", torch::tensor({adam_t_}, torch::kInt64))};
}

void InnerTrainer::load_model(const common::SafetensorsFile& file) {
  torch::NoGradGuard guard;
  for (const auto& s : layout_.slots) {
    const auto* blob = file.find(s.name);
    XLOCO_ENFORCE(blob != nullptr, common::IoError, "checkpoint lacks tensor {}", s.name);
    XLOCO_ENFORCE(blob->shape == s.shape && blob->dtype == "F32", common::IoError,
                  "checkpoint tensor {} is {} {}, the model needs F32 {}", s.name, blob->dtype,
                  fmt::join(blob->shape, "x"), fmt::join(s.shape, "x"));
    params_.narrow(0, s.offset, s.numel).copy_(from_blob(*blob).view({-1}));
  }
  for (auto& t : model_->local_state()) {
    if (const auto* blob = file.find(t.name)) t.tensor.copy_(from_blob(*blob).view(t.tensor.sizes()));
  }
}


void InnerTrainer::broadcast_optimizer() {
  ensure_training_buffers();
  group_.broadcast(exp_avg_);
  group_.broadcast(exp_avg_sq_);
  auto t = torch::tensor({adam_t_}, torch::kInt64);
  group_.broadcast(t);
  adam_t_ = t.item<int64_t>();
}

void InnerTrainer::load_optimizer(const common::SafetensorsFile& file) {
  const auto* m = file.find("exp_avg");
  const auto* v = file.find("exp_avg_sq");
  const auto* t = file.find("step");
  XLOCO_ENFORCE(m && v && t, common::IoError, "optimizer checkpoint lacks exp_avg/exp_avg_sq/step");
  auto mt = from_blob(*m), vt = from_blob(*v);
  XLOCO_ENFORCE(mt.numel() == params_.numel() && vt.numel() == params_.numel(), common::IoError,
                "optimizer checkpoint has {} moments, the model {} parameters", mt.numel(),
                params_.numel());
  exp_avg_ = mt.to(params_.device());
  exp_avg_sq_ = vt.to(params_.device());
  adam_t_ = from_blob(*t).item<int64_t>();
}

}  // namespace xloco::inner
