// tools/bench/compare_jinja/compare_jinja.cpp: crucible's jinja/ beside google/minja (the
// header-only engine llama.cpp shipped for chat templates until its release b7756) and, when built
// with WITH_LLAMA_JINJA, llama.cpp's own engine since then (common/jinja), on the parity cases of
// tests/unit/jinja/test_jinja.cpp, judged against transformers' own rendering (jinja_parity.py,
// run with the given Python); then parse and render times of both on a realistic chat, and of
// jinja2 itself (bench_jinja2.py) in the same run. Results to stdout; each disagreement to
// OUT_DIR/disagreements.txt. Build and run: README.md beside this file.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <minja/minja.hpp>
#include <nlohmann/json.hpp>

#ifdef WITH_LLAMA_JINJA
#include "lexer.h"
#include "parser.h"
#include "runtime.h"
#include "value.h"
#endif

#include "core/json_parse.hpp"
#include "jinja/jinja.hpp"
#include "tests/unit/jinja/parity_cases.hpp"

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using crucible::jinja::parity::parity_case;

namespace {

// One engine's answer for one case: rendered text, or the error it gave.
struct outcome {
  bool ok = false;
  std::string text; // rendered text or error message
};

// Runs f in a child process, so that an engine that crashes on a case (a division by zero, a
// stack overflow) costs that case only; the crash is reported as its outcome.
outcome isolated(const std::function<outcome()>& f) {
  int fd[2];
  if (::pipe(fd) != 0)
    std::abort();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fd[0]);
    auto o = f();
    std::string msg = (o.ok ? "1" : "0") + o.text;
    for (std::size_t off = 0; off < msg.size();) {
      auto n = ::write(fd[1], msg.data() + off, msg.size() - off);
      if (n <= 0)
        break;
      off += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fd[1]);
  std::string msg;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd[0], buf, sizeof buf)) > 0)
    msg.append(buf, static_cast<std::size_t>(n));
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    return {false, "CRASH: signal " + std::to_string(WTERMSIG(status))};
  if (msg.empty())
    return {false, "CRASH: no answer"};
  return {msg[0] == '1', msg.substr(1)};
}

// --- crucible -------------------------------------------------------------------------------

outcome crucible_render(const parity_case& c) {
  auto prog = crucible::jinja::program::parse(c.templ, c.label);
  if (!prog.ok())
    return {false, prog.error().message};
  crucible::jinja::render_options opt;
  opt.now = std::chrono::system_clock::from_time_t(static_cast<std::time_t>(c.now));
  crucible::result<std::string> r = [&]() -> crucible::result<std::string> {
    if (!c.context_json.empty()) {
      auto ctx = crucible::parse_json(c.context_json, "context");
      if (!ctx.ok())
        return ctx.error();
      return prog->render(crucible::jinja::value::from_json(*ctx), opt);
    }
    return crucible::jinja::render_chat(*prog, c.messages, c.special, c.add_generation_prompt, opt);
  }();
  if (!r.ok())
    return {false, r.error().message};
  return {true, *r};
}

// --- minja ----------------------------------------------------------------------------------

// A chat case's messages and special tokens as JSON.
ojson messages_json(const parity_case& c) {
  ojson msgs = ojson::array();
  for (const auto& m : c.messages)
    msgs.push_back({{"role", m.role}, {"content", m.content}});
  return msgs;
}
ojson special_json(const parity_case& c) {
  ojson special = ojson::object();
  for (const auto& [k, v] : c.special)
    special[k] = v;
  return special;
}

// The variables transformers' render_jinja_template passes (messages, tools, documents,
// add_generation_prompt, the special tokens), or a plain case's own.
ojson transformers_context(const parity_case& c) {
  if (!c.context_json.empty())
    return ojson::parse(c.context_json);
  ojson ctx = ojson::object();
  ctx["messages"] = messages_json(c);
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = c.add_generation_prompt;
  for (const auto& [k, v] : c.special)
    ctx[k] = v;
  return ctx;
}

// transformers' global strftime_now: datetime.now().strftime(format), local time.
minja::Value minja_strftime_now(std::int64_t now) {
  return minja::Value::callable([now](const std::shared_ptr<minja::Context>&, minja::ArgumentsValue& args) {
    args.expectArgs("strftime_now", {1, 1}, {0, 0});
    auto format = args.args[0].get<std::string>();
    std::time_t t = static_cast<std::time_t>(now);
    std::tm local = *std::localtime(&t);
    std::ostringstream ss;
    ss << std::put_time(&local, format.c_str());
    return minja::Value(ss.str());
  });
}

// minja as transformers configures jinja2: trim_blocks, lstrip_blocks, trailing newline dropped.
const minja::Options minja_options{/*trim_blocks=*/true, /*lstrip_blocks=*/true, /*keep_trailing_newline=*/false};

outcome minja_render(const parity_case& c) {
  try {
    auto root = minja::Parser::parse(c.templ, minja_options);
    auto context = minja::Context::make(minja::Value(transformers_context(c)));
    context->set("strftime_now", minja_strftime_now(c.now));
    return {true, root->render(context)};
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
}

// --- llama.cpp's engine (common/jinja) ---------------------------------------------------

#ifdef WITH_LLAMA_JINJA
// As llama.cpp's own tests drive it without libcommon: lexer, parser, a context filled from
// JSON (strings marked as input, as llama.cpp does for messages), the runtime, the text parts.
// Its strftime_now reads ctx.current_time.
std::string llama_render_program(const jinja::program& prog, const std::string& source, const ojson& vars,
                                 std::int64_t now) {
  jinja::context ctx(source);
  ctx.current_time = static_cast<std::time_t>(now);
  jinja::global_from_json(ctx, vars, /*mark_input=*/true);
  jinja::runtime rt(ctx);
  const jinja::value results = rt.execute(prog);
  return jinja::runtime::gather_string_parts(results)->as_string().str();
}

outcome llama_render(const parity_case& c) {
  try {
    jinja::lexer lexer;
    auto lexed = lexer.tokenize(c.templ);
    auto prog = jinja::parse_from_tokens(lexed);
    return {true, llama_render_program(prog, lexed.source, transformers_context(c), c.now)};
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
}
#endif

// --- the reference: transformers through the project's own jinja_parity.py -------------------

std::vector<outcome> python_render(const std::vector<parity_case>& cases, const std::string& python,
                                   const fs::path& source_dir, const fs::path& dir) {
  ojson all = ojson::array();
  for (const auto& c : cases) {
    ojson j = {{"template", c.templ}, {"now", c.now}};
    if (!c.context_json.empty()) {
      j["context_json"] = c.context_json;
    } else {
      j["chat"] = {{"messages", messages_json(c)}, {"special", special_json(c)},
                   {"add_generation_prompt", c.add_generation_prompt}};
    }
    all.push_back(j);
  }
  auto in = dir / "cases.json";
  auto out = dir / "reference.json";
  std::ofstream(in, std::ios::binary) << all.dump();
  std::string cmd = python + " " + (source_dir / "tests/unit/jinja/jinja_parity.py").string() + " " + in.string() +
                    " " + out.string();
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "failed: " << cmd << "\n";
    std::exit(1);
  }
  auto ref = ojson::parse(crucible::jinja::parity::read_text(out));
  std::vector<outcome> results;
  for (const auto& r : ref)
    results.push_back(r["ok"].get<bool>() ? outcome{true, r["text"].get<std::string>()}
                                          : outcome{false, r["error"].get<std::string>()});
  return results;
}

// --- agreement ------------------------------------------------------------------------------

struct tally {
  int same_text = 0;       // both rendered, byte for byte equal
  int both_failed = 0;     // jinja2 raised and the engine refused too
  int wrong_text = 0;      // both rendered, different bytes: the dangerous kind
  int refused = 0;         // jinja2 rendered, the engine failed
  int accepted_bad = 0;    // jinja2 raised, the engine rendered something
  int crashed = 0;         // the engine killed its process (counted apart from the above)
  int agree() const { return same_text + both_failed; }
  int total() const { return same_text + both_failed + wrong_text + refused + accepted_bad + crashed; }
};

std::string show(const std::string& s, std::size_t max = 400) {
  auto t = s.substr(0, max);
  std::string out;
  for (char ch : t) {
    if (ch == '\n')
      out += "\\n";
    else if (ch == '\r')
      out += "\\r";
    else if (ch == '\t')
      out += "\\t";
    else
      out += ch;
  }
  return out + (s.size() > max ? "..." : "");
}

void judge(tally& t, const std::string& engine, std::size_t i, const parity_case& c, const outcome& ref,
           const outcome& got, std::ostream& log) {
  auto head = [&](const char* what) {
    log << "== " << engine << " case " << i << " (" << c.label << "): " << what << "\n   template: " << show(c.templ, 300)
        << "\n";
  };
  if (got.text.rfind("CRASH", 0) == 0) {
    ++t.crashed;
    head("engine crashed");
    log << "   " << got.text << "; jinja2: " << (ref.ok ? "rendered " : "raised ") << show(ref.text) << "\n";
  } else if (ref.ok && got.ok && ref.text == got.text) {
    ++t.same_text;
  } else if (!ref.ok && !got.ok) {
    ++t.both_failed;
  } else if (ref.ok && got.ok) {
    ++t.wrong_text;
    head("different text");
    log << "   jinja2: " << show(ref.text) << "\n   " << engine << ": " << show(got.text) << "\n";
  } else if (ref.ok) {
    ++t.refused;
    head("jinja2 rendered, engine failed");
    log << "   jinja2: " << show(ref.text) << "\n   error: " << show(got.text) << "\n";
  } else {
    ++t.accepted_bad;
    head("jinja2 raised, engine rendered");
    log << "   jinja2 error: " << show(ref.text) << "\n   " << engine << ": " << show(got.text) << "\n";
  }
}

void print_tally(const std::string& engine, const std::string& set, const tally& t) {
  std::printf("%-9s %-10s agree %3d/%3d (same text %3d, both refuse %2d) | different text %2d | refused %2d | "
              "rendered where jinja2 raises %2d | crashed %d\n",
              engine.c_str(), set.c_str(), t.agree(), t.total(), t.same_text, t.both_failed, t.wrong_text, t.refused,
              t.accepted_bad, t.crashed);
}

// --- timing ---------------------------------------------------------------------------------

// Median seconds of `reps` calls of f, after one warm-up call.
double median_seconds(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// A chat as a rollout sends it: system, a contrastive prompt with a KernelBench reference and
// three earlier implementations (about 8 KB), the policy's answer, and the evaluator's feedback.
std::vector<crucible::jinja::chat_message> realistic_chat(const fs::path& source_dir) {
  std::vector<fs::path> files;
  const auto level2 = source_dir / "data/kernelbench/level2";
  std::error_code ec;
  for (fs::directory_iterator it{level2, ec}, end; !ec && it != end; it.increment(ec))
    files.push_back(it->path());
  if (ec || files.size() < 8)
    throw std::runtime_error(level2.string() + ": needs KernelBench's level 2 tasks for the timed chat "
                             "(tools/bench/fetch_kernelbench.sh)");
  std::sort(files.begin(), files.end());
  auto code = [&](std::size_t i) { return "```python\n" + crucible::jinja::parity::read_text(files.at(i)) + "```\n"; };
  std::string user = "Task: " + files.at(0).stem().string() + " on an NVIDIA H100.\n\n" + code(0) +
                     "\nEarlier implementations, slowest first:\n\n";
  for (std::size_t i = 1; i <= 6; ++i)
    user += "Implementation " + std::to_string(i) + " (speedup 1." + std::to_string(i) + "2x):\n" + code(i) + "\n";
  user += "Analyse why the faster ones are faster, then write a faster ModelNew. Answer with the sections "
          "## Analysis, ## Plan and ## Code.";
  return {{"system", "You are an expert in writing fast CUDA kernels for PyTorch models."},
          {"user", user},
          {"assistant", "## Analysis\nFusing the epilogue saves a round trip.\n## Plan\nOne kernel.\n## Code\n" + code(7)},
          {"user", "Your kernel was correct but 0.93x as fast as the reference (band 2%). Try again."}};
}

// Every *.jinja file of `dir` (sorted; llama.cpp's own llama-cpp-*.jinja rewrites left out) over
// the four conversations of the real-template cases, with and without the generation prompt.
std::vector<parity_case> template_dir_cases(const fs::path& dir, const std::vector<parity_case>& real) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja" && e.path().filename().string().rfind("llama-cpp-", 0) != 0)
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<parity_case> out;
  for (const auto& f : files)
    for (std::size_t conv = 0; conv < 8; conv += 2) // real[0..7]: the first model's four conversations
      for (bool gen : {true, false}) {
        parity_case c;
        c.label = f.filename().string();
        c.templ = crucible::jinja::parity::read_text(f);
        c.messages = real.at(conv).messages;
        c.special = {{"bos_token", "<|bos|>"}, {"eos_token", "<|eos|>"}};
        c.add_generation_prompt = gen;
        out.push_back(c);
      }
  return out;
}

struct timing {
  double parse_us = 0, render_us = 0;
  std::size_t bytes = 0;
};

} // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // progress shows when piped to a file
  std::string python = "python3";
  fs::path source_dir = fs::current_path();
  fs::path out_dir = fs::temp_directory_path() / "compare_jinja";
  int reps = 400;
  fs::path templates_dir; // more real templates (llama.cpp's models/templates)
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--python")
      python = argv[i + 1];
    else if (k == "--source")
      source_dir = argv[i + 1];
    else if (k == "--out")
      out_dir = argv[i + 1];
    else if (k == "--templates")
      templates_dir = argv[i + 1];
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::cerr << "usage: compare_jinja [--python PY] [--source CHECKOUT] [--out DIR] [--templates DIR] [--reps N]\n";
      return 2;
    }
  }
  fs::create_directories(out_dir);
  std::ofstream log(out_dir / "disagreements.txt");

  // 1. Agreement with transformers on the project's parity cases.
  std::vector<std::pair<std::string, std::vector<parity_case>>> sets = {
    {"real", crucible::jinja::parity::real_template_cases(source_dir)}, {"semantics", crucible::jinja::parity::semantics_cases()}};
  if (!templates_dir.empty())
    sets.push_back({"more-real", template_dir_cases(templates_dir, sets[0].second)});
  std::printf("== agreement with transformers %s (jinja2), per case: same text, or both refuse\n",
              "apply_chat_template");
  for (const auto& [name, cases] : sets) {
    auto ref = python_render(cases, python, source_dir, out_dir);
    tally tc, tm, tl;
    // Per template: cases, then agreements of crucible, minja, llama.cpp; and whether jinja2 rendered.
    std::map<std::string, std::array<int, 5>> per_template;
    auto agrees = [&](const outcome& ref, const outcome& got) {
      return got.text.rfind("CRASH", 0) != 0 && ((ref.ok && got.ok && ref.text == got.text) || (!ref.ok && !got.ok));
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto& row = per_template[c.label];
      ++row[0];
      row[4] += ref[i].ok ? 1 : 0;
      auto oc = isolated([&] { return crucible_render(c); });
      judge(tc, "crucible", i, c, ref[i], oc, log);
      row[1] += agrees(ref[i], oc);
      auto om = isolated([&] { return minja_render(c); });
      judge(tm, "minja", i, c, ref[i], om, log);
      row[2] += agrees(ref[i], om);
#ifdef WITH_LLAMA_JINJA
      auto ol = isolated([&] { return llama_render(c); });
      judge(tl, "llama.cpp", i, c, ref[i], ol, log);
      row[3] += agrees(ref[i], ol);
#endif
    }
    if (name == "more-real") {
      std::printf("%-52s %5s %8s %8s %8s %9s\n", "template", "cases", "crucible", "minja", "llama.cpp",
                  "jinja2 ok");
      for (const auto& [label, r] : per_template)
        std::printf("%-52s %5d %8d %8d %8d %9d\n", label.c_str(), r[0], r[1], r[2], r[3], r[4]);
    }
    if (name == "more-real")
      std::printf("(%zu templates from %s, %zu cases; per-template results in disagreements.txt)\n", cases.size() / 8,
                  templates_dir.c_str(), cases.size());
    print_tally("crucible", name, tc);
    print_tally("minja", name, tm);
#ifdef WITH_LLAMA_JINJA
    print_tally("llama.cpp", name, tl);
#endif
  }

  // 2. Speed on a realistic chat, the real templates that a rollout would use.
  std::vector<crucible::jinja::chat_message> chat;
  try {
    chat = realistic_chat(source_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_jinja: no speed figures: %s\n", e.what());
    return 2;
  }
  std::size_t chat_bytes = 0;
  for (const auto& m : chat)
    chat_bytes += m.content.size();
  std::printf("\n== speed: %zu messages, %zu bytes of content; median of %d, microseconds\n", chat.size(), chat_bytes,
              reps);
  std::printf("%-16s %-9s %10s %10s %12s\n", "template", "engine", "parse", "render", "output B");
  ojson bench_in = ojson::array();
  for (const char* file : {"qwen2.5.jinja", "llama3.1.jinja", "smollm2.jinja"}) {
    parity_case c;
    c.label = file;
    c.templ = crucible::jinja::parity::read_text(source_dir / "tests/unit/jinja/chat_templates" / file);
    c.messages = chat;
    c.special = std::string(file).rfind("llama", 0) == 0
                  ? std::map<std::string, std::string>{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}
                  : std::map<std::string, std::string>{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
    auto want = crucible_render(c), other = minja_render(c);
    if (!want.ok || !other.ok || want.text != other.text)
      std::printf("%-16s note: the engines disagree on this chat (crucible %s, minja %s)\n", file,
                  want.ok ? "ok" : "failed", other.ok ? (other.text == want.text ? "same" : "different") : "failed");

    timing tc, tm;
    tc.parse_us = 1e6 * median_seconds(reps, [&] { (void)crucible::jinja::program::parse(c.templ, c.label); });
    auto prog = crucible::jinja::program::parse(c.templ, c.label);
    crucible::jinja::render_options opt;
    opt.now = std::chrono::system_clock::from_time_t(static_cast<std::time_t>(c.now));
    tc.render_us = 1e6 * median_seconds(reps, [&] {
      auto r = crucible::jinja::render_chat(*prog, c.messages, c.special, true, opt);
      tc.bytes = r.ok() ? r->size() : 0;
    });
    tm.parse_us = 1e6 * median_seconds(reps, [&] { (void)minja::Parser::parse(c.templ, minja_options); });
    auto root = minja::Parser::parse(c.templ, minja_options);
    // As for crucible, the timed call starts from the messages in the caller's own form (here
    // JSON, as llama.cpp holds them) and ends with the text.
    tm.render_us = 1e6 * median_seconds(reps, [&] {
      auto context = minja::Context::make(minja::Value(transformers_context(c)));
      context->set("strftime_now", minja_strftime_now(c.now));
      tm.bytes = root->render(context).size();
    });
    std::printf("%-16s %-9s %10.1f %10.1f %12zu\n", file, "crucible", tc.parse_us, tc.render_us, tc.bytes);
    std::printf("%-16s %-9s %10.1f %10.1f %12zu\n", file, "minja", tm.parse_us, tm.render_us, tm.bytes);
#ifdef WITH_LLAMA_JINJA
    {
      timing tl;
      auto lex_parse = [&] {
        jinja::lexer lexer;
        auto lexed = lexer.tokenize(c.templ);
        return std::make_pair(jinja::parse_from_tokens(lexed), lexed.source);
      };
      tl.parse_us = 1e6 * median_seconds(reps, [&] { (void)lex_parse(); });
      auto [prog, source] = lex_parse();
      auto llama_out = llama_render(c);
      if (!llama_out.ok || llama_out.text != want.text)
        std::printf("%-16s note: llama.cpp's engine %s on this chat\n", file, llama_out.ok ? "differs" : "fails");
      tl.render_us = 1e6 * median_seconds(reps, [&] {
        tl.bytes = llama_render_program(prog, source, transformers_context(c), c.now).size();
      });
      std::printf("%-16s %-9s %10.1f %10.1f %12zu\n", file, "llama.cpp", tl.parse_us, tl.render_us, tl.bytes);
    }
#endif
    bench_in.push_back({{"label", file}, {"template", c.templ}, {"messages", messages_json(c)},
                        {"special", special_json(c)}, {"now", c.now}});
  }
  // jinja2 in the same run, as transformers compiles and renders the template.
  auto bench_path = out_dir / "bench_in.json";
  std::ofstream(bench_path, std::ios::binary) << bench_in.dump();
  std::string cmd = python + " " + (source_dir / "tools/bench/compare_jinja/bench_jinja2.py").string() + " " +
                    bench_path.string() + " " + std::to_string(reps);
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0)
    std::cerr << "failed: " << cmd << "\n";
  std::printf("\ndisagreements: %s\n", (out_dir / "disagreements.txt").c_str());
  return 0;
}
