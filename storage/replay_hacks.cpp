// storage/replay_hacks.cpp: the hacking-case database over the replay store: flagged variants with
// the checks that caught them (hack_checks, kept by triggers), listed and ranked by similarity.
#include <algorithm>

#include "core/json_parse.hpp"
#include "storage/code_similarity.hpp"
#include "storage/replay_store.hpp"
#include "storage/replay_store_detail.hpp"

namespace crucible::storage {

using detail::bind_text;
using detail::db_fail;
using detail::statement;

namespace {

std::vector<std::string> split_checks(const std::string& json) {
  std::vector<std::string> out;
  auto v = parse_json(json);
  if (!v.ok() || !v->is_array()) return out;  // stored canonically by record(); cannot happen
  for (const auto& e : v->as_array())
    if (e.is_string()) out.push_back(e.as_string());
  return out;
}

} // namespace

result<std::vector<hack_case>> replay_store::list_hacks(const hack_filter& filter) const {
  // By check: hack_checks' key (check_name, variant_id) gives the ids in order. Otherwise the
  // partial index variants_flagged, whose condition the WHERE repeats.
  std::string sql;
  if (!filter.check.empty())
    sql = std::string(detail::select_columns_v) +
          "hack_checks h JOIN variants v ON v.id = h.variant_id WHERE h.check_name = ?1"
          " AND (?2 = '' OR v.task_id = ?2) ORDER BY v.id";
  else if (!filter.task_id.empty())
    sql = std::string(detail::select_columns) +
          "WHERE task_id = ?2 AND " CRUCIBLE_FLAGGED_SQL " ORDER BY id";
  else
    sql = std::string(detail::select_columns) + "WHERE " CRUCIBLE_FLAGGED_SQL " ORDER BY id";
  statement st;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  if (!filter.check.empty()) bind_text(st.s, 1, filter.check);
  if (sqlite3_bind_parameter_index(st.s, "?2") > 0) bind_text(st.s, 2, filter.task_id);
  std::vector<hack_case> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    hack_case& h = out.emplace_back();
    h.variant = detail::read_row(st.s);
    h.checks = split_checks(h.variant.checks_failed);
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "list hacks");
  return out;
}

result<std::vector<similar_hack>> replay_store::similar_hacks(std::string_view code, std::size_t k,
                                                              const hack_filter& filter) const {
  auto cases = list_hacks(filter);
  if (!cases.ok()) return cases.error();
  const auto probe = shingle_set(code);
  std::vector<similar_hack> ranked;
  ranked.reserve(cases->size());
  for (auto& c : *cases) {
    const double s = jaccard(probe, shingle_set(c.variant.code));
    ranked.push_back({std::move(c), s});
  }
  const std::size_t keep = std::min(k, ranked.size());
  auto better = [](const similar_hack& a, const similar_hack& b) {
    return a.similarity != b.similarity ? a.similarity > b.similarity
                                        : a.hack.variant.id < b.hack.variant.id;
  };
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep),
                    ranked.end(), better);
  ranked.resize(keep);
  return ranked;
}

} // namespace crucible::storage
