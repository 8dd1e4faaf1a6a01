// tests/unit/text/test_tokenizer_parity.cpp: crucible's tokenizer and trainer against Hugging
// Face `tokenizers` (run through tokenizer_parity.py with the build's Python): the same ids for
// over a thousand strings of code, whitespace runs, non-ASCII text and embedded special tokens,
// the same decoded bytes, and the same learned merges.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"
#include "tests/integration/process.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using crucible::policy::tokenizer;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};
const std::string helper = (source_dir / "tests/unit/text/tokenizer_parity.py").string();

// A scratch directory shared by the test cases of this process, with the training corpus: the
// repository's own sources plus generated multilingual text.
struct fixture {
  fs::path dir;
  fs::path corpus_list;
  std::vector<fs::path> corpus;

  fixture() {
    dir = fs::temp_directory_path() / ("crucible-tok-parity-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    auto multilingual = dir / "multilingual.txt";
    auto r = testing::run_process({CRUCIBLE_PYTHON, helper, "corpus", multilingual.string()});
    if (r.exit_code != 0)
      FAIL("tokenizer_parity.py corpus failed: " << r.err);
    const std::set<std::string> exts = {".cpp", ".hpp", ".py", ".md", ".sh", ".txt", ".yaml", ".cu"};
    for (const char* top : {"core", "jinja", "text", "policy", "env", "storage", "tools", "docs", "configs"}) {
      if (!fs::exists(source_dir / top))
        continue;
      for (const auto& e : fs::recursive_directory_iterator(source_dir / top))
        if (e.is_regular_file() && exts.count(e.path().extension().string()) != 0 &&
            e.path().filename() != "unicode_tables.cpp")
          corpus.push_back(e.path());
    }
    corpus.push_back(source_dir / "README.md");
    std::sort(corpus.begin(), corpus.end());
    corpus.push_back(multilingual);
    corpus_list = dir / "corpus.txt";
    std::ofstream list(corpus_list);
    for (const auto& p : corpus)
      list << p.string() << "\n";
  }
  ~fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

fixture& shared() {
  static fixture f;
  return f;
}

json_value run_helper_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CRUCIBLE_PYTHON, helper};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = testing::run_process(argv);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  auto v = parse_json(r.out, "tokenizer_parity.py output");
  REQUIRE_MESSAGE(v.ok(), (v.ok() ? "" : v.error().message));
  return std::move(v).value();
}

std::vector<std::int32_t> ids_of(const json_value& v) {
  std::vector<std::int32_t> out;
  for (const auto& x : v.as_array())
    out.push_back(static_cast<std::int32_t>(x.as_int()));
  return out;
}

std::string show(std::string_view text) {
  std::string out;
  append_json_string(out, text.substr(0, 300));
  return out;
}

std::string show(const std::vector<std::int32_t>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size() && i < 60; ++i)
    out += (i ? "," : "") + std::to_string(ids[i]);
  return out + (ids.size() > 60 ? ",...]" : "]");
}

// Compares crucible's tokenizer with `tokenizers` on the helper's generated cases; returns the
// number of strings compared.
std::size_t check_parity(const fs::path& tokenizer_path, const tokenizer& tok, const char* seed) {
  auto hf = run_helper_json({"cases", tokenizer_path.string(), shared().corpus_list.string(), seed});
  std::size_t compared = 0, mismatches = 0;
  auto report = [&](const std::string& what) {
    if (++mismatches <= 8)
      FAIL_CHECK(what);
  };
  for (const auto& c : hf.find("cases")->as_array()) {
    const auto& text = c.find("text")->as_string();
    auto want = ids_of(*c.find("ids"));
    auto got = tok.encode(text, true);
    if (got != want)
      report("encode " + show(text) + "\n  ours " + show(got) + "\n  hf   " + show(want));
    auto want_plain = ids_of(*c.find("ids_plain"));
    auto got_plain = tok.encode(text, false);
    if (got_plain != want_plain)
      report("encode (no specials) " + show(text) + "\n  ours " + show(got_plain) + "\n  hf   " + show(want_plain));
    if (auto d = tok.decode(want, false); d != c.find("decoded")->as_string())
      report("decode " + show(want) + "\n  ours " + show(d) + "\n  hf   " + show(c.find("decoded")->as_string()));
    if (auto d = tok.decode(want, true); d != c.find("decoded_skip")->as_string())
      report("decode skip " + show(want) + "\n  ours " + show(d) + "\n  hf   " + show(c.find("decoded_skip")->as_string()));
    ++compared;
  }
  for (const auto& c : hf.find("decode_cases")->as_array()) {
    auto ids = ids_of(*c.find("ids"));
    if (auto d = tok.decode(ids, false); d != c.find("text")->as_string())
      report("decode " + show(ids) + "\n  ours " + show(d) + "\n  hf   " + show(c.find("text")->as_string()));
    if (auto d = tok.decode(ids, true); d != c.find("text_skip")->as_string())
      report("decode skip " + show(ids) + "\n  ours " + show(d) + "\n  hf   " + show(c.find("text_skip")->as_string()));
  }
  CHECK(tok.vocab_size() == static_cast<std::size_t>(hf.find("vocab_size")->as_int()));
  CHECK(mismatches == 0);
  MESSAGE(compared << " strings and " << hf.find("decode_cases")->as_array().size()
                   << " id sequences compared with tokenizers; " << mismatches << " mismatches");
  return compared;
}

// A tokenizer of `kind` built and trained by `tokenizers` (tokenizer_parity.py make), loaded.
result<tokenizer> made_by_tokenizers(const std::string& kind, const fs::path& out) {
  auto r = testing::run_process({CRUCIBLE_PYTHON, helper, "make", kind, shared().corpus_list.string(), out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto tok = tokenizer::load(out);
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  return tok;
}

} // namespace

TEST_CASE("a Qwen2-style tokenizer trained by crucible encodes and decodes like tokenizers") {
  auto& f = shared();
  policy::bpe_train_options options;
  options.vocab_size = 3000;
  policy::bpe_trainer trainer{options};
  REQUIRE(trainer.validate().ok());
  for (const auto& p : f.corpus)
    REQUIRE(trainer.feed_file(p).ok());
  auto model = trainer.train();
  CHECK(model.vocab.size() == 3000);
  auto out = f.dir / "qwen2";
  REQUIRE(policy::write_tokenizer_dir(model, options, out).ok());
  auto tok = tokenizer::load(out);
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  CHECK(check_parity(out / "tokenizer.json", *tok, "1") >= 1000);

  // transformers.AutoTokenizer reads the same directory: special tokens, ChatML template, ids.
  auto tf = run_helper_json({"transformers", out.string()});
  CHECK(tok->eos_id() == tf.find("eos_id")->as_int());
  CHECK(tok->pad_id() == tf.find("pad_id")->as_int());
  CHECK(tf.find("bos_id")->is_null());
  CHECK_FALSE(tok->bos_id().has_value());
  CHECK(tok->vocab_size() == static_cast<std::size_t>(tf.find("vocab_size")->as_int()));
  const auto& chat = tf.find("chat")->as_string();
  CHECK(chat.rfind("<|im_start|>system\nYou write fast CUDA kernels.<|im_end|>\n<|im_start|>user\n", 0) == 0);
  CHECK(tok->encode(chat) == ids_of(*tf.find("ids")));
  CHECK(tok->decode(ids_of(*tf.find("ids"))) == tf.find("decoded")->as_string());
  CHECK(tok->chat_template() == policy::chatml_template);
}

TEST_CASE("crucible's trainer learns the same vocabulary and merges as tokenizers' BpeTrainer") {
  auto& f = shared();
  policy::bpe_train_options options;
  options.vocab_size = 2000;
  policy::bpe_trainer trainer{options};
  for (const auto& p : f.corpus)
    REQUIRE(trainer.feed_file(p).ok());
  auto model = trainer.train();
  auto hf = run_helper_json({"train", f.corpus_list.string(), "2000"});
  const auto& vocab = hf.find("vocab")->as_array();
  REQUIRE(vocab.size() == model.vocab.size());
  std::size_t vocab_diffs = 0;
  for (std::size_t i = 0; i < vocab.size(); ++i)
    if (vocab[i].as_string() != model.vocab[i] && ++vocab_diffs <= 5)
      FAIL_CHECK("token " << i << ": ours " << show(model.vocab[i]) << ", hf " << show(vocab[i].as_string()));
  CHECK(vocab_diffs == 0);
  // Merges as written to tokenizer.json (a merge learned twice keeps its last rank).
  auto written = parse_json(policy::tokenizer_json(model, options));
  REQUIRE(written.ok());
  const auto& ours = written->find("model")->find("merges")->as_array();
  const auto& theirs = hf.find("merges")->as_array();
  CHECK(ours.size() == theirs.size());
  std::size_t merge_diffs = 0;
  for (std::size_t i = 0; i < std::min(ours.size(), theirs.size()); ++i) {
    bool same = ours[i].as_array()[0].as_string() == theirs[i].as_array()[0].as_string() &&
                ours[i].as_array()[1].as_string() == theirs[i].as_array()[1].as_string();
    if (!same && ++merge_diffs <= 5)
      FAIL_CHECK("merge " << i << " differs: ours " << show(ours[i].as_array()[0].as_string()) << " "
                          << show(ours[i].as_array()[1].as_string()) << ", hf "
                          << show(theirs[i].as_array()[0].as_string()) << " " << show(theirs[i].as_array()[1].as_string()));
  }
  CHECK(merge_diffs == 0);
}

TEST_CASE("GPT-2-style tokenizer.json (ByteLevel regex, prefix space, lstrip/rstrip/single-word/normalized added tokens)") {
  auto out = shared().dir / "gpt2";
  auto tok = made_by_tokenizers("gpt2", out);
  CHECK(tok->describe().find("gpt2 pattern") != std::string::npos);
  CHECK(check_parity(out / "tokenizer.json", *tok, "2") >= 1000);
}

TEST_CASE("Llama-3-style tokenizer.json (cl100k Split, ignore_merges, BOS template, \"a b\" merges)") {
  auto out = shared().dir / "llama3";
  auto tok = made_by_tokenizers("llama3", out);
  CHECK(tok->describe().find("llama3 pattern") != std::string::npos);
  // BOS comes from the template; the whole-word vocabulary entries only ignore_merges reaches.
  auto bos = tok->id_of("<|begin_of_text|>");
  REQUIRE(bos);
  auto ids = tok->encode(" XYZZYplugh", true);
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] == *bos);
  CHECK(ids[1] == *tok->id_of("\xc4\xa0XYZZYplugh"));
  CHECK(check_parity(out / "tokenizer.json", *tok, "3") >= 1000);
}
