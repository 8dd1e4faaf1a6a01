// `crucible tokenizer train|encode|decode`: train a byte-level BPE tokenizer on local files, and
// encode or decode with any supported tokenizer.json.
#include <algorithm>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

namespace fs = std::filesystem;

// Flags each action accepts; any other flag given is a usage error.
const std::set<std::string> train_flags = {"--corpus", "--vocab", "--out", "--pattern", "--min-frequency", "--json"};
const std::set<std::string> encode_flags = {"--tokenizer", "--text", "--file", "--no-special", "--json"};
const std::set<std::string> decode_flags = {"--tokenizer", "--ids", "--skip-special", "--json"};

int usage_error(const std::string& action, const std::string& message) {
  std::fprintf(stderr, "crucible tokenizer %s: %s\n", action.c_str(), message.c_str());
  return exit_usage;
}

bool parse_count(const std::string& text, std::uint64_t& out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && p == text.data() + text.size();
}

// Files below a corpus path: the file itself, or the regular files of a directory tree in
// sorted order, hidden entries left out.
std::vector<fs::path> corpus_files(const fs::path& root, std::string& error) {
  std::error_code ec;
  if (fs::is_regular_file(root, ec))
    return {root};
  if (!fs::is_directory(root, ec)) {
    error = root.string() + ": no such file or directory";
    return {};
  }
  std::vector<fs::path> out;
  fs::recursive_directory_iterator it{root, fs::directory_options::skip_permission_denied, ec}, end;
  for (; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec))
        it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec))
      out.push_back(it->path());
  }
  if (ec)
    error = root.string() + ": " + ec.message();
  std::sort(out.begin(), out.end());
  return out;
}

int run_train(const parsed_args& args) {
  if (!args.has("--corpus") || !args.has("--vocab") || !args.has("--out"))
    return usage_error("train", "needs --corpus FILE (repeatable), --vocab N and --out DIR");
  policy::bpe_train_options options;
  std::uint64_t n = 0;
  if (!parse_count(args.get("--vocab"), n) || n == 0)
    return usage_error("train", "--vocab: expected a positive integer, got '" + args.get("--vocab") + "'");
  options.vocab_size = n;
  if (args.has("--min-frequency")) {
    if (!parse_count(args.get("--min-frequency"), n))
      return usage_error("train", "--min-frequency: expected a non-negative integer, got '" + args.get("--min-frequency") + "'");
    options.min_frequency = n;
  }
  const std::string pattern = args.get("--pattern", "qwen2");
  if (pattern == "qwen2") {
    options.pattern = policy::split_pattern::qwen2;
  } else if (pattern == "llama3") {
    options.pattern = policy::split_pattern::llama3;
    options.nfc = false;
  } else if (pattern == "gpt2") {
    options.pattern = policy::split_pattern::gpt2;
    options.nfc = false;
  } else {
    return usage_error("train", "--pattern: expected qwen2, llama3 or gpt2, got '" + pattern + "'");
  }
  policy::bpe_trainer trainer{options};
  if (auto r = trainer.validate(); !r)
    return usage_error("train", "--vocab: " + r.error().message);

  auto t0 = std::chrono::steady_clock::now();
  std::size_t files = 0, skipped = 0;
  for (const auto& root : args.all("--corpus")) {
    std::string error;
    auto list = corpus_files(root, error);
    if (!error.empty())
      return usage_error("train", "--corpus " + error);
    const bool explicit_file = list.size() == 1 && list[0] == fs::path{root};
    for (const auto& f : list) {
      auto r = trainer.feed_file(f);
      if (r) {
        ++files;
        continue;
      }
      // In a directory, binary and non-UTF-8 files are passed over; a named file must be text.
      if (r.error().code == errc::corrupt && !explicit_file) {
        ++skipped;
        continue;
      }
      std::fprintf(stderr, "crucible tokenizer train: %s\n", r.error().message.c_str());
      return r.error().code == errc::corrupt || r.error().code == errc::not_found ? exit_usage : exit_failure;
    }
  }
  if (trainer.bytes_fed() == 0)
    return usage_error("train", "--corpus: no text found");
  auto model = trainer.train();
  const fs::path out = args.get("--out");
  if (auto r = policy::write_tokenizer_dir(model, options, out); !r) {
    std::fprintf(stderr, "crucible tokenizer train: %s\n", r.error().message.c_str());
    return exit_failure;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.has("--json")) {
    json_writer w;
    w.begin_object()
      .field("out", out.string())
      .field("vocab_size", std::uint64_t{model.vocab.size()})
      .field("merges", std::uint64_t{model.merges.size()})
      .field("special_tokens", options.special_tokens)
      .field("pattern", pattern)
      .field("files", std::uint64_t{files})
      .field("files_skipped", std::uint64_t{skipped})
      .field("bytes", trainer.bytes_fed())
      .field("unique_words", std::uint64_t{trainer.unique_words()})
      .field("seconds", seconds)
      .end_object();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  std::printf("trained %zu tokens (%zu special, 256 bytes, %zu merges) with the %s pattern\n", model.vocab.size(),
              model.special_count, model.merges.size(), pattern.c_str());
  std::printf("corpus: %zu files (%zu skipped: not UTF-8 text), %.2f MB, %zu distinct words; %.2f s\n", files, skipped,
              static_cast<double>(trainer.bytes_fed()) / 1e6, trainer.unique_words(), seconds);
  std::printf("wrote %s and %s\n", (out / "tokenizer.json").c_str(), (out / "tokenizer_config.json").c_str());
  return exit_ok;
}

result<policy::tokenizer> open_tokenizer(const parsed_args& args) {
  return policy::tokenizer::load(args.get("--tokenizer"));
}

int load_error(const std::string& action, const crucible::error& e) {
  std::fprintf(stderr, "crucible tokenizer %s: %s\n", action.c_str(), e.message.c_str());
  return e.code == errc::io ? exit_failure : exit_usage;
}

int run_encode(const parsed_args& args) {
  if (!args.has("--tokenizer") || args.has("--text") == args.has("--file"))
    return usage_error("encode", "needs --tokenizer DIR and one of --text TEXT or --file FILE");
  std::string text = args.get("--text");
  if (args.has("--file")) {
    auto r = read_file(args.get("--file"));
    if (!r)
      return load_error("encode", r.error());
    text = std::move(*r);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto tok = open_tokenizer(args);
  if (!tok)
    return load_error("encode", tok.error());
  auto t1 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text, !args.has("--no-special"));
  auto t2 = std::chrono::steady_clock::now();
  double load_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  double ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  if (args.has("--json")) {
    json_writer w;
    w.begin_object().key("ids").begin_array();
    for (auto id : ids)
      w.value(static_cast<std::int64_t>(id));
    w.end_array().key("tokens").begin_array();
    for (auto id : ids)
      w.value(std::string{tok->token_of(id).value_or("")});
    w.end_array().field("count", std::uint64_t{ids.size()}).field("bytes", std::uint64_t{text.size()});
    w.field("load_milliseconds", load_ms).field("encode_milliseconds", ms).end_object();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  std::string line;
  for (auto id : ids)
    line += (line.empty() ? "" : " ") + std::to_string(id);
  std::printf("%s\n", line.c_str());
  return exit_ok;
}

int run_decode(const parsed_args& args) {
  if (!args.has("--tokenizer") || !args.has("--ids"))
    return usage_error("decode", "needs --tokenizer DIR and --ids ID,ID,...");
  std::vector<std::int32_t> ids;
  const std::string list = args.get("--ids");
  for (std::size_t i = 0; i < list.size();) {
    if (list[i] == ',' || list[i] == ' ') {
      ++i;
      continue;
    }
    std::int32_t id = 0;
    auto [p, ec] = std::from_chars(list.data() + i, list.data() + list.size(), id);
    if (ec != std::errc{} || (p != list.data() + list.size() && *p != ',' && *p != ' '))
      return usage_error("decode", "--ids: expected integers separated by commas, got '" + list + "'");
    ids.push_back(id);
    i = static_cast<std::size_t>(p - list.data());
  }
  auto tok = open_tokenizer(args);
  if (!tok)
    return load_error("decode", tok.error());
  auto text = tok->decode(ids, args.has("--skip-special"));
  if (args.has("--json")) {
    json_writer w;
    w.begin_object().field("text", text).end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return exit_ok;
}

int run_tokenizer(const parsed_args& args) {
  const std::string& action = args.positional[0];
  const std::set<std::string>* allowed = action == "train"    ? &train_flags
                                         : action == "encode" ? &encode_flags
                                         : action == "decode" ? &decode_flags
                                                              : nullptr;
  if (allowed == nullptr) {
    std::fprintf(stderr, "crucible tokenizer: unknown action '%s' (expected train, encode or decode)\n", action.c_str());
    return exit_usage;
  }
  for (const auto& [flag, values] : args.values)
    if (allowed->count(flag) == 0)
      return usage_error(action, "option " + flag + " does not apply to " + action);
  if (action == "train")
    return run_train(args);
  if (action == "encode")
    return run_encode(args);
  return run_decode(args);
}

} // namespace

command tokenizer_command() {
  return {{"tokenizer", "train|encode|decode [options]", "Train a byte-level BPE tokenizer, or encode and decode text",
           "train: learns a byte-level BPE tokenizer (Qwen2 pre-tokenizer and NFC by default, special\n"
           "tokens <|endoftext|>, <|im_start|>, <|im_end|>) from local text and writes tokenizer.json\n"
           "and tokenizer_config.json (ChatML template) into --out, in Hugging Face's format.\n"
           "  crucible tokenizer train --corpus docs --corpus README.md --vocab 8192 --out tok/\n"
           "A directory corpus is read recursively (hidden entries and non-UTF-8 files skipped).\n\n"
           "encode / decode: with any supported tokenizer.json (GPT-2, Qwen2, Llama 3 families):\n"
           "  crucible tokenizer encode --tokenizer tok/ --text 'def f(x):' --json\n"
           "  crucible tokenizer decode --tokenizer tok/ --ids 1,2,3",
           {"ACTION (train|encode|decode)"},
           {{"--corpus", "PATH", "train: a text file or directory to learn from", true},
            {"--vocab", "N", "train: vocabulary size, special and byte tokens included"},
            {"--out", "DIR", "train: directory to write the tokenizer into"},
            {"--pattern", "NAME", "train: pre-tokenizer pattern qwen2 (default, with NFC), llama3 or gpt2"},
            {"--min-frequency", "N", "train: never merge pairs seen fewer times (default 0)"},
            {"--tokenizer", "PATH", "encode/decode: tokenizer directory or tokenizer.json"},
            {"--text", "TEXT", "encode: the text to encode"},
            {"--file", "FILE", "encode: encode this file's content instead"},
            {"--no-special", "", "encode: do not add the post-processor's special tokens (e.g. BOS)"},
            {"--ids", "ID,...", "decode: token ids separated by commas"},
            {"--skip-special", "", "decode: leave special tokens out of the text"},
            {"--json", "", "print the result as JSON"}}},
          run_tokenizer};
}

} // namespace crucible::cli
