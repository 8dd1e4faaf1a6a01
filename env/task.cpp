#include "env/task.hpp"

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/file_io.hpp"
#include "core/sha256.hpp"

namespace crucible::env {

namespace fs = std::filesystem;

std::string missing_task_parts(const std::string& source) {
  static const std::regex model_re{R"((^|\n)class\s+Model\s*\()"};
  static const std::regex inputs_re{R"((^|\n)def\s+get_inputs\s*\()"};
  static const std::regex init_re{R"((^|\n)def\s+get_init_inputs\s*\()"};
  std::string missing;
  auto need = [&](const std::regex& re, const char* what) {
    if (!std::regex_search(source, re))
      missing += (missing.empty() ? "" : ", ") + std::string{what};
  };
  need(model_re, "class Model");
  need(inputs_re, "def get_inputs()");
  need(init_re, "def get_init_inputs()");
  return missing;
}

namespace {

int leading_number(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])))
    ++i;
  if (i == 0 || i > 6 || i >= s.size() || s[i] != '_')
    return 0;
  return std::stoi(s.substr(0, i));
}

int level_of(const fs::path& rel) {
  static const std::regex level_re{R"(^level_?(\d+)$)", std::regex::icase};
  for (const auto& part : rel.parent_path()) {
    std::smatch m;
    auto s = part.string();
    if (std::regex_match(s, m, level_re))
      return std::stoi(m[1].str());
  }
  return 0;
}

} // namespace

result<task> load_task(const fs::path& file, std::string name) {
  auto text = read_source_file(file);
  if (!text) {
    if (text.error().code == errc::not_found)
      return fail(errc::not_found, file.string(), ": no such task file");
    return text.error();
  }
  task t;
  t.source = std::move(*text);
  if (auto missing = missing_task_parts(t.source); !missing.empty())
    return fail(errc::invalid_arg, file.string(), ": not a KernelBench task: missing ", missing);
  t.path = file;
  t.name = name.empty() ? file.stem().string() : std::move(name);
  t.sha256 = sha256_hex(t.source);
  t.number = leading_number(file.filename().string());
  return t;
}

result<std::vector<task>> index_tasks(const fs::path& root, std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return fail(errc::not_found, root.string(), ": not a directory");
  std::vector<task> out;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec)
      return fail(errc::io, root.string(), ": ", ec.message());
    const auto& p = it->path();
    auto fname = p.filename().string();
    if (it->is_directory() && (fname.rfind('.', 0) == 0 || fname == "__pycache__" || fname == "variants")) {
      it.disable_recursion_pending(); // hidden folders, caches and seed variants hold no tasks
      continue;
    }
    if (!it->is_regular_file() || p.extension() != ".py" || fname == "__init__.py")
      continue;
    auto rel = fs::relative(p, root);
    auto name = (rel.parent_path() / rel.stem()).generic_string();
    auto t = load_task(p, name);
    if (!t) {
      if (skipped != nullptr)
        skipped->push_back(rel.generic_string() + ": " + t.error().message.substr(t.error().message.find(": ") + 2));
      continue;
    }
    t->level = level_of(rel);
    out.push_back(std::move(*t));
  }
  std::sort(out.begin(), out.end(), [](const task& a, const task& b) {
    return std::tie(a.level, a.number, a.name) < std::tie(b.level, b.number, b.name);
  });
  return out;
}

std::string normalize_source(const std::string& source) {
  std::string out;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    if (line.empty())
      continue;
    out += line;
    out += '\n';
  }
  return out;
}

} // namespace crucible::env
