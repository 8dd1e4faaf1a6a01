// policy/model/safetensors.cpp: safetensors files from disk (mmap, validated whole before any
// tensor is handed out) and to disk (temporary file, fsync, rename), and HF weight directories of
// them.
#include "policy/model/safetensors.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.hpp"
#include "policy/model/json_input.hpp"

namespace crucible::policy {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; crucible maps it without byte swapping");

namespace fs = std::filesystem;

namespace {

// The format's own limit (safetensors' MAX_HEADER_SIZE): a larger header is corruption, not a model.
constexpr std::uint64_t max_header_bytes = 100'000'000;

constexpr const char* single_file_name = "model.safetensors";
constexpr const char* index_file_name = "model.safetensors.index.json";

struct dtype_entry {
  st_dtype dtype;
  const char* name;
  std::size_t size;
};
constexpr dtype_entry dtype_table[] = {
  {st_dtype::f64, "F64", 8},  {st_dtype::f32, "F32", 4}, {st_dtype::f16, "F16", 2},
  {st_dtype::bf16, "BF16", 2}, {st_dtype::i64, "I64", 8}, {st_dtype::i32, "I32", 4},
  {st_dtype::i16, "I16", 2},  {st_dtype::i8, "I8", 1},   {st_dtype::u8, "U8", 1},
  {st_dtype::boolean, "BOOL", 1},
};

// open(2) of a file or directory; EINTR (possible on network file systems) is retried.
int open_file(const fs::path& path, int flags, mode_t mode = 0) {
  for (;;) {
    int fd = ::open(path.empty() ? "." : path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EINTR)
      return fd;
  }
}

// a * b, or nullopt when it overflows 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

std::optional<std::uint64_t> byte_size(const tensor_view& t) {
  std::uint64_t n = 1;
  for (auto d : t.shape) {
    if (d < 0)
      return std::nullopt;
    auto m = checked_mul(n, static_cast<std::uint64_t>(d));
    if (!m)
      return std::nullopt;
    n = *m;
  }
  return checked_mul(n, dtype_size(t.dtype));
}

// A file being written: a temporary name in the target's directory until commit() renames it
// over the target. Destroying it uncommitted removes the temporary file.
class atomic_output final {
public:
  explicit atomic_output(fs::path target) : target_(std::move(target)) {}
  atomic_output(const atomic_output&) = delete;
  atomic_output& operator=(const atomic_output&) = delete;
  ~atomic_output() {
    if (fd_ >= 0)
      ::close(fd_);
    if (!committed_ && !tmp_.empty())
      ::unlink(tmp_.c_str());
  }

  result<void> open() {
    if (target_.filename().empty())
      return fail(errc::invalid_arg, target_.string(), ": not a file path");
    static std::atomic<unsigned long> counter{0};
    tmp_ = target_.parent_path() /
           ("." + target_.filename().string().substr(0, 200) + ".tmp." + std::to_string(::getpid()) + "." +
            std::to_string(counter.fetch_add(1)));
    fd_ = open_file(tmp_, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd_ < 0) {
      int err = errno;
      tmp_.clear();
      return fail(errc::io, "cannot create a temporary file for ", target_.string(), ": ", std::strerror(err));
    }
    return {};
  }

  result<void> write(const void* data, std::size_t size) {
    auto p = static_cast<const char*>(data);
    while (size > 0) {
      // Large tensors go in bounded pieces: some kernels cap a single write near 2 GiB.
      ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, 1u << 30));
      if (n < 0) {
        if (errno == EINTR)
          continue;
        return fail(errc::io, "cannot write ", target_.string(), ": ", std::strerror(errno));
      }
      p += n;
      size -= static_cast<std::size_t>(n);
    }
    return {};
  }

  result<void> commit() {
    // fsync before rename, or a crash could leave the name pointing at unwritten blocks.
    if (::fsync(fd_) != 0)
      return fail(errc::io, "cannot fsync ", target_.string(), ": ", std::strerror(errno));
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0)
      return fail(errc::io, "cannot close ", target_.string(), ": ", std::strerror(errno));
    if (::rename(tmp_.c_str(), target_.c_str()) != 0)
      return fail(errc::io, "cannot rename a temporary file onto ", target_.string(), ": ", std::strerror(errno));
    committed_ = true;
    auto dir = target_.parent_path();
    return fsync_directory(dir.empty() ? fs::path{"."} : dir);
  }

private:
  fs::path target_;
  fs::path tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

result<std::string> header_json(std::span<const tensor_view> tensors,
                                const std::map<std::string, std::string>& metadata) {
  json_writer w;
  w.begin_object();
  if (!metadata.empty()) {
    w.key("__metadata__").begin_object();
    for (const auto& [k, v] : metadata)
      w.field(k, v);
    w.end_object();
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return fail(errc::invalid_arg, "tensor name '", t.name, "' is not allowed in a safetensors file");
    if (!names.insert(t.name).second)
      return fail(errc::invalid_arg, "tensor ", t.name, " is given twice");
    auto size = byte_size(t);
    if (!size || *size != t.bytes.size())
      return fail(errc::invalid_arg, "tensor ", t.name, ": ", std::to_string(t.bytes.size()),
                  " bytes do not match its dtype ", to_string(t.dtype), " and shape");
    w.key(t.name).begin_object();
    w.field("dtype", to_string(t.dtype));
    w.key("shape").begin_array();
    for (auto d : t.shape)
      w.value(d);
    w.end_array();
    w.key("data_offsets").begin_array().value(offset).value(offset + *size).end_array();
    w.end_object();
    offset += *size;
  }
  w.end_object();
  std::string h = std::move(w).take();
  // Pad with spaces (allowed by the format) so tensor data starts 8-byte aligned.
  h.append((8 - (h.size() % 8)) % 8, ' ');
  return h;
}

fs::path shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

// "model-00002-of-00007.safetensors": a shard of the standard naming.
bool is_shard_name(const std::string& name) {
  unsigned a = 0, b = 0;
  char tail[32] = {};
  return name.size() == shard_name(1, 1).string().size() &&
         std::sscanf(name.c_str(), "model-%5u-of-%5u.%15s", &a, &b, tail) == 3 &&
         std::strcmp(tail, "safetensors") == 0;
}

} // namespace

const char* to_string(st_dtype d) noexcept {
  for (const auto& e : dtype_table)
    if (e.dtype == d)
      return e.name;
  return "?";
}

std::size_t dtype_size(st_dtype d) noexcept {
  for (const auto& e : dtype_table)
    if (e.dtype == d)
      return e.size;
  return 0;
}

result<st_dtype> parse_st_dtype(std::string_view name) {
  for (const auto& e : dtype_table)
    if (name == e.name)
      return e.dtype;
  return fail(errc::unsupported, "dtype '", name, "' is not supported (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
}

std::int64_t tensor_view::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

// ---- reading ----------------------------------------------------------------------------------

struct safetensors_file::mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    if (data != nullptr)
      ::munmap(const_cast<std::byte*>(data), size);
  }
};

safetensors_file::~safetensors_file() = default;

result<safetensors_file> safetensors_file::open(const fs::path& path) {
  const std::string where = path.string();
  int fd = open_file(path, O_RDONLY);
  if (fd < 0) {
    int err = errno;
    return fail(err == ENOENT ? errc::not_found : errc::io, "cannot open ", where, ": ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return fail(errc::io, "cannot stat ", where, ": ", std::strerror(err));
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return fail(errc::corrupt, where, ": ", std::to_string(file_size),
                " bytes is too short for a safetensors file (truncated?)");
  }
  auto map = std::make_shared<mapping>();
  void* p = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd); // the mapping keeps the file's pages reachable
  if (p == MAP_FAILED)
    return fail(errc::io, "cannot mmap ", where, ": ", std::strerror(err));
  // The weights are read front to back right after: the kernel's readahead of the whole file,
  // started now, reads it in large requests instead of page fault by page fault.
  (void) ::madvise(p, file_size, MADV_WILLNEED);
  map->data = static_cast<const std::byte*>(p);
  map->size = file_size;

  std::uint64_t header_len = 0;
  std::memcpy(&header_len, map->data, 8);
  if (header_len == 0 || header_len > max_header_bytes)
    return fail(errc::corrupt, where, ": header length ", std::to_string(header_len),
                " is outside 1..", std::to_string(max_header_bytes), " (not a safetensors file?)");
  if (header_len > file_size - 8)
    return fail(errc::corrupt, where, ": header length ", std::to_string(header_len), " runs past the end of the ",
                std::to_string(file_size), "-byte file (truncated?)");
  std::string_view header{reinterpret_cast<const char*>(map->data) + 8, header_len};
  if (header.front() != '{')
    return fail(errc::corrupt, where, ": header does not start with '{'");
  auto doc = json_input::parse(header, where + " header");
  if (!doc)
    return doc.error();
  if (!doc->is_object())
    return fail(errc::corrupt, where, ": header is not a JSON object");
  if (auto dup = json_input::duplicate_key(*doc))
    return fail(errc::corrupt, where, ": tensor ", *dup, " appears twice in the header");

  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_size = file_size - data_start;
  safetensors_file f;
  f.path_ = path;
  struct range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<range> ranges;
  for (const auto& member : doc->as_object()) {
    const std::string& name = member.key;
    const json_value& v = member.value;
    if (name == "__metadata__") {
      if (!v.is_object())
        return fail(errc::corrupt, where, ": __metadata__ is not an object");
      for (const auto& m : v.as_object()) {
        auto s = json_string(&m.value);
        if (!s)
          return fail(errc::corrupt, where, ": __metadata__.", m.key, " is not a string");
        f.metadata_[m.key] = *s;
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return fail(errc::corrupt, where, ": tensor ", name, ": ", what);
    };
    if (!v.is_object())
      return bad("entry is not an object");
    auto dtype_name = json_string(v.find("dtype"));
    if (!dtype_name)
      return bad("missing or non-string dtype");
    auto dtype = parse_st_dtype(*dtype_name);
    if (!dtype)
      return bad(dtype.error().message);
    tensor_view t;
    t.name = name;
    t.dtype = *dtype;
    const json_value* shape = v.find("shape");
    if (shape == nullptr || !shape->is_array())
      return bad("missing shape");
    for (const auto& d : shape->as_array()) {
      auto dim = json_uint(&d);
      if (!dim || *dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return bad("shape holds '" + json_input::text_of(&d) + "', not a non-negative integer");
      t.shape.push_back(static_cast<std::int64_t>(*dim));
    }
    const json_value* offsets = v.find("data_offsets");
    if (offsets == nullptr || !offsets->is_array() || offsets->as_array().size() != 2)
      return bad("data_offsets is not a pair");
    auto begin = json_uint(&offsets->as_array()[0]);
    auto end = json_uint(&offsets->as_array()[1]);
    if (!begin || !end || *begin > *end)
      return bad("data_offsets are not an ordered pair of non-negative integers");
    auto need = byte_size(t);
    if (!need)
      return bad("shape overflows 64 bits");
    if (*end - *begin != *need)
      return bad("data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + ") hold " +
                 std::to_string(*end - *begin) + " bytes but " + to_string(t.dtype) + " of this shape needs " +
                 std::to_string(*need));
    if (*end > data_size)
      return bad("data ends at byte " + std::to_string(*end) + " of a " + std::to_string(data_size) +
                 "-byte data section (truncated file?)");
    t.bytes = std::span<const std::byte>{map->data + data_start + *begin, static_cast<std::size_t>(*need)};
    ranges.push_back({*begin, *end, f.tensors_.size()});
    f.tensors_.push_back(std::move(t));
  }

  // The data section must be tiled exactly, as the reference implementation requires:
  // overlaps alias tensors, gaps and trailing bytes mean the file is not what its header says.
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expect = 0;
  std::vector<tensor_view> ordered;
  ordered.reserve(ranges.size());
  for (const auto& r : ranges) {
    const auto& name = f.tensors_[r.index].name;
    if (r.begin < expect)
      return fail(errc::corrupt, where, ": tensor ", name, " overlaps the tensor before it (offset ",
                  std::to_string(r.begin), " < ", std::to_string(expect), ")");
    if (r.begin > expect)
      return fail(errc::corrupt, where, ": a gap of ", std::to_string(r.begin - expect),
                  " bytes precedes tensor ", name);
    expect = r.end;
    ordered.push_back(std::move(f.tensors_[r.index]));
  }
  if (expect != data_size)
    return fail(errc::corrupt, where, ": the header describes ", std::to_string(expect), " data bytes but the file holds ",
                std::to_string(data_size), " (truncated or appended to?)");
  f.tensors_ = std::move(ordered);
  for (std::size_t i = 0; i < f.tensors_.size(); ++i)
    f.index_.emplace(f.tensors_[i].name, i);
  f.map_ = std::move(map);
  return f;
}

const tensor_view* safetensors_file::find(std::string_view name) const noexcept {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

result<safetensors_checkpoint> safetensors_checkpoint::open(const fs::path& dir) {
  safetensors_checkpoint c;
  c.dir_ = dir;
  std::error_code ec;
  auto add_file = [&](const fs::path& file) -> result<void> {
    auto f = safetensors_file::open(file);
    if (!f)
      return f.error();
    c.files_.push_back(std::move(*f));
    for (const auto& t : c.files_.back().tensors()) {
      auto [it, fresh] = c.by_name_.emplace(t.name, &t);
      if (!fresh)
        return fail(errc::corrupt, dir.string(), ": tensor ", t.name, " is in more than one shard (again in ",
                    file.filename().string(), ")");
    }
    return {};
  };

  if (fs::exists(dir / single_file_name, ec)) {
    if (auto r = add_file(dir / single_file_name); !r)
      return r.error();
    return c;
  }
  const fs::path index_path = dir / index_file_name;
  if (!fs::exists(index_path, ec)) {
    if (!fs::is_directory(dir, ec))
      return fail(errc::not_found, dir.string(), ": no such model directory");
    return fail(errc::not_found, dir.string(), ": holds neither ", single_file_name, " nor ", index_file_name);
  }
  auto text = read_file(index_path);
  if (!text)
    return text.error();
  const std::string where = index_path.string();
  auto doc = json_input::parse(*text, where);
  if (!doc)
    return doc.error();
  if (!doc->is_object())
    return fail(errc::corrupt, where, ": not a JSON object");
  const json_value* map = doc->find("weight_map");
  if (map == nullptr || !map->is_object())
    return fail(errc::corrupt, where, ": no weight_map object");
  if (auto dup = json_input::duplicate_key(*map))
    return fail(errc::corrupt, where, ": weight_map names tensor ", *dup, " twice");
  std::vector<std::string> shard_files;
  std::map<std::string, std::string, std::less<>> shard_of; // tensor -> file, as the index says
  for (const auto& [tensor, value] : map->as_object()) {
    auto file = json_string(&value);
    if (!file)
      return fail(errc::corrupt, where, ": weight_map.", tensor, " is not a file name");
    // Shards live beside the index: a path could read any file on the machine.
    if (file->empty() || file->find('/') != std::string::npos || *file == "." || *file == "..")
      return fail(errc::corrupt, where, ": weight_map.", tensor, " names '", *file,
                  "', not a file in the directory");
    if (std::find(shard_files.begin(), shard_files.end(), *file) == shard_files.end())
      shard_files.push_back(*file);
    shard_of.emplace(tensor, *file);
  }
  c.files_.reserve(shard_files.size());
  for (const auto& file : shard_files) {
    if (!fs::exists(dir / file, ec)) {
      auto named = std::find_if(shard_of.begin(), shard_of.end(), [&](const auto& e) { return e.second == file; });
      return fail(errc::corrupt, where, ": shard ", file, " is missing (weight_map puts ", named->first, " there)");
    }
    if (auto r = add_file(dir / file); !r)
      return r.error();
  }
  for (const auto& [name, file] : shard_of)
    if (c.by_name_.count(name) == 0)
      return fail(errc::corrupt, where, ": tensor ", name, " is mapped to ", file, " but that shard lacks it");
  // The index and the shards must agree on every tensor: where the index puts it, and that
  // nothing else is there (a stray tensor would load without the index knowing of it).
  for (const auto& f : c.files_) {
    const std::string file = f.path().filename().string();
    for (const auto& t : f.tensors()) {
      auto it = shard_of.find(t.name);
      if (it == shard_of.end())
        return fail(errc::corrupt, where, ": shard ", file, " holds tensor ", t.name,
                    ", which weight_map does not name");
      if (it->second != file)
        return fail(errc::corrupt, where, ": tensor ", t.name, " is in shard ", file, " but weight_map puts it in ",
                    it->second);
    }
  }
  return c;
}

std::vector<std::string> safetensors_checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_)
    out.push_back(name);
  return out;
}

const tensor_view* safetensors_checkpoint::find(std::string_view name) const noexcept {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

result<const tensor_view*> safetensors_checkpoint::get(std::string_view name) const {
  if (auto* t = find(name))
    return t;
  return fail(errc::not_found, dir_.string(), ": missing tensor ", name);
}

std::vector<fs::path> safetensors_checkpoint::files() const {
  std::vector<fs::path> out;
  for (const auto& f : files_)
    out.push_back(f.path());
  return out;
}

// ---- writing ----------------------------------------------------------------------------------

result<void> write_safetensors(const fs::path& path, std::span<const tensor_view> tensors,
                               const std::map<std::string, std::string>& metadata) {
  auto header = header_json(tensors, metadata);
  if (!header)
    return header.error();
  atomic_output out{path};
  if (auto r = out.open(); !r)
    return r;
  const std::uint64_t len = header->size();
  if (auto r = out.write(&len, 8); !r)
    return r;
  if (auto r = out.write(header->data(), header->size()); !r)
    return r;
  for (const auto& t : tensors)
    if (auto r = out.write(t.bytes.data(), t.bytes.size()); !r)
      return r;
  return out.commit();
}

result<std::uint64_t> parse_shard_size(std::string_view text) {
  auto bad = [&] {
    return fail(errc::invalid_arg, "shard size '", text,
                "' is not a size (bytes, or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB: '5GB', '500MB')");
  };
  std::size_t digits_end = 0;
  auto numeric = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0 || ch == '.'; };
  while (digits_end < text.size() && numeric(text[digits_end]))
    ++digits_end;
  const std::string number{text.substr(0, digits_end)};
  std::string unit{text.substr(digits_end)};
  for (auto& ch : unit)
    ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1)
    return bad();
  // huggingface_hub's units are powers of 1000; transformers 4 also took KiB, MiB and GiB.
  constexpr std::pair<const char*, double> units[] = {
    {"", 1.0},         {"KB", 1e3},           {"MB", 1e6},           {"GB", 1e9},           {"TB", 1e12},
    {"KIB", 1024.0},   {"MIB", 1048576.0},    {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
  };
  for (const auto& [name, scale] : units) {
    if (unit != name)
      continue;
    const double bytes = std::strtod(number.c_str(), nullptr) * scale;
    if (!(bytes >= 1.0) || bytes > 1.8e19)
      return bad();
    return static_cast<std::uint64_t>(bytes);
  }
  return bad();
}

result<std::vector<fs::path>> write_checkpoint_weights(const fs::path& dir, std::span<const tensor_view> layout,
                                                       const shard_bytes& bytes, const shard_options& options) {
  // Plan shards greedily in the given order (transformers does the same).
  std::vector<std::pair<std::size_t, std::size_t>> shards; // [first, last) into layout
  std::uint64_t current = 0, total = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    auto size = byte_size(layout[i]);
    if (!size)
      return fail(errc::invalid_arg, "tensor ", layout[i].name, ": its shape overflows 64 bits");
    if (shards.empty() || (current > 0 && current + *size > options.max_shard_bytes)) {
      shards.emplace_back(i, i);
      current = 0;
    }
    shards.back().second = i + 1;
    current += *size;
    total += *size;
  }
  if (shards.empty())
    shards.emplace_back(0, 0);

  // One shard's bytes at a time: asked for just before its file is written.
  auto write_shard = [&](const fs::path& path, std::size_t s) -> result<void> {
    const auto [first, last] = shards[s];
    auto part = layout.subspan(first, last - first);
    auto views = bytes(first, part);
    if (!views)
      return views.error();
    if (views->size() != part.size())
      return fail(errc::invalid_arg, path.string(), ": ", std::to_string(views->size()), " tensors supplied for ",
                  std::to_string(part.size()));
    for (std::size_t i = 0; i < part.size(); ++i)
      if ((*views)[i].name != part[i].name || (*views)[i].dtype != part[i].dtype || (*views)[i].shape != part[i].shape)
        return fail(errc::invalid_arg, path.string(), ": tensor ", (*views)[i].name, " supplied where ", part[i].name,
                    " (", to_string(part[i].dtype), ") was planned");
    return write_safetensors(path, *views, options.metadata);
  };

  std::vector<fs::path> written;
  std::set<std::string> keep;
  if (shards.size() == 1) {
    auto path = dir / single_file_name;
    if (auto r = write_shard(path, 0); !r)
      return r.error();
    written.push_back(path);
    keep.insert(single_file_name);
  } else {
    json_writer index;
    index.begin_object();
    index.key("metadata").begin_object().field("total_size", total).end_object();
    index.key("weight_map").begin_object();
    std::vector<std::pair<std::string_view, std::string>> entries;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const auto name = shard_name(s + 1, shards.size());
      if (auto r = write_shard(dir / name, s); !r)
        return r.error();
      written.push_back(dir / name);
      keep.insert(name.string());
      for (std::size_t i = shards[s].first; i < shards[s].second; ++i)
        entries.emplace_back(layout[i].name, name.string());
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& [tensor, file] : entries)
      index.field(tensor, file);
    index.end_object().end_object();
    if (auto r = write_file_atomic(dir / index_file_name, index.str()); !r)
      return r.error();
    written.push_back(dir / index_file_name);
    keep.insert(index_file_name);
  }
  // Only now that the new weights are complete: drop the files of an earlier save that would
  // otherwise shadow them (model.safetensors wins over an index) or linger as stale shards.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    bool ours = name == single_file_name || name == index_file_name || is_shard_name(name);
    if (ours && keep.count(name) == 0)
      fs::remove(entry.path(), ec);
  }
  return written;
}

result<std::vector<fs::path>> write_checkpoint_weights(const fs::path& dir, std::span<const tensor_view> tensors,
                                                       const shard_options& options) {
  return write_checkpoint_weights(
    dir, tensors,
    [](std::size_t, std::span<const tensor_view> part) -> result<std::vector<tensor_view>> {
      return std::vector<tensor_view>(part.begin(), part.end());
    },
    options);
}

} // namespace crucible::policy
