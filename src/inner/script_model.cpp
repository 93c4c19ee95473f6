#include "inner/script_model.h"

#include <sstream>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "common/error.h"
#include "inner/data.h"

namespace xloco::inner {
namespace {

using common::ConfigError;

constexpr const char* kScriptContract =
    "xloco trains forward(inputs: Tensor, targets: Tensor) -> Tensor (the scalar loss) or "
    "forward(batch: Tensor) -> Tensor; see examples/README.md";

std::string script_schema_text(const c10::FunctionSchema& schema) {
  std::ostringstream os;
  os << schema;
  return os.str();
}

bool script_is_tensor(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }

std::string script_first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

class ScriptNet : public Net {
 public:
  ScriptNet(const common::Config& config) : path_(config.model.path) {
    try {
      module_ = torch::jit::load(path_, torch::kCPU);
    } catch (const c10::Error& e) {
      throw ConfigError(fmt::format("model.path {}: torch.jit.load cannot read it as a "
                                    "TorchScript module ({})",
                                    path_, script_first_line(e.what_without_backtrace())));
    }
    check_graph_ops();
    check_forward();
    has_logits_ = module_.find_method("logits").has_value();
    can_sample_ = module_.find_method("sample").has_value();
    if (has_logits_) context_ = config.model.seq_len;
    collect_state();
    if (config.data.dataset != common::DatasetKind::kFmnist) check_text_contract(config);
  }

  // A model file is code, run on the head and on every provider (design §10): before anything
  // of it runs, every function it holds (methods of every submodule and the functions they call)
  // is scanned, and only LibTorch's own operators (aten::, prim::) are allowed, less those that
  // read or write files. A graph with any other operator (a custom op library, file I/O) is
  // refused naming it. The scan does not make an untrusted file safe: README says to trust it.
  void check_graph_ops() {
    static const std::unordered_set<std::string> kFileOps = {
        "aten::from_file", "aten::save", "aten::load", "aten::_load_for_mobile",
        "aten::_save_for_mobile", "aten::_save_parameters", "aten::_load_parameters"};
    const auto cu = module_._ivalue()->compilation_unit();
    for (torch::jit::Function* fn : cu->get_functions()) {
      if (!fn->isGraphFunction()) continue;
      std::vector<torch::jit::Block*> blocks{torch::jit::toGraphFunction(*fn).graph()->block()};
      while (!blocks.empty()) {
        torch::jit::Block* b = blocks.back();
        blocks.pop_back();
        for (torch::jit::Node* n : b->nodes()) {
          for (torch::jit::Block* inner : n->blocks()) blocks.push_back(inner);
          const std::string op = n->kind().toQualString();
          const bool ours = op.rfind("aten::", 0) == 0 || op.rfind("prim::", 0) == 0;
          XLOCO_ENFORCE(ours && !kFileOps.count(op), ConfigError,
                        "model.path {}: {} uses {}, {}; xloco runs only graphs of LibTorch's own "
                        "operators that touch no files (a model file is code: see README)",
                        path_, fn->qualname().qualifiedName(), op,
                        ours ? "which reads or writes files" : "an operator from outside LibTorch");
        }
      }
    }
  }

  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) override {
    std::vector<c10::IValue> in{x};
    if (takes_targets_) in.emplace_back(y);
    c10::IValue out;
    try {
      out = module_.forward(std::move(in));
    } catch (const c10::Error& e) {
      throw common::Error(fmt::format("{}: forward failed on inputs {} {}{}: {}", path_,
                                      c10::str(x.sizes()), c10::str(x.scalar_type()),
                                      takes_targets_ ? fmt::format(", targets {} {}", c10::str(y.sizes()),
                                                                   c10::str(y.scalar_type()))
                                                     : std::string(),
                                      script_first_line(e.what_without_backtrace())));
    }
    XLOCO_ENFORCE(out.isTensor(), common::Error, "{}: forward returned {}, not the loss tensor",
                  path_, out.tagKind());
    auto t = out.toTensor();
    XLOCO_ENFORCE(t.numel() == 1 && t.is_floating_point(), common::Error,
                  "{}: forward returned a {} tensor of shape {}; xloco needs the scalar loss",
                  path_, c10::str(t.scalar_type()), c10::str(t.sizes()));
    return t.reshape({});
  }

  torch::Tensor logits(const torch::Tensor& x) override {
    XLOCO_ENFORCE(has_logits_, common::Error,
                  "{}: the module has no logits(inputs) method (needed for text sampling and "
                  "--logits-out)", path_);
    return module_.get_method("logits")({x}).toTensor();
  }

  torch::Tensor sample(int64_t n) override {
    XLOCO_ENFORCE(can_sample_, common::Error, "{}: the module has no sample(n: int) method",
                  path_);
    auto out = module_.get_method("sample")({c10::IValue(n)});
    XLOCO_ENFORCE(out.isTensor() && out.toTensor().dim() == 4 && out.toTensor().size(0) == n,
                  common::Error, "{}: sample({}) must return a tensor [n, C, H, W]", path_, n);
    return out.toTensor();
  }

  int64_t context_length() const override { return context_; }
  bool has_logits() const override { return has_logits_; }
  int64_t declared_vocab() const override { return vocab_ > 0 ? vocab_ : 0; }
  bool can_sample() const override { return can_sample_; }
  std::vector<StateTensor> state() override { return state_; }
  std::vector<StateTensor> local_state() override { return local_; }

  void train(bool on) override {
    Net::train(on);
    module_.train(on);
  }
  using Net::to;
  void to(torch::Device device, bool non_blocking) override {
    module_.to(device, non_blocking);
  }

 private:
  void check_forward() {
    const auto fwd = module_.find_method("forward");
    XLOCO_ENFORCE(fwd.has_value(), ConfigError, "{}: the module has no forward method; {}", path_,
                  kScriptContract);
    const auto& schema = fwd->function().getSchema();
    const auto& args = schema.arguments();  // args[0] is self
    bool ok = (args.size() == 2 || args.size() == 3) && schema.returns().size() == 1 &&
              script_is_tensor(schema.returns()[0].type());
    for (size_t i = 1; ok && i < args.size(); ++i) ok = script_is_tensor(args[i].type());
    XLOCO_ENFORCE(ok, ConfigError, "{}: forward is `{}`; {}", path_, script_schema_text(schema),
                  kScriptContract);
    takes_targets_ = args.size() == 3;
  }

  // On text (kjv, tokens), before any training: the module's vocabulary against the data's
  // (its logits' last dimension, or a forward on the data's largest token id when it has no
  // logits method), logged; and a warning when its loss cannot depend on the targets.
  void check_text_contract(const common::Config& config) {
    int64_t need = 0;
    try {
      need = data_vocab_size(config.data);
    } catch (const common::Error& e) {  // no data here (sampling from a checkpoint): no check
      spdlog::debug("{}: vocabulary not checked: {}", path_, e.what());
    }
    const auto fwd = module_.find_method("forward");
    const auto& graph = *torch::jit::toGraphFunction(fwd->function()).graph();
    if (takes_targets_ && graph.inputs().size() == 3 && graph.inputs()[2]->uses().empty()) {
      spdlog::warn("{}: forward(inputs, targets) never reads targets: its loss cannot depend on "
                   "the next tokens, and training will teach the model nothing about them",
                   path_);
    } else if (!takes_targets_) {
      spdlog::warn("{}: forward(batch) takes no targets on a text data set: it must make its own "
                   "(the inputs shifted by one) for the loss to be next-token prediction", path_);
    }
    if (need <= 0) return;
    torch::NoGradGuard no_grad;
    const bool was_training = module_.is_training();
    module_.eval();
    const int64_t T = std::max<int64_t>(1, std::min<int64_t>(config.model.seq_len, 8));
    if (has_logits_) {
      torch::Tensor out;
      try {
        out = module_.get_method("logits")({torch::zeros({1, T}, torch::kLong)}).toTensor();
      } catch (const c10::Error& e) {
        throw ConfigError(fmt::format("{}: logits(inputs) failed on a [1, {}] batch of token 0: {}",
                                      path_, T, script_first_line(e.what_without_backtrace())));
      }
      vocab_ = out.dim() > 0 ? out.size(-1) : 0;
    } else {  // vocab_ stays -1: no size declared, only whether the data's largest id fits
      const auto top = torch::full({2, T}, need - 1, torch::kLong);
      try {
        module_.forward(takes_targets_ ? std::vector<c10::IValue>{top, top}
                                       : std::vector<c10::IValue>{top});
      } catch (const c10::Error& e) {  // another failure: training reports it with its shapes
        const std::string why = e.what_without_backtrace();
        XLOCO_ENFORCE(why.find("out of range") == std::string::npos, ConfigError,
                      "{}: forward fails on token id {}, the data's largest (its vocabulary is "
                      "{}): the module's vocabulary is smaller than the data's ({})",
                      path_, need - 1, need, script_first_line(why));
      }
    }
    module_.train(was_training);
    XLOCO_ENFORCE(vocab_ < 0 || vocab_ >= need, ConfigError,
                  "{}: its logits have {} entries but the data's vocabulary is {} ({}): tokens "
                  "at or above {} would have no embedding; build the module with a vocabulary "
                  "of at least {}",
                  path_, vocab_, need,
                  config.data.dataset == common::DatasetKind::kKjv ? std::string("kjv is byte-level")
                                                                  : config.data.path + "/meta.json",
                  vocab_, need);
    spdlog::debug("{}: vocabulary {} (the data's: {})", path_,
                  vocab_ > 0 ? std::to_string(vocab_) : std::string("not declared (no logits method)"),
                  need);
  }

  void collect_state() {
    std::unordered_set<const void*> seen;
    std::vector<StateTensor> frozen;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (!seen.insert(p.value.unsafeGetTensorImpl()).second) continue;  // tied: stored once
      XLOCO_ENFORCE(p.value.scalar_type() == torch::kFloat32, ConfigError,
                    "{}: parameter {} is {}; xloco trains float32 parameters (call .float() "
                    "on the module before torch.jit.script)",
                    path_, p.name, c10::str(p.value.scalar_type()));
      (p.value.requires_grad() ? state_ : frozen).push_back({p.name, p.value, p.value.requires_grad()});
    }
    XLOCO_ENFORCE(!state_.empty(), ConfigError,
                  "{}: the module has no trainable parameters (requires_grad=True)", path_);
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      if (!seen.insert(b.value.unsafeGetTensorImpl()).second) continue;
      if (b.value.scalar_type() == torch::kFloat32) {
        frozen.push_back({b.name, b.value, false});
      } else if (b.value.scalar_type() == torch::kInt64) {
        local_.push_back({b.name, b.value, false});
      } else {
        throw ConfigError(fmt::format(
            "{}: buffer {} is {}; xloco keeps float32 buffers (averaged over providers each "
            "round) and int64 buffers (per rank)", path_, b.name, c10::str(b.value.scalar_type())));
      }
    }
    state_.insert(state_.end(), frozen.begin(), frozen.end());
  }

  std::string path_;
  torch::jit::Module module_;
  bool takes_targets_ = true, has_logits_ = false, can_sample_ = false;
  int64_t context_ = 0;
  int64_t vocab_ = -1;  // the logits' last dimension on text; -1 when not known
  std::vector<StateTensor> state_, local_;
};

}  // namespace

std::shared_ptr<Net> load_script_model(const common::Config& config) {
  return std::make_shared<ScriptNet>(config);
}

}  // namespace xloco::inner
