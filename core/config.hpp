// core/config.hpp: the typed run configuration, decoded once from YAML (plus --set overrides)
// and passed down by value. Every key, its type, default and meaning is declared once, in
// config.cpp's describe(); decoding, the resolved YAML and docs/configuration.md all come from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"

namespace crucible {

/// `run:` — naming and placing the run.
struct run_options {
  std::string name = "quickstart"; ///< run directory is `dir/name`
  std::string dir = "runs";        ///< parent of run directories (relative to the working dir)
  std::uint64_t seed = 0;          ///< root of every random stream in the run
};

/// `log:` — levels for stderr and for the run's events.log.
struct log_options {
  log_level level = log_level::info;       ///< stderr threshold
  log_level file_level = log_level::debug; ///< events.log threshold
};

/// `actors:` — the actor system of this process.
struct actor_options {
  std::int64_t threads = 0; ///< scheduler worker threads; 0: one per core
};

/// The whole configuration. Plain value; copy freely.
struct config {
  run_options run;
  log_options log;
  actor_options actors;
};

/// Decodes `yaml_text` (named `origin` in messages, e.g. "configs/x.yaml"), applying
/// `overrides` ("key.path=value", as given to --set) on top. Rejects unknown keys, wrong types
/// and invalid values; the error (errc::config) lists every problem, one per line, as
/// `origin:line: key.path: what is wrong` (or `--set key.path=value: ...` for an override).
result<config> parse_config(std::string_view yaml_text, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

/// Reads and decodes a file; errc::not_found / errc::io name the path.
result<config> load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides = {});

/// The configuration with every key, defaults included, as YAML that parse_config accepts.
std::string to_yaml(const config& cfg);

/// The reference of every key (type, default, meaning) as Markdown: docs/configuration.md.
std::string config_reference_markdown();

} // namespace crucible
