// policy/training/checkpoint.cpp: learner state to a directory (temporary sibling, fsync, rename)
// and back, every file checked against the manifest's SHA-256 before anything is restored.
#include "policy/training/checkpoint.hpp"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "policy/model/safetensors.hpp"

namespace crucible::policy {

namespace fs = std::filesystem;

namespace {

constexpr const char* format_name = "crucible-learner-checkpoint";
constexpr std::int64_t format_version = 1;

std::string hex(const std::array<std::uint8_t, 32>& digest) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : digest) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

struct file_digest {
  std::uint64_t bytes = 0;
  std::string sha256;
};

// Streams the file through SHA-256 (weights can be larger than one would read into memory);
// `read` hears each chunk's size.
result<file_digest> digest_file(const fs::path& path, const std::function<void(std::uint64_t)>& read) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec))
      return fail(errc::not_found, path.string(), ": missing from the checkpoint");
    return fail(errc::io, path.string(), ": cannot read");
  }
  crucible::sha256 h;
  file_digest d;
  std::vector<char> buf(4 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = in.gcount();
    h.update(buf.data(), static_cast<std::size_t>(n));
    d.bytes += static_cast<std::uint64_t>(n);
    read(static_cast<std::uint64_t>(n));
  }
  if (in.bad())
    return fail(errc::io, path.string(), ": read error");
  d.sha256 = hex(h.finish());
  return d;
}

// The digests of `files` (relative to `root`), in their order, several files at a time: a
// checkpoint's model shards and optimiser file are checksummed on as many cores as there are files
// (up to 8). `progress` hears (what, bytes read, the files' sizes).
std::vector<result<file_digest>> digest_files(const fs::path& root, const std::vector<fs::path>& files,
                                              const checkpoint_progress& progress, std::string_view what) {
  std::vector<std::optional<result<file_digest>>> out(files.size());
  std::atomic<std::size_t> next{0};
  std::uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto n = fs::file_size(root / f, ec);
    total += ec ? 0 : n;
  }
  std::atomic<std::uint64_t> done{0};
  auto read = [&](std::uint64_t n) {
    const auto now = done += n;
    if (progress)
      progress(what, now, std::max(now, total));
  };
  auto work = [&] {
    for (std::size_t i = next++; i < files.size(); i = next++)
      out[i].emplace(digest_file(root / files[i], read));
  };
  const std::size_t threads =
    std::min<std::size_t>({files.size(), std::max(1u, std::thread::hardware_concurrency()), 8});
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t)
    pool.emplace_back(work);
  work();
  for (auto& t : pool)
    t.join();
  std::vector<result<file_digest>> digests;
  digests.reserve(files.size());
  for (auto& d : out)
    digests.push_back(std::move(*d));
  return digests;
}

bool with_masters(const learner& l) { return l.options().lora || l.options().dtype != "float32"; }

std::string dtype_of(learner& l) { return torch_dtype_name(l.parameters().front().param.scalar_type()); }

} // namespace

namespace {

fs::path parent_of(const fs::path& dir) { return dir.parent_path().empty() ? fs::path{"."} : dir.parent_path(); }
fs::path tmp_of(const fs::path& dir) { return parent_of(dir) / ("." + dir.filename().string() + ".tmp"); }
fs::path shard_file(int rank) { return "optimizer.zero1-" + std::to_string(rank) + ".safetensors"; }

// A fresh temporary directory beside `dir`, which must not exist.
result<void> prepare(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec))
    return fail(errc::invalid_arg, dir.string(), ": a checkpoint directory already exists there");
  const auto parent = parent_of(dir);
  fs::create_directories(parent, ec);
  if (ec)
    return fail(errc::io, "cannot create ", parent.string(), ": ", ec.message());
  const auto tmp = tmp_of(dir);
  fs::remove_all(tmp, ec); // a previous attempt that crashed
  if (!fs::create_directory(tmp, ec) || ec)
    return fail(errc::io, "cannot create ", tmp.string(), ": ", ec.message());
  return {};
}

// The model, the optimiser file and the manifest into the temporary directory, then the rename.
result<void> finish(learner& l, const fs::path& dir, std::int64_t zero1_ranks, const fs::path& tokenizer_from,
                    const checkpoint_progress& progress) {
  std::error_code ec;
  const auto parent = parent_of(dir);
  const auto tmp = tmp_of(dir);
  auto& model = l.model();
  save_options so;
  so.dtype = l.parameters().front().param.scalar_type();
  so.tokenizer_from = tokenizer_from;
  // The phases that write whole files are said at their start and end.
  auto phase = [&](std::string_view what, std::uint64_t bytes, bool done) {
    if (progress)
      progress(what, done ? bytes : 0, bytes);
  };
  std::uint64_t model_bytes = 0;
  for (const auto& p : model.parameters())
    model_bytes += static_cast<std::uint64_t>(p.numel()) * static_cast<std::uint64_t>(c10::elementSize(so.dtype));
  phase("writing the model", model_bytes, false);
  if (auto r = save_model(model, tmp / "model", so); !r)
    return r.error();
  phase("writing the model", model_bytes, true);

  std::vector<std::pair<std::string, torch::Tensor>> tensors = l.optimizer().moments();
  if (with_masters(l) && zero1_ranks == 0) {
    const auto& params = l.parameters();
    const auto& masters = l.optimizer().masters();
    for (std::size_t i = 0; i < params.size(); ++i)
      tensors.emplace_back("master." + params[i].name, masters[i]);
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator(); // a handle sharing the global state
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back("rng.cpu", gen.get_state());
  }
  const auto device = l.parameters().front().param.device();
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back("rng.cuda", gen.get_state());
  }
  std::uint64_t optimizer_bytes = 0;
  for (const auto& [name, t] : tensors)
    optimizer_bytes += static_cast<std::uint64_t>(t.nbytes());
  phase("writing the optimiser state", optimizer_bytes, false);
  if (auto r = save_tensors(tmp / "optimizer.safetensors", tensors); !r)
    return r.error();
  phase("writing the optimiser state", optimizer_bytes, true);
  // A KL reference taken from the policy (after SFT) exists nowhere else.
  if (l.reference() != nullptr && l.reference_since() > 0) {
    std::vector<std::pair<std::string, torch::Tensor>> ref;
    for (const auto& item : l.reference()->named_parameters(true))
      ref.emplace_back(item.key(), item.value().detach());
    if (auto r = save_tensors(tmp / "reference.safetensors", ref); !r)
      return r.error();
  }

  // The manifest lists every file written so far, with its checksum.
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(tmp, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file())
      files.push_back(fs::relative(it->path(), tmp));
  if (ec)
    return fail(errc::io, "cannot list ", tmp.string(), ": ", ec.message());
  std::sort(files.begin(), files.end());
  json_writer w;
  w.begin_object()
    .field("format", format_name)
    .field("format_version", format_version)
    .field("version", l.version())
    .field("steps", l.steps())
    .field("moments_since", l.optimizer().moments_since())
    .field("sft_until", l.sft_until())
    .field("reference_since", l.reference() != nullptr ? l.reference_since() : 0)
    .field("lora", l.options().lora)
    .field("dtype", dtype_of(l))
    .field("frozen_sha256", l.frozen_digest())
    .field("zero1_ranks", zero1_ranks);
  w.key("files").begin_array();
  const auto digests = digest_files(tmp, files, progress, "checksumming");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const auto& d = digests[i];
    if (!d)
      return d.error();
    w.begin_object().field("path", files[i].generic_string()).field("bytes", d->bytes).field("sha256", d->sha256).end_object();
  }
  w.end_array().end_object();
  if (auto r = write_file_atomic(tmp / "manifest.json", std::move(w).take() + "\n"); !r)
    return r;
  if (auto r = fsync_directory(tmp / "model"); !r)
    return r;
  if (auto r = fsync_directory(tmp); !r)
    return r;
  fs::rename(tmp, dir, ec);
  if (ec)
    return fail(errc::io, "cannot rename ", tmp.string(), " to ", dir.string(), ": ", ec.message());
  return fsync_directory(parent);
}

// Data parallel: every rank learns whether the phase succeeded everywhere. `mine` is this rank's
// outcome; the others' failures come back as one error naming the phase.
result<void> agree(data_parallel& dp, result<void> mine, const std::string& phase) {
  double failed[1] = {mine ? 0.0 : 1.0};
  if (auto r = dp.all_reduce(failed, reduce_op::sum); !r)
    return r;
  if (!mine)
    return mine;
  if (failed[0] > 0)
    return fail(errc::io, phase, ": ", std::to_string(static_cast<long long>(failed[0])),
                " other data-parallel rank(s) failed (their errors say why)");
  return {};
}

} // namespace

result<void> save_checkpoint(learner& l, const fs::path& dir, const fs::path& tokenizer_from,
                             const checkpoint_progress& progress) {
  auto* dp = l.data_parallel_state();
  if (dp == nullptr) {
    if (auto r = prepare(dir); !r)
      return r;
    return finish(l, dir, 0, tokenizer_from, progress);
  }
  const int rank = dp->comm().rank();
  const std::string what = "checkpoint " + dir.string();
  if (auto r = agree(*dp, rank == 0 ? prepare(dir) : result<void>{}, what); !r)
    return r;
  if (dp->sharded()) {
    result<void> mine = save_tensors(tmp_of(dir) / shard_file(rank), dp->shard_state());
    if (auto r = agree(*dp, std::move(mine), what); !r)
      return r;
  }
  return agree(*dp,
               rank == 0 ? finish(l, dir, dp->sharded() ? dp->comm().size() : 0, tokenizer_from, progress)
                         : result<void>{},
               what);
}

result<checkpoint_info> verify_checkpoint(const fs::path& dir, const checkpoint_progress& progress) {
  const auto manifest_path = dir / "manifest.json";
  auto doc = read_json_file(manifest_path);
  if (!doc)
    return doc.error().code == errc::not_found
               ? fail(errc::not_found, manifest_path.string(), ": missing (not a checkpoint, or an unfinished one)")
               : doc.error();
  const auto origin = manifest_path.string();
  auto field = [&](const char* key, json_value::kind kind) -> result<const json_value*> {
    const auto* v = doc->find(key);
    if (v == nullptr || (v->type() != kind && !(kind == json_value::kind::real && v->is_number())))
      return fail(errc::corrupt, origin, ": ", key, ": missing or not a ", json_value::kind_name(kind));
    return v;
  };
  auto format = field("format", json_value::kind::string);
  if (!format)
    return format.error();
  if ((*format)->as_string() != format_name)
    return fail(errc::corrupt, origin, ": format: \"", (*format)->as_string(), "\" is not ", format_name);
  auto fv = field("format_version", json_value::kind::integer);
  if (!fv)
    return fv.error();
  if ((*fv)->as_int() != format_version)
    return fail(errc::unsupported, origin, ": format_version ", std::to_string((*fv)->as_int()),
                " (this build reads ", std::to_string(format_version), ")");
  checkpoint_info info;
  auto version = field("version", json_value::kind::integer);
  auto steps = field("steps", json_value::kind::integer);
  auto lora = field("lora", json_value::kind::boolean);
  auto dtype = field("dtype", json_value::kind::string);
  auto frozen = field("frozen_sha256", json_value::kind::string);
  auto files = field("files", json_value::kind::array);
  for (const auto* r : {&version, &steps, &lora, &dtype, &frozen, &files})
    if (!*r)
      return r->error();
  if ((*version)->as_int() < 0 || (*steps)->as_int() < 0)
    return fail(errc::corrupt, origin, ": negative version or steps");
  info.version = static_cast<std::uint64_t>((*version)->as_int());
  info.steps = (*steps)->as_int();
  if (const auto* ms = doc->find("moments_since"); ms != nullptr) {
    if (!ms->is_int() || ms->as_int() < 0 || ms->as_int() > info.steps)
      return fail(errc::corrupt, origin, ": moments_since must be an integer between 0 and steps");
    info.moments_since = ms->as_int();
  }
  for (auto [key, out] : {std::pair{"sft_until", &info.sft_until}, std::pair{"reference_since", &info.reference_since}})
    if (const auto* v = doc->find(key); v != nullptr) {
      if (!v->is_int() || v->as_int() < 0 || v->as_int() > info.steps)
        return fail(errc::corrupt, origin, ": ", key, " must be an integer between 0 and steps");
      *out = v->as_int();
    }
  info.lora = (*lora)->as_bool();
  info.dtype = (*dtype)->as_string();
  info.frozen_sha256 = (*frozen)->as_string();
  if (const auto* z = doc->find("zero1_ranks"); z != nullptr) {
    if (!z->is_int() || z->as_int() < 0)
      return fail(errc::corrupt, origin, ": zero1_ranks: not a non-negative integer");
    info.zero1_ranks = z->as_int();
  }

  bool has_optimizer = false, has_model = false;
  std::set<std::string> listed;
  struct listed_file {
    std::int64_t bytes;
    std::string sha256;
  };
  std::vector<fs::path> rels; // digested together, then checked in the manifest's order
  std::vector<listed_file> entries;
  for (const auto& entry : (*files)->as_array()) {
    const auto* path = entry.find("path");
    const auto* bytes = entry.find("bytes");
    const auto* sha = entry.find("sha256");
    if (path == nullptr || !path->is_string() || bytes == nullptr || !bytes->is_int() || sha == nullptr ||
        !sha->is_string())
      return fail(errc::corrupt, origin, ": files: an entry lacks path, bytes or sha256");
    const fs::path rel = fs::path(path->as_string()).lexically_normal();
    if (rel.is_absolute() || rel.empty() || *rel.begin() == "..")
      return fail(errc::corrupt, origin, ": files: path \"", path->as_string(), "\" leaves the checkpoint");
    rels.push_back(rel);
    entries.push_back({bytes->as_int(), sha->as_string()});
  }
  const auto digests = digest_files(dir, rels, progress, "checking");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& rel = rels[i];
    const auto& [bytes, sha] = entries[i];
    const auto file = dir / rel;
    const auto& d = digests[i];
    if (!d)
      return d.error();
    if (static_cast<std::int64_t>(d->bytes) != bytes)
      return fail(errc::corrupt, file.string(), ": ", std::to_string(d->bytes), " bytes, the manifest says ",
                  std::to_string(bytes), " (truncated or damaged)");
    if (d->sha256 != sha)
      return fail(errc::corrupt, file.string(), ": SHA-256 differs from the manifest's (damaged)");
    has_optimizer = has_optimizer || rel == "optimizer.safetensors";
    listed.insert(rel.generic_string());
    has_model = has_model || rel == "model/config.json";
  }
  if (info.reference_since > 0 && listed.count("reference.safetensors") == 0)
    return fail(errc::corrupt, origin, ": files: reference.safetensors is not listed (reference_since is ",
                std::to_string(info.reference_since), ")");
  if (!has_optimizer || !has_model)
    return fail(errc::corrupt, origin, ": files: ", has_model ? "optimizer.safetensors" : "model/config.json",
                " is not listed");
  for (std::int64_t r = 0; r < info.zero1_ranks; ++r)
    if (listed.count(shard_file(static_cast<int>(r)).generic_string()) == 0)
      return fail(errc::corrupt, origin, ": files: ", shard_file(static_cast<int>(r)).string(),
                  " is not listed (the checkpoint holds ", std::to_string(info.zero1_ranks), " ZeRO-1 shards)");
  return info;
}

result<checkpoint_info> load_checkpoint(learner& l, const fs::path& dir, const checkpoint_progress& progress) {
  auto info = verify_checkpoint(dir, progress);
  if (!info)
    return info.error();
  const auto origin = (dir / "manifest.json").string();
  if (info->lora != l.options().lora)
    return fail(errc::config, origin, ": the checkpoint ", info->lora ? "trains LoRA adapters" : "fine-tunes all weights",
                " but learner.lora is ", l.options().lora ? "true" : "false");
  if (info->dtype != dtype_of(l))
    return fail(errc::config, origin, ": the checkpoint's dtype is ", info->dtype, " but the learner's is ", dtype_of(l),
                " (learner.dtype)");
  if (info->frozen_sha256 != l.frozen_digest())
    return fail(errc::config, origin, ": the learner's frozen base weights differ from the ones the checkpoint's "
                                      "adapters were trained on");

  auto* dp = l.data_parallel_state();
  const bool sharded = dp != nullptr && dp->sharded();
  if (sharded != (info->zero1_ranks > 0))
    return fail(errc::config, origin, ": the checkpoint's optimiser state is ",
                info->zero1_ranks > 0 ? "sharded over " + std::to_string(info->zero1_ranks) + " ranks" : "not sharded",
                " but learner.zero1 is ", sharded ? "true" : "false");
  if (sharded && info->zero1_ranks != dp->comm().size())
    return fail(errc::config, origin, ": the checkpoint holds ", std::to_string(info->zero1_ranks),
                " ZeRO-1 shards but the data-parallel group has ", std::to_string(dp->comm().size()),
                " ranks (resume with as many learners)");
  auto read_all = [](const fs::path& path) -> result<std::map<std::string, torch::Tensor>> {
    auto file = safetensors_file::open(path);
    if (!file)
      return file.error();
    std::map<std::string, torch::Tensor> out;
    for (const auto& view : file->tensors())
      out.emplace(view.name, to_tensor(view));
    return out;
  };
  // The phases that read whole files are said at their start and end.
  auto phase = [&](std::string_view what, const fs::path& path, bool done) {
    if (!progress)
      return;
    std::error_code ec;
    std::uint64_t bytes = 0;
    if (fs::is_directory(path, ec)) {
      for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_regular_file(ec))
          bytes += it->file_size(ec);
    } else {
      bytes = fs::file_size(path, ec);
    }
    progress(what, done ? bytes : 0, bytes);
  };
  const auto opt_path = dir / "optimizer.safetensors";
  phase("reading the optimiser state", opt_path, false);
  auto opt = read_all(opt_path);
  if (!opt)
    return opt.error();
  phase("reading the optimiser state", opt_path, true);
  auto& tensors = *opt;
  const bool masters = with_masters(l);
  std::map<std::string, torch::Tensor> shard;
  const auto shard_path = sharded ? dir / shard_file(dp->comm().rank()) : fs::path{};
  if (sharded) {
    auto s = read_all(shard_path);
    if (!s)
      return s.error();
    shard = std::move(*s);
  } else if (auto r = l.optimizer().check_state(tensors, masters, opt_path.string()); !r) {
    return r.error();
  }
  const auto device = l.parameters().front().param.device();
  for (const char* key : {"rng.cpu", device.is_cuda() ? "rng.cuda" : nullptr}) {
    if (key == nullptr)
      continue;
    auto it = tensors.find(key);
    if (it == tensors.end() || it->second.scalar_type() != torch::kByte)
      return fail(errc::corrupt, opt_path.string(), ": missing generator state ", key);
  }

  if (!info->lora) {
    // The weights themselves (for float32 models the optimiser keeps no other copy).
    phase("reading the weights", dir / "model", false);
    auto weights = safetensors_checkpoint::open(dir / "model");
    if (!weights)
      return weights.error();
    if (auto r = load_weights(l.model(), *weights, /*check_finite=*/false); !r)
      return r.error();
    phase("reading the weights", dir / "model", true);
  }
  if (sharded) {
    // Collective: the restored masters are all-gathered into every rank's parameters.
    if (auto r = dp->restore_shard(shard, shard_path.string()); !r)
      return r.error();
    l.optimizer().set_steps(info->steps);
  } else if (auto r = l.optimizer().restore(tensors, info->steps, masters, opt_path.string()); !r) {
    return r.error();
  }
  l.optimizer().set_moments_since(info->moments_since);
  l.set_reference_state(info->sft_until, info->reference_since);
  if (l.reference() != nullptr && info->reference_since > 0) {
    const auto ref_path = dir / "reference.safetensors";
    auto ref = read_all(ref_path);
    if (!ref)
      return ref.error();
    torch::NoGradGuard no_grad;
    for (auto& item : l.reference()->named_parameters(true)) {
      auto it = ref->find(item.key());
      if (it == ref->end() || it->second.sizes() != item.value().sizes())
        return fail(errc::corrupt, ref_path.string(), ": ", item.key(), " is missing or of another shape");
      item.value().copy_(it->second);
    }
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(tensors.at("rng.cpu"));
  }
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(tensors.at("rng.cuda"));
  }
  l.set_version(info->version);
  return info;
}

} // namespace crucible::policy
