// tests/test_util/candidate_expectation.hpp: what a candidate under tests/candidates (or
// tests/candidates/gpu) must get, from its header lines '# task: PATH', '# expect: STATUS
// [CHECK]' and, for a hack whose own arithmetic differs from the reference's, '# control: PATH'
// (that arithmetic alone, which it may earn), and the check of a verdict against it. A hack expected as `rejected` may instead be
// caught as `incorrect`: it gains nothing either way. One expected as `no-credit` may get any
// verdict but a speedup (its trick is taken away, so it only computes); one expected as
// `no-speedup` may get any verdict but a credited speedup above 1.00x (the evaluator caps a
// candidate that ran only the reference's own kernels at 1.00x).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "env/verdict.hpp"

namespace crucible::testing {

struct expectation {
  std::filesystem::path task; ///< resolved against the checkout
  std::string status;         ///< a verdict status, `no-credit` or `no-speedup`
  std::string check;          ///< for `rejected`: the check it must name, if any
  std::filesystem::path control; ///< a candidate of the same arithmetic without the hack's route, if any
};

/// The header lines among the first five of `candidate`; `task` relative to `source_dir`.
inline expectation read_expectation(const std::filesystem::path& candidate, const std::filesystem::path& source_dir) {
  static const std::regex task_re{R"(^# task:\s*(\S+))"};
  static const std::regex expect_re{R"(^# expect:\s*(\S+)(?:\s+(\S+))?)"};
  static const std::regex control_re{R"(^# control:\s*(\S+))"};
  expectation e;
  std::ifstream in(candidate);
  std::string line;
  for (int i = 0; i < 5 && std::getline(in, line); ++i) {
    std::smatch m;
    if (std::regex_search(line, m, task_re))
      e.task = source_dir / m[1].str();
    else if (std::regex_search(line, m, control_re))
      e.control = source_dir / m[1].str();
    else if (std::regex_search(line, m, expect_re)) {
      e.status = m[1].str();
      e.check = m[2].matched ? m[2].str() : "";
    }
  }
  return e;
}

inline void check_expected(const expectation& e, const env::verdict& v) {
  if (e.status == "no-credit") {
    CHECK((v.status != env::verdict_status::ok || v.speedup < 1.25));
    return;
  }
  if (e.status == "no-speedup") { // credited at most 1.00x, whatever was measured
    CHECK((v.status != env::verdict_status::ok || v.speedup <= 1.0));
    return;
  }
  if (e.status == "rejected") {
    const bool caught = v.status == env::verdict_status::incorrect
                        || (v.status == env::verdict_status::rejected
                            && (e.check.empty()
                                || std::find(v.checks_failed.begin(), v.checks_failed.end(), e.check)
                                     != v.checks_failed.end()));
    CHECK(caught);
  } else {
    CHECK(std::string{env::to_string(v.status)} == e.status);
  }
  if (v.status != env::verdict_status::ok) {
    CHECK_FALSE(v.has_speedup());
    CHECK(v.reward == 0.0);
  }
}

} // namespace crucible::testing
