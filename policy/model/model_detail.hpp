// policy/model/model_detail.hpp (internal to policy/model/model*.cpp): what the model's modules
// (model.cpp), its decoding step (model_decode.cpp), its checkpoint I/O (model_checkpoint.cpp)
// and activation checkpointing (checkpointing.cpp) share.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace crucible::policy {
class DecoderLayerImpl;
}

namespace crucible::policy::model_detail {

inline torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {}) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

// `parts` as one tensor along dim 0 when they lie back to back, in this order, in one storage
// (contiguous, one dtype and device, equal trailing sizes); undefined otherwise, or when any is
// undefined. A view: no copy, no kernel.
torch::Tensor joined_rows(const std::vector<torch::Tensor>& parts);

// A LoRA adapter's parameter (`...lora_A.weight`, `...lora_B.weight`), by name.
inline bool is_lora_name(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// layer->forward(x, cos, sin, mask) under activation checkpointing (checkpointing.cpp): only x,
// cos, sin and mask are kept for the backward pass, which runs the layer again.
torch::Tensor checkpointed_layer(const std::shared_ptr<DecoderLayerImpl>& layer, const torch::Tensor& x,
                                 const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& mask);

} // namespace crucible::policy::model_detail
