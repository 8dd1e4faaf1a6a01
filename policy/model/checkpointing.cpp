// policy/model/checkpointing.cpp: activation checkpointing of the training forward
// (CausalLMImpl::set_activation_checkpointing). A decoder layer's input comes from the layer
// below; the layer keeps only that input (with the shared RoPE tables and mask) and runs again in
// the backward pass, whose gradient goes on to the layer below and, through a nested backward
// pass, into the layer's parameters.
#include "policy/model/model.hpp"
#include "policy/model/model_detail.hpp"

#include <algorithm>

namespace crucible::policy {

namespace {

// The autograd context keeps IValues only: the layer goes into it as a capsule.
struct layer_holder final : torch::CustomClassHolder {
  explicit layer_holder(std::shared_ptr<DecoderLayerImpl> l) : layer(std::move(l)) {}
  std::shared_ptr<DecoderLayerImpl> layer;
};

// The layer's forward as both passes run it: under grad mode (the fused training kernels are
// chosen only then, so the forward and the recomputation run the same kernels and get the same
// numbers), on a detached copy of the input that requires grad exactly when the input did.
torch::Tensor run_layer(DecoderLayerImpl& layer, const torch::Tensor& input, bool input_grad, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask, torch::Tensor& leaf) {
  torch::AutoGradMode grad_mode(true);
  leaf = input.detach().requires_grad_(input_grad);
  return layer.forward(leaf, cos, sin, mask);
}

// Reentrant checkpointing, as torch.utils.checkpoint(use_reentrant=True) does it: the layer's
// parameters are not inputs of the function; the nested backward pass accumulates their gradients
// into .grad, and their post-accumulate hooks (data-parallel bucketing) fire there, once each.
// (As inputs they would get an edge from this node too, and AccumulateGrad calls those hooks
// even for the undefined gradient this node would return: twice per backward pass.)
// `anchor`, an empty leaf that requires grad, is given when the input does not require grad but
// the layer trains (the first layer under LoRA: the embeddings are frozen), so that the function
// still joins the graph; it gets no gradient.
struct checkpointed_layer_fn : torch::autograd::Function<checkpointed_layer_fn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, const std::optional<torch::Tensor>& mask,
                               const std::shared_ptr<DecoderLayerImpl>& layer,
                               const std::optional<torch::Tensor>& anchor) {
    (void) anchor;
    const auto m = mask.value_or(torch::Tensor{});
    torch::Tensor out;
    {
      torch::Tensor leaf;
      // The graph recorded here is dropped with `out`'s history at once; only `x` is kept.
      out = run_layer(*layer, x, x.requires_grad(), cos, sin, m, leaf).detach();
    }
    ctx->save_for_backward({x, cos, sin, m});
    ctx->saved_data["layer"] = c10::IValue::make_capsule(c10::make_intrusive<layer_holder>(layer));
    ctx->saved_data["input_grad"] = x.requires_grad();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<layer_holder>(ctx->saved_data["layer"].toCapsule());
    const bool input_grad = ctx->saved_data["input_grad"].toBool();
    torch::autograd::variable_list out(6); // x, cos, sin, mask, layer, anchor: x's only
    torch::Tensor leaf;
    auto y = run_layer(*holder->layer, saved[0], input_grad, saved[1], saved[2], saved[3], leaf);
    if (y.requires_grad() && grads[0].defined())
      torch::autograd::backward({y}, {grads[0]});
    if (input_grad)
      out[0] = leaf.grad();
    return out;
  }
};

} // namespace

torch::Tensor model_detail::checkpointed_layer(const std::shared_ptr<DecoderLayerImpl>& layer, const torch::Tensor& x,
                                               const torch::Tensor& cos, const torch::Tensor& sin,
                                               const torch::Tensor& mask) {
  std::optional<torch::Tensor> m, anchor;
  if (mask.defined())
    m = mask;
  if (!x.requires_grad()) {
    const auto params = layer->parameters();
    if (std::any_of(params.begin(), params.end(), [](const torch::Tensor& p) { return p.requires_grad(); }))
      anchor = torch::empty({0}, x.options().requires_grad(true));
  }
  return checkpointed_layer_fn::apply(x, cos, sin, m, layer, anchor);
}

} // namespace crucible::policy
