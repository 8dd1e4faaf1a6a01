#include "policy/distributed/weight_handoff.hpp"

#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include <c10/cuda/CUDAStream.h>
#endif

#include "policy/model/model.hpp"

namespace crucible::policy {

namespace {

// Waits until the work this thread queued on `device` is done (the copies of a stage or an
// install), so that the other thread finds the tensors complete once it holds the mutex.
void wait_for_copies([[maybe_unused]] const torch::Device& device) {
#ifdef CRUCIBLE_HAVE_CUDA
  if (device.is_cuda())
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
}

std::int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<std::int64_t>(t.element_size()); }

// The projections of one layer, learner's and engine's side by side, by their name prefix.
struct projection_pair {
  ProjectionImpl* learner = nullptr;
  ProjectionImpl* engine = nullptr;
};

std::map<std::string, projection_pair> projections_of(CausalLMImpl& learner, CausalLMImpl& engine) {
  std::map<std::string, projection_pair> out;
  const auto layers = learner.model->blocks.size();
  for (std::size_t i = 0; i < layers; ++i) {
    auto& lb = learner.model->blocks[i];
    auto& eb = engine.model->blocks[i];
    const auto prefix = "model.layers." + std::to_string(i) + ".";
    out[prefix + "self_attn.q_proj"] = {lb->self_attn->q_proj.get(), eb->self_attn->q_proj.get()};
    out[prefix + "self_attn.k_proj"] = {lb->self_attn->k_proj.get(), eb->self_attn->k_proj.get()};
    out[prefix + "self_attn.v_proj"] = {lb->self_attn->v_proj.get(), eb->self_attn->v_proj.get()};
    out[prefix + "self_attn.o_proj"] = {lb->self_attn->o_proj.get(), eb->self_attn->o_proj.get()};
    out[prefix + "mlp.gate_proj"] = {lb->mlp->gate_proj.get(), eb->mlp->gate_proj.get()};
    out[prefix + "mlp.up_proj"] = {lb->mlp->up_proj.get(), eb->mlp->up_proj.get()};
    out[prefix + "mlp.down_proj"] = {lb->mlp->down_proj.get(), eb->mlp->down_proj.get()};
  }
  if (learner.lm_head && engine.lm_head)
    out["lm_head"] = {learner.lm_head.get(), engine.lm_head.get()};
  return out;
}

// "model.layers.3.self_attn.q_proj.weight" -> "model.layers.3.self_attn.q_proj"; "" for names
// that are no projection's weight or bias.
std::string projection_of(const std::string& name, const std::map<std::string, projection_pair>& projections) {
  for (std::string_view suffix : {".weight", ".bias"})
    if (name.ends_with(suffix)) {
      auto prefix = name.substr(0, name.size() - suffix.size());
      if (projections.count(prefix) != 0)
        return prefix;
    }
  return {};
}

// The projections decoding runs as one GEMM over joined weights: they are shared or owned
// together. Maps each member's prefix to its group's first member.
std::string group_of(const std::string& projection) {
  const std::pair<std::string_view, std::string_view> members[] = {
    {"self_attn.q_proj", "self_attn.q_proj"}, {"self_attn.k_proj", "self_attn.q_proj"},
    {"self_attn.v_proj", "self_attn.q_proj"}, {"mlp.gate_proj", "mlp.gate_proj"}, {"mlp.up_proj", "mlp.gate_proj"}};
  for (const auto& [member, first] : members)
    if (projection.ends_with(member))
      return projection.substr(0, projection.size() - member.size()) + std::string{first};
  return projection;
}

} // namespace

// One tensor copied per version: `source` (the learner's tensor, or its adapter-merged weight)
// into `staging`, then `staging` into `target` (the engine's parameter).
struct staged_tensor {
  std::function<torch::Tensor()> source;
  torch::Tensor staging;
  torch::Tensor target;
};

struct weight_handoff::state {
  std::shared_ptr<CausalLMImpl> engine;
  torch::Device device = torch::kCPU;        // the learner's
  torch::Device engine_device = torch::kCPU; // the engine's, and the staging area's
  std::vector<staged_tensor> staged;
  handoff_stats stats;
  mutable std::mutex mutex;
  std::uint64_t staged_version = 0, installed_version = 0;
};

weight_handoff::weight_handoff(std::unique_ptr<state> s) : s_(std::move(s)) {}
weight_handoff::~weight_handoff() = default;

result<std::unique_ptr<weight_handoff>> weight_handoff::create(CausalLMImpl& learner_model,
                                                                const std::string& engine_dtype,
                                                                std::uint64_t version,
                                                                const std::string& engine_device) {
  auto dtype = parse_torch_dtype(engine_dtype);
  if (!dtype.ok())
    return fail(errc::config, "model.engine_dtype: ", dtype.error().message);
  auto learner_params = learner_model.named_parameters(true);
  if (learner_params.is_empty())
    return fail(errc::invalid_arg, "weight handoff: the learner's model has no parameters");
  torch::NoGradGuard no_grad;
  auto s = std::make_unique<state>();
  s->device = learner_params.begin()->value().device();
  s->engine_device = s->device;
  if (!engine_device.empty()) {
    try {
      s->engine_device = torch::Device(engine_device);
    } catch (const std::exception&) {
      return fail(errc::config, "engine.devices: '", engine_device, "' is not a device (cpu, cuda:N)");
    }
  }
  // On another device nothing can be shared: every tensor is the engine's own.
  const bool same_device = s->engine_device == s->device;
  // The architecture; its parameters are replaced one by one below (the constructor's are
  // uninitialised host memory, never touched).
  s->engine = std::make_shared<CausalLMImpl>(learner_model.config());
  auto& engine = *s->engine;
  auto projections = projections_of(learner_model, engine);

  // Which tensors change: adapters make their projection's weight change; trainable tensors change.
  std::set<std::string> adapted;   // projection prefixes with an adapter
  for (auto& [prefix, pair] : projections)
    if (pair.learner->has_lora())
      adapted.insert(prefix);
  // The weight of a projection with an adapter: the engine holds it merged.
  auto adapted_weight = [&](const std::string& name, const std::string& proj) {
    return !proj.empty() && adapted.count(proj) != 0 && name.ends_with(".weight");
  };
  auto changes = [&](const std::string& name, const torch::Tensor& t) {
    return adapted_weight(name, projection_of(name, projections)) || t.requires_grad();
  };
  // Groups (joined projections) with any member that cannot be shared are owned whole.
  std::set<std::string> owned_groups;
  for (auto& item : learner_params) {
    const auto& name = item.key();
    if (name.find(".lora_") != std::string::npos)
      continue;
    auto proj = projection_of(name, projections);
    if (proj.empty())
      continue;
    if (!same_device || changes(name, item.value()) || item.value().scalar_type() != *dtype)
      owned_groups.insert(group_of(proj));
  }

  std::map<std::string, std::function<torch::Tensor()>> sources; // the tensors staged per version
  for (auto& item : engine.named_parameters(true)) {
    const auto& name = item.key();
    auto* found = learner_params.find(name);
    if (found == nullptr)
      return fail(errc::invalid_arg, "weight handoff: the engine's ", name, " has no tensor of that name in the learner");
    const auto& from = *found;
    if (from.sizes() != item.value().sizes())
      return fail(errc::invalid_arg, "weight handoff: ", name, " has different shapes in the learner and the engine");
    auto param = item.value();
    param.set_requires_grad(false);
    auto proj = projection_of(name, projections);
    const bool in_owned_group = !proj.empty() && owned_groups.count(group_of(proj)) != 0;
    const bool changing = changes(name, from);
    if (same_device && !changing && !in_owned_group && from.scalar_type() == *dtype) {
      param.set_data(from.detach());
      s->stats.shared_bytes += bytes_of(from);
      ++s->stats.tensors_shared;
      continue;
    }
    std::function<torch::Tensor()> source;
    if (adapted_weight(name, proj)) {
      auto* learner_proj = projections.at(proj).learner;
      source = [learner_proj] { return learner_proj->merged_weight(); };
    } else {
      auto t = from.detach();
      source = [t] { return t; };
    }
    param.set_data(source().to(s->engine_device, *dtype, /*non_blocking=*/false, /*copy=*/true));
    s->stats.own_bytes += bytes_of(param);
    ++s->stats.tensors_own;
    if (changing)
      sources[name] = std::move(source);
  }
  // Own q/k/v and gate/up become one storage each, as a loaded engine's are (shared ones already
  // are the learner's joined storage).
  for (auto& block : engine.model->blocks) {
    block->self_attn->join_projections();
    block->mlp->join_projections();
  }
  engine.eval();
  // The staged tensors' targets, taken after the joins moved them.
  for (auto& item : engine.named_parameters(true)) {
    auto it = sources.find(item.key());
    if (it == sources.end())
      continue;
    staged_tensor st;
    st.source = std::move(it->second);
    st.target = item.value().detach();
    st.staging = torch::empty_like(st.target); // on the engine's device: a stage copies across
    st.staging.copy_(st.target);
    s->stats.staged_bytes += bytes_of(st.target);
    ++s->stats.tensors_staged;
    s->staged.push_back(std::move(st));
  }
  wait_for_copies(s->device);
  wait_for_copies(s->engine_device);
  s->staged_version = s->installed_version = version;
  return std::unique_ptr<weight_handoff>(new weight_handoff(std::move(s)));
}

std::shared_ptr<CausalLMImpl> weight_handoff::engine_model() const { return s_->engine; }

result<void> weight_handoff::stage(std::uint64_t version) {
  std::lock_guard lock(s_->mutex);
  if (version < s_->staged_version)
    return fail(errc::invalid_arg, "weight handoff: version ", std::to_string(version), " is older than the version staged (",
                std::to_string(s_->staged_version), ")");
  torch::NoGradGuard no_grad;
  // Across devices the copy runs on the learner's stream, after its update, and is complete on the
  // engine's device before the mutex is let go.
  for (auto& t : s_->staged)
    t.staging.copy_(t.source());
  wait_for_copies(s_->device);
  wait_for_copies(s_->engine_device);
  s_->staged_version = version;
  return {};
}

result<std::uint64_t> weight_handoff::install() {
  std::lock_guard lock(s_->mutex);
  if (s_->installed_version == s_->staged_version)
    return s_->installed_version;
  torch::NoGradGuard no_grad;
  // On the engine's device alone: an install never waits for the learner's GPU.
  for (auto& t : s_->staged)
    t.target.copy_(t.staging);
  wait_for_copies(s_->engine_device);
  s_->installed_version = s_->staged_version;
  return s_->installed_version;
}

std::uint64_t weight_handoff::staged_version() const {
  std::lock_guard lock(s_->mutex);
  return s_->staged_version;
}

std::uint64_t weight_handoff::installed_version() const {
  std::lock_guard lock(s_->mutex);
  return s_->installed_version;
}

const handoff_stats& weight_handoff::stats() const noexcept { return s_->stats; }

} // namespace crucible::policy
