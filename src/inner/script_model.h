// TorchScript models (model.kind = torchscript): a module written in Python, saved with
// torch.jit.save, trained by xloco with no Python on the providers. The contract (README,
// examples/):
//   forward(inputs: Tensor, targets: Tensor) -> Tensor   the scalar loss of one batch, or
//   forward(batch: Tensor) -> Tensor                     for models without targets (the data
//                                                        set's labels are then not passed)
//   logits(inputs: Tensor) -> Tensor                     optional: text sampling, --logits-out
//   sample(n: int) -> Tensor                             optional: n images [n, C, H, W] in [0, 1]
// Parameters must be float32; float32 buffers (batch-norm statistics) ride in θ and are
// averaged over providers at every round; int64 buffers stay per rank.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "inner/model.h"

namespace xloco::inner {

// Loads config.model.path and checks it against the contract; ConfigError naming the file and
// what is missing or wrong otherwise.
std::shared_ptr<Net> load_script_model(const common::Config& config);

}  // namespace xloco::inner
