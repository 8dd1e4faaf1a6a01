// policy/distributed/weight_sync.cpp: header, manifest check and bucketed broadcast of weights from
// the learner's rank to the engines; storage sharing for an engine on the learner's device.
#include "policy/distributed/weight_sync.hpp"

#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

#include <torch/cuda.h>

namespace crucible::policy {

namespace {

constexpr std::int64_t magic = 0x63727563'77737931; // "crucwsy1"

std::string shape_text(torch::IntArrayRef sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i)
    s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// One line per tensor: name, dtype, shape.
std::string manifest_of(const std::vector<named_parameter>& tensors) {
  std::string m;
  for (const auto& t : tensors)
    m += t.name + "\t" + c10::toString(t.param.scalar_type()) + "\t" + shape_text(t.param.sizes()) + "\n";
  return m;
}

struct manifest_entry {
  std::string name, dtype, shape;
};

std::vector<manifest_entry> parse_manifest(const std::string& m) {
  std::vector<manifest_entry> out;
  std::istringstream in(m);
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find('\t'), b = line.find('\t', a + 1);
    if (a == std::string::npos || b == std::string::npos)
      continue;
    out.push_back({line.substr(0, a), line.substr(a + 1, b - a - 1), line.substr(b + 1)});
  }
  return out;
}

// "" when this rank's tensors match the root's manifest, else the first difference.
std::string compare(const std::vector<manifest_entry>& root, const std::vector<named_parameter>& mine) {
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < mine.size(); ++i)
    index[mine[i].name] = i;
  for (std::size_t i = 0; i < root.size(); ++i) {
    const auto& r = root[i];
    auto it = index.find(r.name);
    if (it == index.end())
      return "the learner sends " + r.name + " (" + r.dtype + " " + r.shape + "), which this engine does not have";
    const auto& t = mine[it->second].param;
    const std::string dtype = c10::toString(t.scalar_type()), shape = shape_text(t.sizes());
    if (dtype != r.dtype || shape != r.shape)
      return "tensor " + r.name + " is " + r.dtype + " " + r.shape + " on the learner but " + dtype + " " + shape +
             " on this engine";
    if (it->second != i)
      return "tensor " + r.name + " is number " + std::to_string(i) + " on the learner but " +
             std::to_string(it->second) + " on this engine (different tensor order)";
  }
  if (mine.size() != root.size()) {
    std::map<std::string, bool> sent;
    for (const auto& r : root)
      sent[r.name] = true;
    for (const auto& t : mine)
      if (!sent.count(t.name))
        return "this engine has " + t.name + ", which the learner does not send";
  }
  return {};
}

struct sync_bucket {
  std::vector<std::size_t> tensors;
  std::int64_t numel = 0;
  torch::ScalarType dtype = torch::kFloat;
  bool direct = false; // one tensor at least a bucket large: broadcast in place, no staging copy
};

std::vector<sync_bucket> plan(const std::vector<named_parameter>& tensors, std::int64_t bucket_bytes) {
  std::vector<sync_bucket> out;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i].param;
    const auto nbytes = static_cast<std::int64_t>(t.nbytes());
    if (nbytes >= bucket_bytes) {
      out.push_back({{i}, t.numel(), t.scalar_type(), true});
      bytes = bucket_bytes; // close the bucket before it too
      continue;
    }
    if (out.empty() || out.back().direct || out.back().dtype != t.scalar_type() || bytes + nbytes > bucket_bytes) {
      out.push_back({{}, 0, t.scalar_type(), false});
      bytes = 0;
    }
    out.back().tensors.push_back(i);
    out.back().numel += t.numel();
    bytes += nbytes;
  }
  return out;
}

} // namespace

std::vector<named_parameter> sync_tensors(CausalLMImpl& model, bool adapters_only) {
  std::vector<named_parameter> out;
  for (const auto& item : model.named_parameters(true))
    if (!adapters_only || item.value().requires_grad())
      out.push_back({item.key(), item.value()});
  return out;
}

weight_sync::weight_sync(std::shared_ptr<communicator> comm, std::vector<named_parameter> tensors,
                         const weight_sync_options& options)
  : comm_(std::move(comm)), tensors_(std::move(tensors)), options_(options), manifest_(manifest_of(tensors_)) {}

result<std::unique_ptr<weight_sync>> weight_sync::create(std::shared_ptr<communicator> comm,
                                                         std::vector<named_parameter> tensors,
                                                         const weight_sync_options& options) {
  if (!comm)
    return fail(errc::invalid_arg, "weight_sync: no communicator");
  if (options.root < 0 || options.root >= comm->size())
    return fail(errc::invalid_arg, "weight_sync: root ", std::to_string(options.root), " is not a rank of ",
                std::to_string(comm->size()));
  if (options.bucket_bytes <= 0)
    return fail(errc::config, "learner.sync_bucket_mb: must be positive");
  for (const auto& t : tensors)
    if (!t.param.defined() || t.param.device() != comm->device() || !t.param.is_contiguous())
      return fail(errc::invalid_arg, "weight_sync: tensor ", t.name, " must be contiguous and on ",
                  comm->device().str());
  return std::unique_ptr<weight_sync>(new weight_sync(std::move(comm), std::move(tensors), options));
}

result<weight_sync_stats> weight_sync::send(std::uint64_t version) {
  if (!is_root())
    return fail(errc::invalid_arg, "weight_sync::send: rank ", std::to_string(comm_->rank()),
                " is an engine; the learner is rank ", std::to_string(options_.root));
  return run(version);
}

result<weight_sync_stats> weight_sync::receive() {
  if (is_root())
    return fail(errc::invalid_arg, "weight_sync::receive: rank ", std::to_string(comm_->rank()),
                " is the learner (the root)");
  return run(0);
}

result<weight_sync_stats> weight_sync::run(std::uint64_t version) {
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  const bool root = is_root();
  const auto device = comm_->device();
  const auto on = [&](torch::ScalarType t) { return torch::TensorOptions().dtype(t).device(device); };
  auto blocking = [](result<work> w) -> result<void> {
    if (!w)
      return w.error();
    return w->wait();
  };

  // Header: what comes next.
  const std::vector<std::int64_t> fields{magic, static_cast<std::int64_t>(version),
                                         static_cast<std::int64_t>(manifest_.size()), options_.bucket_bytes};
  auto header = torch::tensor(fields, torch::kLong).to(device);
  if (auto r = blocking(comm_->broadcast(header, options_.root)); !r)
    return r.error();
  auto h = header.cpu();
  auto ha = h.accessor<std::int64_t, 1>();
  if (ha[0] != magic)
    return fail(errc::protocol, "weight_sync: the root's header is not a weight sync's (the ranks' collectives are "
                                "out of step)");
  weight_sync_stats stats;
  stats.version = static_cast<std::uint64_t>(ha[1]);
  const auto bucket_bytes = ha[3];

  // The root's manifest, checked by every engine; one reduction decides for all.
  auto m = torch::zeros({std::max<std::int64_t>(ha[2], 1)}, torch::kByte);
  if (root)
    std::memcpy(m.data_ptr(), manifest_.data(), manifest_.size());
  m = m.to(device);
  if (auto r = blocking(comm_->broadcast(m, options_.root)); !r)
    return r.error();
  std::string problem;
  if (!root) {
    auto host = m.cpu();
    const std::string text(static_cast<const char*>(host.data_ptr()), static_cast<std::size_t>(ha[2]));
    problem = compare(parse_manifest(text), tensors_);
  }
  double refused[1] = {problem.empty() ? 0.0 : 1.0};
  if (auto r = all_reduce_host(*comm_, refused, reduce_op::sum); !r)
    return r.error();
  if (!problem.empty())
    return fail(errc::invalid_arg, "weight sync (engine rank ", std::to_string(comm_->rank()), ", version ",
                std::to_string(stats.version), "): ", problem);
  if (refused[0] > 0)
    return fail(errc::invalid_arg, "weight sync (rank ", std::to_string(comm_->rank()), ", version ",
                std::to_string(stats.version), "): ", std::to_string(static_cast<long long>(refused[0])),
                " engine rank(s) refused the learner's tensors (names, dtypes or shapes differ; their errors say which)");

  // The tensors, two buckets in flight: one on the wire while the previous one is unpacked.
  struct in_flight {
    const sync_bucket* bucket;
    torch::Tensor staging;
    work w;
  };
  const auto buckets = plan(tensors_, bucket_bytes);
  std::vector<in_flight> q;
  auto land = [&](in_flight& f) -> result<void> {
    if (auto r = f.w.wait(); !r)
      return r;
    if (root || f.bucket->direct)
      return {};
    std::int64_t off = 0;
    for (auto i : f.bucket->tensors) {
      auto& t = tensors_[i].param;
      t.view(-1).copy_(f.staging.narrow(0, off, t.numel()));
      off += t.numel();
    }
    return {};
  };
  for (const auto& b : buckets) {
    in_flight f{&b, {}, {}};
    torch::Tensor payload;
    if (b.direct) {
      payload = tensors_[b.tensors.front()].param.view(-1);
    } else {
      f.staging = torch::empty({b.numel}, on(b.dtype));
      if (root) {
        std::int64_t off = 0;
        for (auto i : b.tensors) {
          const auto& t = tensors_[i].param;
          f.staging.narrow(0, off, t.numel()).copy_(t.view(-1));
          off += t.numel();
        }
      }
      payload = f.staging;
    }
    auto w = comm_->broadcast(payload, options_.root);
    if (!w)
      return w.error();
    f.w = *w;
    for (auto i : b.tensors)
      stats.bytes += static_cast<std::int64_t>(tensors_[i].param.nbytes());
    ++stats.buckets;
    q.push_back(std::move(f));
    if (q.size() == 2) {
      if (auto r = land(q.front()); !r)
        return r.error();
      q.erase(q.begin());
    }
  }
  for (auto& f : q)
    if (auto r = land(f); !r)
      return r.error();
  if (device.is_cuda())
    torch::cuda::synchronize(device.index());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

result<void> share_weights(std::span<const named_parameter> source, CausalLMImpl& engine_model) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& s : source)
    by_name[s.name] = &s.param;
  auto params = engine_model.named_parameters(true);
  // Every check before any change.
  for (const auto& item : params) {
    auto it = by_name.find(item.key());
    if (it == by_name.end())
      return fail(errc::invalid_arg, "share_weights: the engine's ", item.key(), " has no tensor of that name in the learner");
    const auto& s = *it->second;
    const auto& e = item.value();
    if (s.sizes() != e.sizes() || s.scalar_type() != e.scalar_type() || s.device() != e.device())
      return fail(errc::invalid_arg, "share_weights: ", item.key(), " is ", c10::toString(s.scalar_type()), " ",
                  shape_text(s.sizes()), " on ", s.device().str(), " in the learner but ",
                  c10::toString(e.scalar_type()), " ", shape_text(e.sizes()), " on ", e.device().str(), " in the engine");
  }
  torch::NoGradGuard no_grad;
  for (auto& item : params) {
    auto p = item.value();
    p.set_data(by_name.at(item.key())->detach());
  }
  return {};
}

} // namespace crucible::policy
