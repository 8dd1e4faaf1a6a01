// policy/training/checkpoint.hpp: a learner's state on disk and back, exactly. A learner's weights,
// optimiser moments, master weights, step, version and RNG state go into one directory written
// atomically; restoring it into a fresh learner of the same configuration continues the run as
// if it had never stopped.
//
// Layout of DIR:
//   model/              HF directory (config.json, *.safetensors) in the parameters' dtype, LoRA
//                       adapters merged: what an engine or transformers loads
//   optimizer.safetensors  "exp_avg.NAME", "exp_avg_sq.NAME" per trainable parameter (float32);
//                       "master.NAME" (float32 weights) when the model is not float32 or trains
//                       LoRA (model/ then does not hold them exactly); "rng.cpu" (and "rng.cuda"
//                       for a CUDA model): torch generator states. Under ZeRO-1 (learner.zero1)
//                       it holds only the generator states, and each data-parallel rank R of N
//                       writes its shard of the moments and masters to
//   optimizer.zero1-R.safetensors  data_parallel::shard_state() of rank R
//   manifest.json       format, version, steps, lora, dtype, the frozen base's SHA-256, and the
//                       size and SHA-256 of every other file; written last
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "policy/training/learner.hpp"

namespace crucible::policy {

/// What a checkpoint's manifest says about the learner it holds.
struct checkpoint_info {
  std::uint64_t version = 0;   ///< policy version of the weights
  std::int64_t steps = 0;      ///< optimiser updates applied (the schedule's position)
  std::int64_t moments_since = 0; ///< steps at the last reset of the moments (absent in older checkpoints: 0)
  std::int64_t sft_until = 0;       ///< learner::sft_until() (absent in older checkpoints: 0)
  std::int64_t reference_since = 0; ///< learner::reference_since(); > 0: reference.safetensors holds the KL reference
  bool lora = false;
  std::string dtype;           ///< "float32" or "bfloat16"
  std::string frozen_sha256;   ///< learner::frozen_digest() at save time ("" for full fine-tuning)
  std::int64_t zero1_ranks = 0; ///< data-parallel ranks whose optimiser shards it holds (0: not sharded)
};

/// Progress of a checkpoint's save, verification or load: (what is being done, bytes done, bytes
/// in all), e.g. ("checksumming", 3.2e9, 45e9). Called from several threads at once (checksums are
/// computed in parallel), so it must be thread-safe; progress_meter (core/progress.hpp) is.
using checkpoint_progress = std::function<void(std::string_view what, std::uint64_t done, std::uint64_t total)>;

/// Writes `l`'s state to `dir`, which must not exist: everything goes into a temporary sibling
/// directory (".NAME.tmp"), each file fsynced, then the directory is renamed to `dir` and its
/// parent fsynced. A crash leaves either no `dir` or a complete one. errc::invalid_arg if `dir`
/// exists; errc::io naming the path otherwise. In a data-parallel group every rank calls it
/// (collective) and all get the same outcome: rank 0 writes the model and manifest, and under
/// ZeRO-1 each rank its optimiser shard, so `dir` must be on a file system all ranks share.
/// `tokenizer_from` (a model directory) gives the tokenizer files written beside the weights in
/// `dir`/model (save_options::tokenizer_from), so that folder opens in transformers and in
/// `crucible generate` as it is; empty: weights and config.json only.
/// `progress`, if given, hears each phase (writing the model, the optimiser state, checksumming).
result<void> save_checkpoint(learner& l, const std::filesystem::path& dir,
                             const std::filesystem::path& tokenizer_from = {}, const checkpoint_progress& progress = {});

/// Reads `dir`'s manifest and checks every file it lists (present, size, SHA-256).
/// errc::not_found / errc::corrupt naming the file at fault.
result<checkpoint_info> verify_checkpoint(const std::filesystem::path& dir, const checkpoint_progress& progress = {});

/// Verifies `dir`, then restores it into `l` (created with the same options, and for LoRA from
/// the same base weights): weights, moments, masters, step count, version, RNG state. A
/// checkpoint that does not fit the learner (LoRA or not, dtype, base digest, parameter names or
/// shapes) is refused with errc::config or errc::corrupt before anything changes, except that a
/// full fine-tuning checkpoint's weights are checked and copied before the optimiser state.
/// In a data-parallel group every rank calls it; a ZeRO-1 checkpoint restores each rank's shard
/// and needs as many ranks as saved it (errc::config otherwise). Collective under ZeRO-1.
/// `progress` as for save_checkpoint (checking, reading the optimiser state, reading the weights).
result<checkpoint_info> load_checkpoint(learner& l, const std::filesystem::path& dir,
                                        const checkpoint_progress& progress = {});

} // namespace crucible::policy
