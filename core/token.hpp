// core/token.hpp: the shared secret with which nodes join a run (docs/scaling.md): read from a
// file that only its owner (and group) may read, or created with a fresh random value.
#pragma once

#include <filesystem>
#include <string>

#include "core/error.hpp"

namespace crucible {

/// Reads a token file: its first line, surrounding whitespace removed. errc::not_found for a
/// missing file, errc::io for an unreadable one, errc::invalid_arg for an empty token or a file
/// that others (neither its owner nor its group) may read or write ("chmod 600 FILE"). Every
/// message names the file.
result<std::string> read_token_file(const std::filesystem::path& file);

/// Creates `file` (mode 0600; its directory must exist) holding a fresh token of 64 hex digits
/// from the system's random source, and returns the token. errc::busy when the file exists
/// already, errc::io for any other failure; messages name the file.
result<std::string> create_token_file(const std::filesystem::path& file);

} // namespace crucible
