// tools/bench/compare_bpe/compare_bpe.cpp: crucible's byte-level BPE tokenizer (text/) beside
// meta-pytorch/tokenizers' HFTokenizer (C++, ExecuTorch's; built in when WITH_PT_TOKENIZERS is
// defined) and llama.cpp's tokenizer (libllama, vocabulary-only GGUF; WITH_LLAMA_VOCAB), all
// judged against Hugging Face `tokenizers` through the project's own
// tests/unit/text/tokenizer_parity.py: the tokenizers and generated strings of
// tests/unit/text/test_tokenizer_parity.cpp (plus any real tokenizer directory given), then load
// and encode times on a large realistic input, with `tokenizers` timed in the same run
// (bench_tokenizers.py). Results to stdout, each disagreement to OUT/disagreements.txt.
// Build and run: README.md beside this file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"

#ifdef WITH_PT_TOKENIZERS
#include <pytorch/tokenizers/hf_tokenizer.h>
#endif
#ifdef WITH_LLAMA_VOCAB
#include <llama.h>
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;
using ids_t = std::vector<std::int32_t>;

namespace {

struct options {
  std::string python = "python3";
  fs::path source = fs::current_path();
  fs::path out = fs::temp_directory_path() / "compare_bpe";
  std::vector<fs::path> real;          // real tokenizer directories for the parity part
  std::vector<fs::path> speed_tok;     // tokenizer directories for the speed part
  fs::path speed_text;                 // the text to encode
  fs::path train_speed;                // train a 32k tokenizer on the .py files under it
  fs::path gguf_py;                    // llama.cpp's gguf-py, for hf_to_gguf_vocab.py
  fs::path gguf_template;              // llama.cpp's models/ggml-vocab-gpt-2.gguf
  int reps = 5;
  bool parity = true;                  // --parity 0: the speed part only
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    std::cerr << "cannot run " << cmd << "\n";
    std::exit(1);
  }
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  if (::pclose(p) != 0) {
    std::cerr << "failed: " << cmd << "\n";
    std::exit(1);
  }
  return out;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// --- the libraries under test, behind one shape --------------------------------------------

struct engine {
  std::string name;
  std::function<bool(const fs::path& dir)> load; // false: cannot load this tokenizer
  std::function<ids_t(const std::string&, bool add_special)> encode;
  std::function<std::string(const ids_t&)> decode;
  std::string load_error;
};

engine crucible_engine() {
  auto tok = std::make_shared<std::optional<crucible::policy::tokenizer>>();
  engine e;
  e.name = "crucible";
  e.load = [tok](const fs::path& dir) {
    auto t = crucible::policy::tokenizer::load(dir);
    if (!t.ok()) {
      std::cerr << "crucible: " << t.error().message << "\n";
      return false;
    }
    tok->emplace(std::move(*t));
    return true;
  };
  e.encode = [tok](const std::string& s, bool add) { return (*tok)->encode(s, add); };
  e.decode = [tok](const ids_t& ids) { return (*tok)->decode(ids, false); };
  return e;
}

#ifdef WITH_PT_TOKENIZERS
// meta-pytorch/tokenizers: encode(text, bos, eos) adds `bos` BOS tokens in front; decode is one
// token at a time (the pieces are concatenated here). Given the tokenizer.json file, not the
// directory: from a directory it also reads tokenizer_config.json and refuses a null bos_token.
engine pt_engine(const std::shared_ptr<int>& bos_count) {
  auto tok = std::make_shared<std::unique_ptr<tokenizers::HFTokenizer>>();
  engine e;
  e.name = "pytorch-tok";
  e.load = [tok](const fs::path& dir) {
    auto t = std::make_unique<tokenizers::HFTokenizer>();
    if (t->load((dir / "tokenizer.json").string()) != tokenizers::Error::Ok)
      return false;
    *tok = std::move(t);
    return true;
  };
  e.encode = [tok, bos_count](const std::string& s, bool add) {
    auto r = (*tok)->encode(s, add ? *bos_count : 0, 0);
    ids_t out;
    if (!r.ok())
      return ids_t{-1}; // an error: never equal to a real answer
    for (auto id : r.get())
      out.push_back(static_cast<std::int32_t>(id));
    return out;
  };
  e.decode = [tok](const ids_t& ids) {
    std::string out;
    std::uint64_t prev = 0;
    for (auto id : ids) {
      auto r = (*tok)->decode(prev, static_cast<std::uint64_t>(id));
      if (r.ok())
        out += r.get();
      prev = static_cast<std::uint64_t>(id);
    }
    return out;
  };
  return e;
}
#endif

#ifdef WITH_LLAMA_VOCAB
// llama.cpp: a vocabulary-only GGUF, DIR/llama-vocab.gguf (written by hf_to_gguf_vocab.py from
// DIR/tokenizer.json unless already there). Special tokens written in the text are parsed, as
// `tokenizers` does with its added tokens; decode is llama_detokenize keeping special tokens.
engine llama_engine(const options& o) {
  struct holder {
    llama_model* model = nullptr;
    ~holder() {
      if (model)
        llama_model_free(model);
    }
  };
  auto h = std::make_shared<holder>();
  engine e;
  e.name = "llama.cpp";
  e.load = [h, o](const fs::path& dir) {
    auto gguf = dir / "llama-vocab.gguf";
    if (!fs::exists(gguf)) {
      std::string cmd = "PYTHONPATH=" + q(o.gguf_py) + " " + o.python + " " +
                        q(o.source / "tools/bench/compare_bpe/hf_to_gguf_vocab.py") + " " + q(dir / "tokenizer.json") +
                        " " + q(o.gguf_template) + " " + q(gguf) + " >/dev/null";
      if (std::system(cmd.c_str()) != 0)
        return false;
    }
    if (h->model)
      llama_model_free(h->model);
    auto params = llama_model_default_params();
    params.vocab_only = true;
    h->model = llama_model_load_from_file(gguf.c_str(), params);
    return h->model != nullptr;
  };
  e.encode = [h](const std::string& s, bool add) {
    const llama_vocab* v = llama_model_get_vocab(h->model);
    ids_t out(s.size() + 8);
    int n = llama_tokenize(v, s.data(), static_cast<int32_t>(s.size()), out.data(), static_cast<int32_t>(out.size()),
                           add, /*parse_special=*/true);
    if (n < 0) {
      out.resize(static_cast<std::size_t>(-n));
      n = llama_tokenize(v, s.data(), static_cast<int32_t>(s.size()), out.data(), static_cast<int32_t>(out.size()), add,
                         true);
    }
    out.resize(static_cast<std::size_t>(std::max(n, 0)));
    return out;
  };
  e.decode = [h](const ids_t& all) {
    const llama_vocab* v = llama_model_get_vocab(h->model);
    // llama.cpp aborts the process on an id outside the vocabulary (std::out_of_range through
    // its C API); `tokenizers` skips such ids, so they are dropped here first.
    ids_t ids;
    for (auto id : all)
      if (id >= 0 && id < llama_vocab_n_tokens(v))
        ids.push_back(id);
    std::string out(ids.size() * 64 + 16, '\0');
    int n = llama_detokenize(v, ids.data(), static_cast<int32_t>(ids.size()), out.data(),
                             static_cast<int32_t>(out.size()), /*remove_special=*/false, /*unparse_special=*/true);
    out.resize(static_cast<std::size_t>(std::max(n, 0)));
    return out;
  };
  return e;
}
#endif

// --- parity -------------------------------------------------------------------------------

struct tally {
  std::size_t strings = 0, ids = 0, ids_plain = 0, decoded = 0, random_decoded = 0, random = 0;
  std::size_t exceptions = 0;
};

std::string show(const std::string& s) {
  std::string out = json(s.substr(0, 200)).dump(-1, ' ', false, json::error_handler_t::replace);
  return out + (s.size() > 200 ? "..." : "");
}
std::string show(const ids_t& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size() && i < 40; ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + (v.size() > 40 ? ",...]" : "]");
}

void parity(const std::string& label, const fs::path& dir, const std::string& seed, const options& o,
            const fs::path& corpus_list, std::vector<engine>& engines, const std::shared_ptr<int>& bos_count,
            std::ostream& log) {
  auto helper = o.source / "tests/unit/text/tokenizer_parity.py";
  auto hf = json::parse(run_capture(o.python + " " + q(helper) + " cases " + q(dir / "tokenizer.json") + " " +
                                    q(corpus_list) + " " + seed));
  const auto& cases = hf["cases"];
  // BOS count of the post-processor, as `tokenizers` shows it on the empty string.
  *bos_count = 0;
  for (const auto& c : cases)
    if (c["text"].get<std::string>().empty())
      *bos_count = static_cast<int>(c["ids"].size() - c["ids_plain"].size());
  for (auto& e : engines) {
    if (!e.load(dir)) {
      std::printf("%-12s %-12s cannot load this tokenizer.json\n", label.c_str(), e.name.c_str());
      continue;
    }
    tally t;
    for (const auto& c : cases) {
      auto text = c["text"].get<std::string>();
      auto want = c["ids"].get<ids_t>();
      auto want_plain = c["ids_plain"].get<ids_t>();
      ++t.strings;
      auto got = e.encode(text, true);
      auto got_plain = e.encode(text, false);
      if (got == want)
        ++t.ids;
      else
        log << label << " " << e.name << " encode " << show(text) << "\n  ours " << show(got) << "\n  hf   "
            << show(want) << "\n";
      if (got_plain == want_plain)
        ++t.ids_plain;
      if (e.decode(want) == c["decoded"].get<std::string>())
        ++t.decoded;
      else
        log << label << " " << e.name << " decode " << show(want) << "\n  ours " << show(e.decode(want))
            << "\n  hf   " << show(c["decoded"].get<std::string>()) << "\n";
    }
    for (const auto& c : hf["decode_cases"]) {
      ++t.random;
      if (e.decode(c["ids"].get<ids_t>()) == c["text"].get<std::string>())
        ++t.random_decoded;
    }
    std::printf("%-12s %-12s ids %4zu/%zu | ids without specials %4zu/%zu | decode %4zu/%zu | decode of random ids "
                "%3zu/%zu\n",
                label.c_str(), e.name.c_str(), t.ids, t.strings, t.ids_plain, t.strings, t.decoded, t.strings,
                t.random_decoded, t.random);
  }
}

// The corpus of test_tokenizer_parity.cpp's fixture: the repository's sources and the
// generated multilingual text.
fs::path write_corpus(const options& o, std::vector<fs::path>& files) {
  auto multilingual = o.out / "multilingual.txt";
  run_capture(o.python + " " + q(o.source / "tests/unit/text/tokenizer_parity.py") + " corpus " + q(multilingual));
  const std::set<std::string> exts = {".cpp", ".hpp", ".py", ".md", ".sh", ".txt", ".yaml", ".cu"};
  for (const char* top : {"core", "jinja", "text", "policy", "env", "storage", "tools", "docs", "configs"}) {
    if (!fs::exists(o.source / top))
      continue;
    for (const auto& e : fs::recursive_directory_iterator(o.source / top))
      if (e.is_regular_file() && exts.count(e.path().extension().string()) != 0 &&
          e.path().filename() != "unicode_tables.cpp")
        files.push_back(e.path());
  }
  files.push_back(o.source / "README.md");
  std::sort(files.begin(), files.end());
  files.push_back(multilingual);
  auto list = o.out / "corpus.txt";
  std::ofstream out(list);
  for (const auto& p : files)
    out << p.string() << "\n";
  return list;
}

fs::path train(const std::vector<fs::path>& files, std::size_t vocab, const fs::path& dir) {
  crucible::policy::bpe_train_options opt;
  opt.vocab_size = vocab;
  crucible::policy::bpe_trainer trainer{opt};
  for (const auto& p : files)
    if (!trainer.feed_file(p).ok())
      std::cerr << "skipped " << p << "\n";
  auto model = trainer.train();
  if (!crucible::policy::write_tokenizer_dir(model, opt, dir).ok())
    std::exit(1);
  return dir;
}

// --- speed --------------------------------------------------------------------------------

double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The text cut into prompt-sized pieces: whole lines, at most 8 KiB each (a longer line alone).
// bench_tokenizers.py cuts the same way.
std::vector<std::string> chunks_of(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    auto end = nl == std::string::npos ? text.size() : nl + 1;
    std::string line = text.substr(pos, end - pos);
    pos = end;
    if (!cur.empty() && cur.size() + line.size() > 8192) {
      out.push_back(cur);
      cur.clear();
    }
    cur += line;
  }
  if (!cur.empty())
    out.push_back(cur);
  return out;
}

void speed(const options& o, std::vector<engine>& engines, const std::shared_ptr<int>& bos_count) {
  auto text = read_text(o.speed_text);
  auto chunks = chunks_of(text);
  std::printf("\n== speed: %s, %.2f MB, one encode call (no special tokens added); load (second load timed), "
              "encode once cold, then median of %d\n",
              o.speed_text.c_str(), text.size() / 1e6, o.reps);
  std::printf("(chunks: the same text as %zu pieces of whole lines, at most 8 KiB each, encoded one after "
              "another, median of %d)\n",
              chunks.size(), o.reps);
  std::printf("%-28s %-12s %9s %11s %11s %11s %9s %s\n", "tokenizer", "library", "load ms", "cold ms", "warm ms",
              "chunks ms", "ids", "same ids as crucible");
  *bos_count = 0;
  for (const auto& dir : o.speed_tok) {
    ids_t reference;
    for (auto& e : engines) {
      // The first load may convert or read the file cold; the second is timed.
      bool ok = e.load(dir);
      double load = seconds([&] { ok = ok && e.load(dir); });
      if (!ok) {
        std::printf("%-28s %-12s cannot load\n", dir.filename().c_str(), e.name.c_str());
        continue;
      }
      ids_t ids;
      double cold = seconds([&] { ids = e.encode(text, false); });
      std::vector<double> warm;
      for (int i = 0; i < o.reps; ++i)
        warm.push_back(seconds([&] { ids = e.encode(text, false); }));
      std::sort(warm.begin(), warm.end());
      if (reference.empty())
        reference = ids;
      std::vector<double> chunked;
      std::size_t chunk_ids = 0;
      for (int i = 0; i < o.reps; ++i)
        chunked.push_back(seconds([&] {
          chunk_ids = 0;
          for (const auto& c : chunks)
            chunk_ids += e.encode(c, false).size();
        }));
      std::sort(chunked.begin(), chunked.end());
      std::printf("%-28s %-12s %9.1f %11.1f %11.1f %11.1f %9zu %s\n", dir.filename().c_str(), e.name.c_str(),
                  1e3 * load, 1e3 * cold, 1e3 * warm[warm.size() / 2], 1e3 * chunked[chunked.size() / 2], ids.size(),
                  ids == reference ? "yes" : "NO");
      // For the Python side's check.
      if (e.name == "crucible") {
        std::ofstream f(o.out / (dir.filename().string() + ".ids.json"));
        f << json(ids).dump();
      }
    }
    std::fflush(stdout);
    std::string cmd = o.python + " " + q(o.source / "tools/bench/compare_bpe/bench_tokenizers.py") + " " +
                      q(dir) + " " + q(o.speed_text) + " " + std::to_string(o.reps) + " " +
                      q(o.out / (dir.filename().string() + ".ids.json"));
    if (std::system(cmd.c_str()) != 0)
      std::cerr << "failed: " << cmd << "\n";
  }
}

} // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // progress shows when piped to a file
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--python")
      o.python = v;
    else if (k == "--source")
      o.source = v;
    else if (k == "--out")
      o.out = v;
    else if (k == "--real")
      o.real.push_back(v);
    else if (k == "--speed-tokenizer")
      o.speed_tok.push_back(v);
    else if (k == "--speed-text")
      o.speed_text = v;
    else if (k == "--train-speed")
      o.train_speed = v;
    else if (k == "--gguf-py")
      o.gguf_py = v;
    else if (k == "--gguf-template")
      o.gguf_template = v;
    else if (k == "--reps")
      o.reps = std::atoi(v.c_str());
    else if (k == "--parity")
      o.parity = v != "0";
    else {
      std::cerr << "usage: compare_bpe [--python PY] [--source CHECKOUT] [--out DIR] [--real TOKENIZER_DIR]... "
                   "[--speed-text FILE [--speed-tokenizer DIR]... [--train-speed PY_DIR]] [--gguf-py DIR --gguf-template GGUF] "
                   "[--reps N] [--parity 0|1]\n";
      return 2;
    }
  }
  fs::create_directories(o.out);
  std::ofstream log(o.out / "disagreements.txt");
  auto bos_count = std::make_shared<int>(0);
  std::vector<engine> engines;
  engines.push_back(crucible_engine());
#ifdef WITH_PT_TOKENIZERS
  engines.push_back(pt_engine(bos_count));
#endif
#ifdef WITH_LLAMA_VOCAB
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  engines.push_back(llama_engine(o));
#endif

  // 1. Parity with `tokenizers` on test_tokenizer_parity.cpp's tokenizers and strings.
  std::vector<fs::path> files;
  auto corpus_list = write_corpus(o, files);
  if (o.parity) {
    std::printf("== agreement with Hugging Face tokenizers (tokenizer_parity.py cases), per string\n");
    auto helper = o.source / "tests/unit/text/tokenizer_parity.py";
    parity("qwen2-style", train(files, 3000, o.out / "qwen2"), "1", o, corpus_list, engines, bos_count, log);
    for (const auto& [kind, seed] : {std::pair{"gpt2", "2"}, std::pair{"llama3", "3"}}) {
      run_capture(o.python + " " + q(helper) + " make " + kind + " " + q(corpus_list) + " " + q(o.out / kind));
      parity(std::string(kind) + "-style", o.out / kind, seed, o, corpus_list, engines, bos_count, log);
    }
    for (const auto& dir : o.real)
      parity(dir.filename().string(), dir, "4", o, corpus_list, engines, bos_count, log);
  }

  // 2. Speed.
  if (!o.train_speed.empty()) {
    std::vector<fs::path> py;
    for (const auto& e : fs::recursive_directory_iterator(o.train_speed))
      if (e.is_regular_file() && e.path().extension() == ".py")
        py.push_back(e.path());
    std::sort(py.begin(), py.end());
    o.speed_tok.insert(o.speed_tok.begin(), train(py, 32000, o.out / "trained-32k"));
  }
  if (!o.speed_text.empty())
    speed(o, engines, bos_count);
  std::printf("\ndisagreements: %s\n", (o.out / "disagreements.txt").c_str());
  return 0;
}
