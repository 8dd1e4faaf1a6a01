// policy/model/safetensors.hpp: safetensors files and Hugging Face checkpoint directories, read by
// memory map and written atomically, with no torch types (model.cpp converts to tensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp" // write_file_atomic, read_file: small files of a model directory

namespace crucible::policy {

/// Element types of the safetensors format that crucible reads and writes.
enum class st_dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

/// The format's name of a dtype: "F32", "BF16", "BOOL", ...
const char* to_string(st_dtype d) noexcept;
/// Bytes per element.
std::size_t dtype_size(st_dtype d) noexcept;
/// Parses the format's name ("F32"); errc::unsupported naming it otherwise.
result<st_dtype> parse_st_dtype(std::string_view name);

/// One tensor: its name, element type, shape and bytes (row-major, little-endian). The bytes
/// are borrowed: from a file mapping (reader) or from the caller (writer).
struct tensor_view {
  std::string name;
  st_dtype dtype = st_dtype::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;

  /// Product of the shape (1 for a scalar).
  std::int64_t numel() const noexcept;
};

/// A memory-mapped .safetensors file, validated when opened: header length, JSON, dtypes,
/// shapes against byte ranges, ranges inside the file, neither overlapping nor leaving gaps.
/// A file that fails any check is refused whole. Move-only; the views it hands out stay valid
/// while any copy of the mapping lives (tensor_view does not own it: keep the file open).
/// Reading is thread-safe.
class safetensors_file final {
public:
  /// Opens and validates `path`. errc::not_found if missing, errc::io if unreadable,
  /// errc::corrupt (naming the file and the tensor or field) if malformed or truncated.
  static result<safetensors_file> open(const std::filesystem::path& path);

  safetensors_file(safetensors_file&&) noexcept = default;
  safetensors_file& operator=(safetensors_file&&) noexcept = default;
  ~safetensors_file();

  /// Tensors in the order of their data offsets.
  const std::vector<tensor_view>& tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const tensor_view* find(std::string_view name) const noexcept;
  /// The header's "__metadata__" (string to string), empty when absent.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::filesystem::path& path() const noexcept { return path_; }

private:
  struct mapping;
  safetensors_file() = default;
  std::filesystem::path path_;
  std::shared_ptr<const mapping> map_;
  std::vector<tensor_view> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

/// A Hugging Face weights directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (the single file wins when both exist, as in
/// transformers). Every shard is opened and validated up front; a tensor the index names but
/// its shard lacks, or a tensor in two shards, refuses the directory. Move-only; thread-safe
/// for reading.
class safetensors_checkpoint final {
public:
  /// Opens the weights in `dir`. errc::not_found when it holds neither layout.
  static result<safetensors_checkpoint> open(const std::filesystem::path& dir);

  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  /// The tensor `name`, or nullptr.
  const tensor_view* find(std::string_view name) const noexcept;
  /// The tensor `name`, or errc::not_found naming it and the directory.
  result<const tensor_view*> get(std::string_view name) const;
  /// The files opened (one, or the shards in index order).
  std::vector<std::filesystem::path> files() const;
  const std::filesystem::path& dir() const noexcept { return dir_; }

private:
  safetensors_checkpoint() = default;
  std::filesystem::path dir_;
  std::vector<safetensors_file> files_;
  std::map<std::string, const tensor_view*, std::less<>> by_name_;
};

/// Writes one .safetensors file atomically (temporary file in the same directory, fsync,
/// rename, directory fsync): readers see the old file or the new one, never a mix. Names must
/// be unique and each view's bytes must match its dtype and shape (errc::invalid_arg naming
/// the tensor). Tensors are stored in the given order; the header is padded to 8 bytes.
result<void> write_safetensors(const std::filesystem::path& path, std::span<const tensor_view> tensors,
                               const std::map<std::string, std::string>& metadata = {});

/// How write_checkpoint_weights splits tensors into files.
struct shard_options {
  /// A shard closes before the tensor that would take it past this size; a larger tensor gets
  /// a shard of its own. Default 5 GB (5e9 bytes): huggingface_hub's split_torch_state_dict_into_shards
  /// and transformers 4's `save_pretrained`, the layout of published checkpoints such as
  /// Qwen2.5-Coder-7B-Instruct's four shards. (transformers 5's `save_pretrained` defaults to 50 GB.)
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
  /// Written into every file's "__metadata__" ({"format": "pt"} as transformers does).
  std::map<std::string, std::string> metadata{{"format", "pt"}};
};

/// Parses a shard size as transformers' `max_shard_size` does: bytes, or a number with a unit
/// (`KB`, `MB`, `GB`, `TB`: powers of 1000; `KiB`, `MiB`, `GiB`, `TiB`: of 1024), e.g. "5GB",
/// "500MB", "2GiB". errc::invalid_arg naming the text when malformed or zero.
result<std::uint64_t> parse_shard_size(std::string_view text);

/// Writes the weights of an HF directory: one `model.safetensors` when everything fits one
/// shard, else `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`
/// ({"metadata": {"total_size": N}, "weight_map": {...}}, names sorted). Each file is written
/// atomically and the index last; weights files of the other layout, or shards of another
/// count, left by an earlier save are removed afterwards so the directory never names two
/// models. `dir` must exist. Returns the files written.
result<std::vector<std::filesystem::path>> write_checkpoint_weights(
    const std::filesystem::path& dir, std::span<const tensor_view> tensors, const shard_options& options = {});

/// Supplies the bytes of one file's tensors: `shard` is `layout.subspan(first, shard.size())`;
/// the views returned (same names, dtypes and shapes, in that order) must stay valid until the
/// next call. Called once per file, in order.
using shard_bytes =
    std::function<result<std::vector<tensor_view>>(std::size_t first, std::span<const tensor_view> shard)>;

/// As above, for tensors whose bytes are made one file at a time: `layout` gives names, dtypes
/// and shapes (its bytes are not read), `bytes` the data of each file just before it is
/// written, so a caller holds one shard's bytes at a time (save_model converting a model on a
/// GPU, for example).
result<std::vector<std::filesystem::path>> write_checkpoint_weights(const std::filesystem::path& dir,
                                                                    std::span<const tensor_view> layout,
                                                                    const shard_bytes& bytes,
                                                                    const shard_options& options = {});

} // namespace crucible::policy
