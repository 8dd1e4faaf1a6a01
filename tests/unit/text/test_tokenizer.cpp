// tests/unit/text/test_tokenizer.cpp: the tokenizer on small hand-written tokenizer.json files:
// pre-tokenizer pieces, NFC, BPE merges, added tokens, post-processor, decoding, the errors for
// malformed or unsupported files, the trainer's options and output, concurrency and speed.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "text/bpe_trainer.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using crucible::policy::split_pattern;
using crucible::policy::tokenizer;

namespace {

std::vector<std::string> pieces(split_pattern p, std::string_view text) {
  std::vector<std::string> out;
  policy::split_pieces(p, text, [&](std::string_view s) { out.emplace_back(s); });
  return out;
}

std::string quote(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

// The parts of a small tokenizer.json; each test replaces the one it is about.
struct spec {
  std::string normalizer = R"({"type": "NFC"})";
  std::string pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
                              quote(policy::pattern_regex(split_pattern::qwen2)) +
                              R"(}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  std::string post_processor = R"({"type": "ByteLevel"})";
  std::string decoder = R"({"type": "ByteLevel"})";
  std::string model_type = R"("type": "BPE", )";
  std::string model_extra = R"("dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, )";
  std::vector<std::string> extra_vocab = {"Ġt", "he", "Ġthe", "in", "Ġin", "ĠĠ", "ĠĠĠĠ", "ab", "abab"};
  std::string merges = R"(["Ġ t", ["h", "e"], "Ġt he", "i n", "Ġ in", "Ġ Ġ", "ĠĠ ĠĠ", "a b", "ab ab"])";
  std::string added = R"([{"id": 300, "content": "<|endoftext|>", "special": true, "normalized": false},
                          {"id": 301, "content": "<|im_start|>", "special": true, "normalized": false},
                          {"id": 302, "content": "<|im_end|>", "special": true, "normalized": false},
                          {"id": 303, "content": "<think>", "special": false, "normalized": false}])";

  std::string json() const {
    std::string vocab;
    int id = 0;
    for (int b = 0; b < 256; ++b)
      vocab += (b ? ", " : "") + quote(policy::bytes_to_token(std::string(1, static_cast<char>(b)))) + ": " +
               std::to_string(id++);
    for (const auto& t : extra_vocab)
      vocab += ", " + quote(t) + ": " + std::to_string(id++);
    return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": )" + added +
           R"(, "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" + pre_tokenizer +
           R"(, "post_processor": )" + post_processor + R"(, "decoder": )" + decoder + R"(, "model": {)" +
           model_type + model_extra + R"("vocab": {)" + vocab + R"(}, "merges": )" + merges + "}}";
  }
};

tokenizer make(const spec& s = {}, std::string_view config = {}) {
  auto t = tokenizer::from_json(s.json(), config, "tok.json");
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  return std::move(t).value();
}

crucible::error load_error(const spec& s, std::string_view config = {}) {
  auto t = tokenizer::from_json(s.json(), config, "tok.json");
  REQUIRE_FALSE(t.ok());
  return t.error();
}

std::int32_t id(const tokenizer& t, std::string_view token) {
  auto i = t.id_of(token);
  REQUIRE_MESSAGE(i.has_value(), token);
  return *i;
}

using crucible::testing::temp_dir;

} // namespace

TEST_CASE("the Qwen2 pattern splits as tokenizers does") {
  using V = std::vector<std::string>;
  auto q = split_pattern::qwen2;
  CHECK(pieces(q, "a  \n\n  b\n") == V{"a", "  \n\n", " ", " b", "\n"});
  CHECK(pieces(q, "x'\xc5\xbft") == V{"x", "'\xc5\xbf", "t"}); // 'ſ folds to 's
  CHECK(pieces(q, "it's  OK'LL we'Re") == V{"it", "'s", " ", " OK", "'LL", " we", "'Re"});
  CHECK(pieces(q, "a\xe3\x80\x80 b") == V{"a", "\xe3\x80\x80", " b"});           // U+3000
  CHECK(pieces(q, "!\xc2\x85\xc2\x85" "b") == V{"!", "\xc2\x85", "\xc2\x85" "b"}); // U+0085 is \s
  CHECK(pieces(q, "!\x1c\x1c" "b") == V{"!\x1c\x1c", "b"});                      // U+001C is not
  CHECK(pieces(q, "12345 x") == V{"1", "2", "3", "4", "5", " x"});
  CHECK(pieces(q, "foo(bar)  {\n\treturn 1;\n}\n") ==
        V{"foo", "(bar", ")", " ", " {\n", "\treturn", " ", "1", ";\n", "}\n"});
  CHECK(pieces(q, "x  ") == V{"x", "  "});
  CHECK(pieces(q, "\xff" "abc") == V{"\xff" "abc"}); // an invalid byte acts like punctuation
  CHECK(pieces(q, "").empty());
}

TEST_CASE("the Llama 3 and GPT-2 patterns split as tokenizers does") {
  using V = std::vector<std::string>;
  CHECK(pieces(split_pattern::llama3, "12345 x") == V{"123", "45", " x"});
  auto g = split_pattern::gpt2;
  CHECK(pieces(g, "Hello world's  12") == V{"Hello", " world", "'s", " ", " 12"});
  CHECK(pieces(g, "a  b\n\n c ") == V{"a", " ", " b", "\n\n", " c", " "});
  CHECK(pieces(g, " (x)!!") == V{" (", "x", ")!!"});
  CHECK(pieces(g, "it'S") == V{"it", "'", "S"}); // case-sensitive contractions
}

TEST_CASE("GPT-2's byte alphabet round-trips every byte") {
  std::string all;
  for (int b = 0; b < 256; ++b)
    all += static_cast<char>(b);
  auto spelled = policy::bytes_to_token(all);
  CHECK(policy::token_to_bytes(spelled) == all);
  CHECK(policy::bytes_to_token(" \n") == "\xc4\xa0\xc4\x8a"); // Ġ Ċ
  CHECK_FALSE(policy::token_to_bytes("\xe4\xb8\xad").has_value()); // 中 is not in the alphabet
}

TEST_CASE("NFC composes, reorders and decomposes exclusions") {
  using policy::unicode::nfc;
  CHECK(nfc("e\xcc\x81") == "\xc3\xa9");                       // e + U+0301 -> é
  CHECK(nfc("a\xcc\x82\xcc\xa3") == "\xe1\xba\xad");           // a + ^ + dot below -> ậ
  CHECK(nfc("a\xcc\xa3\xcc\x82") == "\xe1\xba\xad");           // marks in the other order
  CHECK(nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8") == "\xea\xb0\x81"); // jamo G A G -> 각
  CHECK(nfc("\xe2\x84\xa6") == "\xce\xa9");                   // OHM SIGN -> OMEGA
  CHECK(nfc("\xe0\xa5\x98") == "\xe0\xa4\x95\xe0\xa4\xbc");   // U+0958 is a composition exclusion
  CHECK(nfc("plain ascii") == "plain ascii");
  CHECK(nfc("bad \xff byte e\xcc\x81") == "bad \xff byte \xc3\xa9");
  CHECK_FALSE(policy::unicode::may_change_under_nfc("plain \xe4\xb8\xad\xe6\x96\x87"));
  CHECK(policy::unicode::may_change_under_nfc("e\xcc\x81"));
  CHECK(policy::unicode::combining_class(0x301) == 230);
  CHECK(policy::unicode::combining_class('a') == 0);
  CHECK(std::string{policy::unicode::data_source()}.find("unicodedata") != std::string::npos);
}

TEST_CASE("encode applies merges by rank, splits out added tokens and normalizes") {
  auto t = make();
  CHECK(t.vocab_size() == 304);
  CHECK(t.encode(" the") == std::vector<std::int32_t>{id(t, "Ġthe")});
  CHECK(t.encode("the in") == std::vector<std::int32_t>{id(t, "t"), id(t, "he"), id(t, "Ġin")});
  CHECK(t.encode("abab") == std::vector<std::int32_t>{id(t, "abab")});
  CHECK(t.encode("aaa") == std::vector<std::int32_t>{id(t, "a"), id(t, "a"), id(t, "a")});
  // Added tokens are matched before pre-tokenization, leftmost-longest; a cut-off one is text.
  auto ids = t.encode("<|im_start|>the<|im_end|><|im_end|><|im_");
  REQUIRE(ids.size() >= 5);
  CHECK(ids[0] == 301);
  CHECK(ids[3] == 302);
  CHECK(ids[4] == 302);
  CHECK(t.encode("<think>") == std::vector<std::int32_t>{303});
  // NFC: decomposed é encodes as the composed bytes.
  CHECK(t.encode("e\xcc\x81") == t.encode("\xc3\xa9"));
  // Long words take the heap path (more than 48 bytes) and merge the same way.
  std::string word;
  for (int k = 0; k < 250; ++k)
    word += "ab";
  CHECK(t.encode(word) == std::vector<std::int32_t>(125, id(t, "abab")));
  CHECK(t.encode("abababab") == std::vector<std::int32_t>(2, id(t, "abab")));
  CHECK(t.encode(std::string(9, ' ') + "x") ==
        std::vector<std::int32_t>{id(t, "ĠĠĠĠ"), id(t, "ĠĠĠĠ"), id(t, "Ġ"), id(t, "x")});
}

TEST_CASE("the post-processor template adds BOS only when asked") {
  spec s;
  s.post_processor = R"({"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [300], "tokens": ["<|endoftext|>"]}}}]})";
  auto t = make(s);
  CHECK(t.encode(" the", true) == std::vector<std::int32_t>{300, id(t, "Ġthe")});
  CHECK(t.encode(" the", false) == std::vector<std::int32_t>{id(t, "Ġthe")});
  CHECK(t.encode("", true) == std::vector<std::int32_t>{300});
}

TEST_CASE("decode maps bytes back, replaces broken UTF-8 and can skip special tokens") {
  auto t = make();
  std::string text = "<|im_start|>the \xe4\xb8\xad\xf0\x9f\x98\x80<|im_end|>";
  auto ids = t.encode(text);
  CHECK(t.decode(ids) == text);
  CHECK(t.decode(ids, true) == "the \xe4\xb8\xad\xf0\x9f\x98\x80");
  CHECK(t.decode(std::vector<std::int32_t>{303}, true) == "<think>"); // added but not special
  CHECK(t.is_special(300));
  CHECK_FALSE(t.is_special(303));
  // Half of a three-byte character, then a whole one: one U+FFFD per broken sequence.
  std::vector<std::int32_t> half = {id(t, "\xc3\xa4"), id(t, "\xc2\xb8"), id(t, "a")}; // bytes E4 B8 'a'
  CHECK(t.decode(half) == "\xef\xbf\xbd" "a");
  CHECK(t.decode(std::vector<std::int32_t>{-1, 5000, id(t, "a")}) == "a"); // unknown ids are skipped
  CHECK(t.token_of(id(t, "Ġthe")) == "Ġthe");
  CHECK_FALSE(t.token_of(4000).has_value());
  CHECK_FALSE(t.id_of("nope").has_value());
}

TEST_CASE("tokenizer_config.json gives bos/eos/pad ids and the chat template") {
  auto t = make({}, R"({"bos_token": null, "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
                       "pad_token": "<|endoftext|>", "chat_template": "{{ messages }}"})");
  CHECK_FALSE(t.bos_id().has_value());
  CHECK(t.eos_id() == 302);
  CHECK(t.pad_id() == 300);
  CHECK(t.chat_template() == "{{ messages }}");
  auto bad = load_error({}, R"({"eos_token": "<|nope|>"})");
  CHECK(bad.code == errc::corrupt);
  CHECK(bad.message.find("eos_token: '<|nope|>' is not a token") != std::string::npos);
  CHECK(load_error({}, "{\"eos_token\": }").message.find("tokenizer_config.json):1:15:") != std::string::npos);
}

TEST_CASE("malformed tokenizer.json files are refused with the key at fault") {
  auto message = [](const spec& s) { return load_error(s).message; };
  CHECK(tokenizer::from_json("{\"model\": [1,}", {}, "tok.json").error().message == "tok.json:1:14: syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal");
  CHECK(tokenizer::from_json("[]", {}, "tok.json").error().code == errc::corrupt);
  spec s;
  s.merges = R"(["Ġ t", "q zz"])";
  CHECK(message(s) == "tok.json: model.merges[1]: 'zz' is not in model.vocab");
  s.merges = R"(["Ġ t", ["a", "c"]])";
  CHECK(message(s) == "tok.json: model.merges[1]: the merged token 'ac' is not in model.vocab");
  s.merges = R"(["Ġt"])";
  CHECK(message(s).find("model.merges[0]: 'Ġt' is not two tokens") != std::string::npos);
  s.merges = R"([["a"]])";
  CHECK(message(s).find("model.merges[0]: expected") != std::string::npos);
  s = {};
  s.model_extra = R"("merges": [], )";
  auto no_vocab = tokenizer::from_json(R"({"model": {"type": "BPE", "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})", {}, "tok.json");
  REQUIRE_FALSE(no_vocab.ok());
  CHECK(no_vocab.error().message == "tok.json: model.vocab: missing");
  CHECK(tokenizer::from_json(R"({"pre_tokenizer": null})", {}, "tok.json").error().message == "tok.json: model: missing");
  s = {};
  s.added = R"([{"id": -4, "content": "x"}])";
  CHECK(message(s).find("added_tokens[0].id: expected a token id") != std::string::npos);
  s.added = R"([{"id": 4, "content": ""}])";
  CHECK(message(s).find("added_tokens[0].content") != std::string::npos);
  s = {};
  s.model_extra = R"("unk_token": "<unk>", )";
  CHECK(message(s).find("model.unk_token: '<unk>' is not in model.vocab") != std::string::npos);
}

TEST_CASE("unsupported components are refused with an error that quotes them") {
  auto error = [](const spec& s) {
    auto e = load_error(s);
    CHECK(e.code == errc::unsupported);
    return e.message;
  };
  spec s;
  s.model_type = R"("type": "WordPiece", )";
  CHECK(error(s).find("model.type: 'WordPiece' is not supported") != std::string::npos);
  s = {};
  s.normalizer = R"({"type": "NFKC"})";
  CHECK(error(s).find("normalizer.type: 'NFKC' is not supported") != std::string::npos);
  s.normalizer = R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})";
  CHECK(error(s).find("normalizer.normalizers[1].type: 'Lowercase'") != std::string::npos);
  s = {};
  s.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\w+|[^\\w\\s]+"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]})";
  CHECK(error(s).find("pre_tokenizer.pretokenizers[0].pattern.Regex: '\\w+|[^\\w\\s]+' is not a supported pattern") != std::string::npos);
  s.pre_tokenizer = R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false})";
  CHECK(error(s).find("String pattern ' '") != std::string::npos);
  s.pre_tokenizer = R"({"type": "Metaspace"})";
  CHECK(error(s).find("pre_tokenizer.type: 'Metaspace' is not supported") != std::string::npos);
  s.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
                    quote(policy::pattern_regex(split_pattern::llama3)) + R"(}, "behavior": "Removed", "invert": false}]})";
  CHECK(error(s).find("behavior: 'Removed'") != std::string::npos);
  s.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
                    quote(policy::pattern_regex(split_pattern::llama3)) + R"(}, "behavior": "Isolated", "invert": false}]})";
  CHECK(error(s).find("no ByteLevel step") != std::string::npos);
  s = {};
  s.post_processor = R"({"type": "BertProcessing"})";
  CHECK(error(s).find("post_processor.type: 'BertProcessing'") != std::string::npos);
  s = {};
  s.decoder = R"({"type": "WordPiece"})";
  CHECK(error(s).find("decoder.type: 'WordPiece'") != std::string::npos);
  s = {};
  s.model_extra = R"("dropout": 0.1, )";
  CHECK(error(s).find("model.dropout") != std::string::npos);
  s.model_extra = R"("byte_fallback": true, )";
  CHECK(error(s).find("model.byte_fallback") != std::string::npos);
  s.model_extra = R"("continuing_subword_prefix": "##", )";
  CHECK(error(s).find("model.continuing_subword_prefix: '##'") != std::string::npos);
}

TEST_CASE("load reads a directory or a file, and names what is missing") {
  temp_dir d;
  auto missing = tokenizer::load(d.path());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message.find("tokenizer.json") != std::string::npos);
  REQUIRE(write_file_atomic(d.path() / "tokenizer.json", spec{}.json()).ok());
  CHECK(tokenizer::load(d.path() / "tokenizer.json").ok());
  REQUIRE(write_file_atomic(d.path() / "tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})").ok());
  auto t = tokenizer::load(d.path());
  REQUIRE(t.ok());
  CHECK(t->eos_id() == 300);
  REQUIRE(write_file_atomic(d.path() / "tokenizer.json", "{\"model\": ").ok());
  auto bad = tokenizer::load(d.path());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find((d.path() / "tokenizer.json").string() + ":1:11:") == 0);
}

TEST_CASE("trainer options are checked and its output loads back") {
  policy::bpe_train_options o;
  o.vocab_size = 100;
  auto small = policy::bpe_trainer{o}.validate();
  REQUIRE_FALSE(small.ok());
  CHECK(small.error().message.find("need 259") != std::string::npos);
  o.vocab_size = 400;
  o.eos_token = "</s>";
  CHECK(policy::bpe_trainer{o}.validate().error().message.find("'</s>'") != std::string::npos);
  o.eos_token = "<|im_end|>";
  o.special_tokens.push_back("<|im_end|>");
  CHECK_FALSE(policy::bpe_trainer{o}.validate().ok());
  o.special_tokens.pop_back();

  policy::bpe_trainer trainer{o};
  REQUIRE(trainer.validate().ok());
  for (int i = 0; i < 50; ++i)
    trainer.feed("def kernel(x):\n    return x * 2  # double\n\xe4\xb8\xad\xe6\x96\x87 e\xcc\x81t\xc3\xa9\n");
  auto model = trainer.train();
  CHECK(model.special_count == 3);
  CHECK(model.vocab.size() <= 400);
  CHECK(model.vocab[0] == "<|endoftext|>");
  CHECK(model.vocab[3] == "!"); // the byte alphabet follows, by code point
  temp_dir d;
  REQUIRE(policy::write_tokenizer_dir(model, o, d.path() / "out").ok());
  auto t = tokenizer::load(d.path() / "out");
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  CHECK(t->eos_id() == 2);
  CHECK(t->pad_id() == 0);
  CHECK(t->chat_template() == policy::chatml_template);
  auto ids = t->encode("    return x * 2");
  CHECK(ids.size() < 10); // fewer tokens than bytes: merges were learned
  CHECK(t->decode(ids) == "    return x * 2");
  auto bad = trainer.feed_file(d.path() / "out" / "missing.txt");
  CHECK(bad.error().code == errc::not_found);
  REQUIRE(write_file_atomic(d.path() / "bin", std::string("ok\xff\xfe", 4)).ok());
  CHECK(trainer.feed_file(d.path() / "bin").error().message.find("not UTF-8 text (invalid byte at offset 2)") != std::string::npos);
}

TEST_CASE("concurrent encode calls agree with a single thread") {
  policy::bpe_train_options o;
  o.vocab_size = 1000;
  policy::bpe_trainer trainer{o};
  std::string corpus;
  for (const char* f : {"text/tokenizer.cpp", "text/bpe_trainer.cpp", "core/json_parse.cpp"}) {
    auto text = read_file(fs::path{CRUCIBLE_SOURCE_DIR} / f);
    REQUIRE(text.ok());
    corpus += *text;
  }
  trainer.feed(corpus);
  temp_dir d;
  REQUIRE(policy::write_tokenizer_dir(trainer.train(), o, d.path()).ok());
  auto t = tokenizer::load(d.path());
  REQUIRE(t.ok());
  std::vector<std::string> texts;
  for (std::size_t i = 0; i + 2000 < corpus.size(); i += 1500)
    texts.push_back(corpus.substr(i, 2000));
  std::vector<std::vector<std::int32_t>> want;
  {
    auto fresh = tokenizer::load(d.path()); // cold cache, one thread
    for (const auto& s : texts)
      want.push_back(fresh->encode(s));
  }
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round)
        for (std::size_t i = 0; i < texts.size(); ++i) {
          std::size_t j = (i * 7 + static_cast<std::size_t>(k)) % texts.size();
          bad[static_cast<std::size_t>(k)] += t->encode(texts[j]) != want[j];
        }
    });
  for (auto& th : threads)
    th.join();
  CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("a 150k-merge tokenizer.json loads, and megabytes of code encode, in well under a second") {
  // A Qwen2.5-sized vocabulary: 256 bytes, 150k merges of random earlier tokens, 20 specials.
  std::mt19937 rng{42};
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b)
    vocab.push_back(policy::bytes_to_token(std::string(1, static_cast<char>(b))));
  std::set<std::string> seen(vocab.begin(), vocab.end());
  std::string merges;
  while (vocab.size() < 150256) {
    const auto& a = vocab[rng() % std::min<std::size_t>(vocab.size(), 20000)];
    const auto& b = vocab[rng() % std::min<std::size_t>(vocab.size(), 20000)];
    if (a.size() + b.size() > 24 || !seen.insert(a + b).second)
      continue;
    merges += (merges.empty() ? "" : ", ") + quote(a + " " + b);
    vocab.push_back(a + b);
  }
  std::string json = R"({"added_tokens": [)";
  for (int i = 0; i < 20; ++i)
    json += (i ? ", " : "") + std::string{R"({"id": )"} + std::to_string(vocab.size() + static_cast<std::size_t>(i)) +
            R"(, "content": "<|special_)" + std::to_string(i) + R"(|>", "special": true, "normalized": false})";
  json += R"(], "normalizer": {"type": "NFC"}, "pre_tokenizer": )" + spec{}.pre_tokenizer +
          R"(, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {)";
  for (std::size_t i = 0; i < vocab.size(); ++i)
    json += (i ? ", " : "") + quote(vocab[i]) + ": " + std::to_string(i);
  json += "}, \"merges\": [" + merges + "]}}";

  auto t0 = std::chrono::steady_clock::now();
  auto t = tokenizer::from_json(json, {}, "big.json");
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  CHECK(t->vocab_size() == 150276);

  std::string code;
  for (const char* f : {"text/tokenizer.cpp", "text/bpe_trainer.cpp", "core/json_parse.cpp", "text/pre_tokenizer.cpp",
                        "tools/crucible/cmd_tokenizer.cpp", "README.md"}) {
    auto text = read_file(fs::path{CRUCIBLE_SOURCE_DIR} / f);
    REQUIRE(text.ok());
    code += *text;
  }
  while (code.size() < 4'000'000)
    code += code;
  t0 = std::chrono::steady_clock::now();
  auto ids = t->encode(code);
  double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(t->decode(ids) == code);
  MESSAGE("tokenizer.json of " << json.size() / 1e6 << " MB (150k merges) loaded in " << load_s << " s; "
                               << code.size() / 1e6 << " MB of code encoded to " << ids.size() << " ids in "
                               << encode_s << " s");
  CHECK(load_s < 2.0); // generous for loaded CI machines; about 0.3 s on a quiet core
  CHECK(encode_s < 3.0);
}
