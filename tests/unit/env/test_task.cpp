#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "env/task.hpp"

namespace fs = std::filesystem;
using namespace crucible::env;

namespace {

const char* task_text = R"(import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(16)]

def get_init_inputs():
    return []
)";

} // namespace

TEST_CASE("a KernelBench-style directory is indexed by level, number and name without changes") {
  auto root = fs::temp_directory_path() / ("crucible-tasks-" + std::to_string(::getpid()));
  fs::create_directories(root / "level1");
  fs::create_directories(root / "level2");
  fs::create_directories(root / "level1" / "__pycache__");
  std::ofstream(root / "level1" / "19_ReLU.py") << task_text;
  std::ofstream(root / "level1" / "2_Other.py") << task_text;
  std::ofstream(root / "level2" / "1_Fused.py") << task_text;
  std::ofstream(root / "level1" / "helper.py") << "x = 1\n";
  std::ofstream(root / "level1" / "__pycache__" / "junk.py") << task_text;
  auto before = fs::last_write_time(root / "level1" / "19_ReLU.py");
  std::vector<std::string> skipped;
  auto tasks = index_tasks(root, &skipped);
  REQUIRE(tasks.ok());
  REQUIRE(tasks->size() == 3);
  CHECK((*tasks)[0].name == "level1/2_Other");
  CHECK((*tasks)[1].name == "level1/19_ReLU");
  CHECK((*tasks)[1].level == 1);
  CHECK((*tasks)[1].number == 19);
  CHECK((*tasks)[2].name == "level2/1_Fused");
  CHECK((*tasks)[0].sha256.size() == 64);
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find("level1/helper.py") == 0);
  CHECK(skipped[0].find("class Model") != std::string::npos);
  CHECK(fs::last_write_time(root / "level1" / "19_ReLU.py") == before);
  fs::remove_all(root);
}

TEST_CASE("load_task names the file and what is missing") {
  auto file = fs::temp_directory_path() / ("crucible-notask-" + std::to_string(::getpid()) + ".py");
  std::ofstream(file) << "class Model:\n    pass\n";
  auto t = load_task(file);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().message.find(file.string()) == 0);
  CHECK(t.error().message.find("def get_inputs(), def get_init_inputs()") != std::string::npos);
  fs::remove(file);
  CHECK(load_task(file).error().code == crucible::errc::not_found);
}

TEST_CASE("the project's CPU suite indexes completely") {
  auto tasks = index_tasks(fs::path{CRUCIBLE_SOURCE_DIR} / "env" / "tasks" / "cpu");
  REQUIRE(tasks.ok());
  CHECK(tasks->size() >= 12);
}

TEST_CASE("normalisation ignores whitespace-only differences and keeps everything else") {
  CHECK(normalize_source("a = 1  \r\n\n\nb = 2\n") == normalize_source("a = 1\nb = 2"));
  CHECK(normalize_source("#include <x>\na\n") != normalize_source("a\n"));
  CHECK(normalize_source("a = 1\n") != normalize_source("a = 2\n"));
}
