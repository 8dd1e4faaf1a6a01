// env/prompt/feedback.hpp: the shipped feedback template, the text of each status, the evaluator's
// message cut to the budget, and templates that are refused with what is wrong.
#include <doctest/doctest.h>

#include <string>

#include "env/prompt/feedback.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

const std::string source_dir{CRUCIBLE_SOURCE_DIR};

feedback_template shipped() {
  auto t = load_feedback_template(source_dir + "/configs/prompts/feedback.yaml");
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  return *t;
}

verdict with(verdict_status s, std::string message = {}) {
  verdict v;
  v.status = s;
  v.message = std::move(message);
  return v;
}

} // namespace

TEST_CASE("feedback: each status's text from the shipped template") {
  const auto t = shipped();
  CHECK(t.max_error_chars == 1200);
  verdict fast = with(verdict_status::ok);
  fast.correct = true;
  fast.speedup = 2.345;
  fast.speedup_spread = 0.021;
  fast.ref_ms = 4.2;
  fast.cand_ms = 1.791;
  fast.hardware = "NVIDIA H100 80GB HBM3";
  CHECK(render_feedback(t, fast, 1, 2) ==
        "Turn 1: correct, 2.35x faster than the reference (band ±2.1%; 1.791 ms against 4.200 ms on NVIDIA H100 80GB "
        "HBM3).\nWhere its time went (-% in kernels the reference does not run):\n(no profile)\n2 more attempts: make "
        "it faster, and answer in the same sections.");
  // The candidate's profile (its top kernels' shares of its profiled call), largest first.
  verdict profiled = fast;
  profiled.profile = {{"fused_relu_scale_kernel", 0.8125}, {"aten::copy_", 0.1}};
  profiled.own_share = 0.8125;
  CHECK(render_feedback(t, profiled, 1, 2).find("(81% in kernels the reference does not run):\n   81.2%  "
                                                 "fused_relu_scale_kernel\n   10.0%  aten::copy_\n2 more attempts")
        != std::string::npos);
  verdict slow = fast;
  slow.speedup = 1.0;
  CHECK(render_feedback(t, slow, 2, 1).rfind("Turn 2: correct, but not faster than the reference (1.00x", 0) == 0);
  auto wrong = render_feedback(t, with(verdict_status::incorrect, "trial 0: 12 of 4096 elements outside atol"), 1, 3);
  CHECK(wrong == "Turn 1: incorrect. trial 0: 12 of 4096 elements outside atol\n3 more attempts: fix the result first.");
  verdict refused = with(verdict_status::rejected, "the candidate ran the reference's own kernels");
  refused.checks_failed = {"runtime:patched", "static:threads"};
  CHECK(render_feedback(t, refused, 3, 0).find("(runtime:patched, static:threads)") != std::string::npos);
  for (auto s : {verdict_status::compile_error, verdict_status::runtime_error, verdict_status::timeout,
                 verdict_status::format_error}) {
    CAPTURE(to_string(s));
    const auto text = render_feedback(t, with(s, "boom"), 1, 1);
    CHECK(text.rfind("Turn 1: ", 0) == 0);
    CHECK(text.find('{') == std::string::npos);
  }
}

TEST_CASE("feedback: a long message keeps its head and its tail within the budget") {
  const auto t = shipped();
  std::string trace = "Traceback (most recent call last):\n";
  for (int i = 0; i < 400; ++i)
    trace += "  File \"candidate.py\", line " + std::to_string(i) + ", in forward ü\n";
  trace += "RuntimeError: the real error is at the end";
  const auto cut = cut_middle(trace, 1200);
  CHECK(cut.size() <= 1200);
  CHECK(cut.rfind("Traceback (most recent call last):", 0) == 0);
  CHECK(cut.find("RuntimeError: the real error is at the end") != std::string::npos);
  CHECK(cut.find("characters left out") != std::string::npos);
  // Never inside a UTF-8 character: every byte that continues one follows a lead byte.
  for (std::size_t i = 0; i < cut.size(); ++i)
    if ((static_cast<unsigned char>(cut[i]) & 0xC0) == 0x80) {
      REQUIRE(i > 0);
      CHECK((static_cast<unsigned char>(cut[i - 1]) & 0x80) != 0);
    }
  CHECK(cut_middle("short", 1200) == "short");
  const auto text = render_feedback(t, with(verdict_status::runtime_error, trace), 1, 1);
  CHECK(text.size() < 1400);
}

TEST_CASE("feedback: a template with a wrong piece is refused naming the file, the key and the fault") {
  const std::string good = "version: 1\nok: a\nslower: b\nincorrect: c {error}\ncompile_error: d\nruntime_error: e\n"
                           "timeout: f\nrejected: g\nformat_error: h\n";
  CHECK(parse_feedback_template(good, "f.yaml").ok());
  auto unknown = parse_feedback_template(good + "extra: x\n", "f.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("f.yaml:10: extra: unknown key") != std::string::npos);
  std::string bad_placeholder = good;
  bad_placeholder.replace(bad_placeholder.find("c {error}"), 9, "c {nope}");
  auto bp = parse_feedback_template(bad_placeholder, "f.yaml");
  REQUIRE_FALSE(bp.ok());
  CHECK(bp.error().message.find("incorrect: unknown placeholder {nope}") != std::string::npos);
  std::string missing = good;
  missing.erase(missing.find("timeout: f\n"), 11);
  CHECK(parse_feedback_template(missing, "f.yaml").error().message.find("timeout: missing") != std::string::npos);
  CHECK(parse_feedback_template(good + "max_error_chars: 5\n", "f.yaml").error().message.find("max_error_chars") !=
        std::string::npos);
  CHECK(parse_feedback_template("version: 2\n", "f.yaml").error().message.find("version: expected 1") != std::string::npos);
}
