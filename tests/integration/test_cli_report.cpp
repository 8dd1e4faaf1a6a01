// `crucible report` in real processes: on a run made by `crucible train configs/quickstart.yaml`,
// on a run with every kind of record (its PNGs checked by Python's zlib), and on bad input.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "process.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::run_process;
using crucible::testing::temp_dir;

namespace {

auto cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Parses a PNG with Python's zlib: every chunk's CRC, the IHDR, and the inflated scanlines'
// length. Prints "WIDTHxHEIGHT" on success; exits non-zero otherwise.
const char* png_check = R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'signature'
pos, chunks = 8, []
while pos < len(data):
    (n,) = struct.unpack('>I', data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    (crc,) = struct.unpack('>I', data[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + body) == crc, kind
    chunks.append((kind, body))
    pos += 12 + n
assert [k for k, _ in chunks] == [b'IHDR', b'IDAT', b'IEND'], chunks
w, h, depth, colour, comp, filt, lace = struct.unpack('>IIBBBBB', chunks[0][1])
assert (depth, colour, comp, filt, lace) == (8, 2, 0, 0, 0)
raw = zlib.decompress(chunks[1][1])
assert len(raw) == h * (1 + 3 * w), len(raw)
assert all(raw[y * (1 + 3 * w)] == 0 for y in range(h))
print(f'{w}x{h}')
)PY";

} // namespace

TEST_CASE("crucible report on a quickstart run writes report.html and says what has no data yet") {
  temp_dir tmp;
  auto train = cli({"train", std::string{CRUCIBLE_SOURCE_DIR} + "/configs/quickstart.yaml", "--set", "stages.sft.steps=0", "--set",
                    "stages.rl.steps=0", "--set", "tasks.warm_start=false", "--set", "evaluator.warm_workers=0", "--set",
                    "tasks.suite=" + std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu", "--set",
                    "run.dir=" + tmp.path().string(), "--set", "log.level=warn"});
  INFO(train.err);
  REQUIRE(train.exit_code == 0);
  auto run = tmp.path() / "quickstart";
  auto r = cli({"report", run.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto html_path = run / "report" / "report.html";
  CHECK(r.out.rfind(html_path.string() + "\n", 0) == 0);
  auto html = slurp(html_path);
  CHECK(contains(html, "<h1>Run quickstart</h1>"));
  CHECK(contains(html, "<td>state</td><td>finished</td>"));
  CHECK(contains(html, "run_started 1"));
  CHECK(contains(html, "run_finished 1"));
  // Every plot is either drawn (and its PNG listed) or replaced by its no-data line.
  for (const char* id : {"reward", "speedup", "best_speedup_per_task", "status", "hardware"}) {
    CAPTURE(id);
    auto png = run / "report" / (std::string{id} + ".png");
    bool drawn = contains(html, std::string{"id=\"svg-"} + id + "\"");
    CHECK(drawn == fs::exists(png));
    CHECK(drawn == contains(r.out, png.string()));
    auto section = html.substr(html.find(std::string{"<section id=\""} + id + "\""));
    section = section.substr(0, section.find("</section>"));
    CHECK(drawn != contains(section, "No data yet"));
  }
  // Verdicts are not in metrics.jsonl yet: their plots say so.
  CHECK(contains(html, "No data yet: no verdict records."));
}

TEST_CASE("crucible report --out writes PNGs that Python's zlib and a chunk parser accept") {
  temp_dir tmp;
  auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run:\n  name: r\n";
  std::ofstream(run / "metrics.jsonl")
      << R"({"event":"train_step","step":1,"mean_reward":0.1,"best_speedup":1.1,"mean_speedup":0.8})" "\n"
      << R"({"event":"train_step","step":2,"mean_reward":0.3,"best_speedup":1.3,"mean_speedup":0.9})" "\n"
      << R"({"kind":"verdict","task":"softmax","status":"correct","speedup":1.3,"hardware":"h100"})" "\n"
      << R"({"kind":"verdict","task":"gemm","status":"timeout"})" "\n";
  auto out = tmp.path() / "out";
  auto r = cli({"report", run.string(), "--out", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.rfind((out / "report.html").string() + "\n", 0) == 0);
  CHECK_FALSE(fs::exists(run / "report"));
  auto script = tmp.path() / "png_check.py";
  std::ofstream(script) << png_check;
  int checked = 0;
  for (const char* id : {"reward", "speedup", "best_speedup_per_task", "status", "hardware"}) {
    CAPTURE(id);
    auto png = out / (std::string{id} + ".png");
    REQUIRE(fs::exists(png));
    CHECK(contains(r.out, png.string() + "\n"));
    auto py = run_process({std::string{CRUCIBLE_PYTHON}, script.string(), png.string()});
    INFO(py.err);
    CHECK(py.exit_code == 0);
    CHECK(py.out == "640x320\n");
    ++checked;
  }
  CHECK(checked == 5);
}

TEST_CASE("crucible report refuses a missing run and a bad record naming the file and line") {
  temp_dir tmp;
  auto r = cli({"report", (tmp.path() / "nope").string()});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.err, (tmp.path() / "nope").string() + ": not a run directory"));
  auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run:\n  name: r\n";
  std::ofstream(run / "metrics.jsonl") << R"({"event":"run_started","step":0})" "\n"
                                       << R"({"event":"train_step","step":1,"mean_reward":true})" "\n";
  r = cli({"report", run.string()});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.err, (run / "metrics.jsonl").string() + ":2: key 'mean_reward': expected a number or null, got boolean"));
  CHECK_FALSE(fs::exists(run / "report" / "report.html"));
}
