// The build service's choice of the C++ flags it precompiles torch/extension.h for (the header is
// made outside the sandbox, so no flag may name a file, a program or a plugin).
#include <doctest/doctest.h>

#include "env/eval/build_service.hpp"

using crucible::env::precompilable_flag;

TEST_CASE("precompiled headers: plain optimisation and language flags only") {
  for (const char* f : {"-O0", "-O1", "-O2", "-O3", "-Os", "-Ofast", "-march=native", "-mtune=native", "-ffast-math",
                        "-funroll-loops", "-fopenmp", "-DNDEBUG", "-std=c++17", "-std=c++20", "-w", "-Wall",
                        "-Wno-unused-variable", "-g0"})
    CHECK_MESSAGE(precompilable_flag(f), f);
  for (const char* f : {"", "-fplugin=/tmp/x.so", "-wrapper", "-B/tmp", "-specs=/tmp/s", "-include", "/etc/passwd",
                        "-I/tmp", "-isystem", "-o", "-DX=1", "-D", "-O3 -fplugin=x.so", "-march=skylake;x", "-O4",
                        "-Wl,-rpath,/tmp", "@/tmp/flags", "-fdump-tree-all", "-save-temps", "-std=c++17 ",
                        "-Wno-error=x/../y"})
    CHECK_MESSAGE(!precompilable_flag(f), f);
}

using crucible::env::build_key_material;
using crucible::env::normalised_source;

TEST_CASE("build keys: sources equal but for comments and spaces share a key, and keep their lines") {
  const std::string a = "#include <cmath>\nint f(int x) {  // doubles\n\treturn x * 2;\n}\n";
  const std::string b = "#include <cmath>\nint f(int x) { /* twice */\n    return  x*2 ;   \n}\n";
  const std::string c = "#include <cmath>\nint f(int x) {\n  return x * 2;\n}\n";
  CHECK(normalised_source(a) == normalised_source(c));
  CHECK(normalised_source(a) == "#include <cmath>\nint f(int x) {\n return x * 2;\n}\n");
  CHECK(normalised_source(b) != normalised_source(c)); // x*2 and x * 2 are other text (same tokens, not merged)
  // Every line keeps its number: a block comment's newlines stay.
  CHECK(normalised_source("a /* one\ntwo\nthree */ b\n") == "a\n\n b\n");
  // Literals are never touched: their spaces and comment marks are the program's.
  CHECK(normalised_source("s = \"a  // b\";") != normalised_source("s = \"a // b\";"));
  CHECK(normalised_source("s = \"a  /* b */\";  // c") == "s = \"a  /* b */\";");
  CHECK(normalised_source("c = '/'  /  2;") == "c = '/' / 2;");
  CHECK(normalised_source("r = R\"x(a  // b\n  c)x\";  // d") == "r = R\"x(a  // b\n  c)x\";");
  CHECK(normalised_source("n = 1'000'000  +  u8'x';") == "n = 1'000'000 + u8'x';");
  CHECK(normalised_source("t = L\"a  b\"  ;") == "t = L\"a  b\" ;");
  // A header name is the program's too: #include <a//b.h> names a file, it holds no comment.
  CHECK(normalised_source("#include <ATen//ops/a.h>  // x\n") == "#include <ATen//ops/a.h>\n");
  CHECK(normalised_source("#include <ATen//ops/a.h>") != normalised_source("#include <ATen//ops/b.h>"));
  CHECK(normalised_source("  #  include   <a  b.h>") == " # include <a  b.h>");
  CHECK(normalised_source("#if A <  B // c\n") == "#if A < B\n");
  // A spliced line's tokens stay apart.
  CHECK(normalised_source("int a\\\n   b;") == "int a\\\n b;");
  // What cannot be read with certainty is left as it is.
  for (const char* raw : {"#define X /* a\n */ 1\n", "s = \"open\n", "// a comment \\\n going on\nx;", "a\rb",
                          "r = R\"x(never closed", "/* never closed"})
    CHECK_MESSAGE(normalised_source(raw) == raw, raw);
  CHECK(normalised_source("a  /* b */\r\nc") == "a\nc");
}

TEST_CASE("build keys: a request's sources are normalised, everything else is kept") {
  auto req = [](const std::string& name, const std::string& src) {
    return "{\"type\": \"build\", \"fn\": \"load_inline\", \"args\": {\"name\": \"" + name
           + "\", \"cpp_sources\": [\"" + src + "\"], \"cuda_sources\": \"__global__ void k() {}  // k\", "
             "\"extra_cflags\": [\"-O3\"]}, \"env\": {}}";
  };
  CHECK(build_key_material(req("ext", "int f();  // f")) == build_key_material(req("ext", "int  f();")));
  CHECK(build_key_material(req("ext", "int f();")) != build_key_material(req("ext2", "int f();")));
  CHECK(build_key_material(req("ext", "int f();")) != build_key_material(req("ext", "int g();")));
  CHECK(build_key_material(req("ext", "int f();")).find("// k") == std::string::npos);
  // `load`'s files: their texts.
  const std::string load1 = R"({"fn": "load", "args": {"name": "e", "sources": [{"name": "a.cpp", "text": "int f(); // x"}]}})";
  const std::string load2 = R"({"fn": "load", "args": {"name": "e", "sources": [{"name": "a.cpp", "text": "int  f();"}]}})";
  CHECK(build_key_material(load1) == build_key_material(load2));
  CHECK(build_key_material(load1) != build_key_material(R"({"fn": "load", "args": {"name": "e", "sources": [{"name": "b.cpp", "text": "int f();"}]}})"));
  // Every other field kept as it was, in its place.
  const auto key = build_key_material(req("ext", "int f();"));
  CHECK(key.find(R"("extra_cflags":["-O3"]},"env":{})") != std::string::npos);
  CHECK(key.rfind(R"({"type":"build","fn":"load_inline","args":{"name":"ext",)", 0) == 0);
  // Triton's builds (Python and IR, where spaces are the program's): the request itself.
  const std::string triton = R"({"fn": "triton_cc", "args": {"name": "m", "source": "int  f();  // x"}})";
  CHECK(build_key_material(triton) == triton);
  // Not a request with args: the text itself.
  CHECK(build_key_material("not json") == "not json");
  CHECK(build_key_material(R"({"fn": "load_inline"})") == R"({"fn": "load_inline"})");
}

using crucible::env::lasting_build_failure;

TEST_CASE("failed builds: a compiler's verdict on the sources is kept in the cache, a build cut short is not") {
  // What torch's load_inline raises when ninja's compiler step fails (the tail the builder sends).
  const std::string gcc = "Error building extension 'ext_1': [1/2] c++ -MMD -MF main.o.d -O3 -c main.cpp -o main.o\n"
                          "FAILED: main.o\n"
                          "main.cpp:7:33: error: expected ';' before 'no_such_token'\n"
                          "ninja: build stopped: subcommand failed.";
  CHECK(lasting_build_failure(gcc));
  CHECK(lasting_build_failure("cuda.cu(12): error: identifier \"blockDim_x\" is undefined\n1 error detected"));
  CHECK(lasting_build_failure("main.cpp:1:10: fatal error: no_such.h: No such file or directory"));
  CHECK(lasting_build_failure("main.o: undefined reference to `f()'\ncollect2: error: ld returned 1 exit status"));
  // No compiler diagnostic: the builder's own trouble, or a Python error in the call.
  CHECK_FALSE(lasting_build_failure(""));
  CHECK_FALSE(lasting_build_failure("TypeError: load_inline() got an unexpected keyword argument 'x'"));
  CHECK_FALSE(lasting_build_failure("Error building extension 'ext_1'"));
  // Cut short: the same sources may build another time.
  CHECK_FALSE(lasting_build_failure(gcc + "\nc++: fatal error: Killed signal terminated program cc1plus"));
  CHECK_FALSE(lasting_build_failure("main.cpp:3: error: x\n/tmp/ccX.s: No space left on device"));
  CHECK_FALSE(lasting_build_failure("main.cpp: internal compiler error: Segmentation fault"));
  CHECK_FALSE(lasting_build_failure("main.cpp:3:1: error: x\ncc1plus: out of memory allocating 65536 bytes"));
  CHECK_FALSE(lasting_build_failure("error: the build timed out"));
}
