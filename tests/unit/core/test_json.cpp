#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/json.hpp"

using crucible::json_writer;

TEST_CASE("json_writer nests objects and arrays with commas in the right places") {
  json_writer w;
  w.begin_object()
    .field("a", 1)
    .field("b", std::string{"x"})
    .key("c").begin_array().value(true).value(false).null().end_array()
    .key("d").begin_object().end_object()
    .end_object();
  CHECK(w.str() == R"({"a":1,"b":"x","c":[true,false,null],"d":{}})");
}

TEST_CASE("json strings escape quotes, control characters and invalid UTF-8") {
  std::string out;
  crucible::append_json_string(out, "q\"b\\n\n\t\x01");
  CHECK(out == R"("q\"b\\n\n\t\u0001")");
  out.clear();
  crucible::append_json_string(out, "ok \xc3\xa9 bad \xff end");
  CHECK(out == "\"ok \xc3\xa9 bad \\ufffd end\"");
}

TEST_CASE("non-finite numbers become null; finite ones round-trip") {
  json_writer w;
  w.begin_array()
    .value(std::numeric_limits<double>::quiet_NaN())
    .value(std::numeric_limits<double>::infinity())
    .value(0.1)
    .value(std::uint64_t{18446744073709551615ull})
    .value(std::int64_t{-5})
    .end_array();
  CHECK(w.str() == "[null,null,0.1,18446744073709551615,-5]");
}
