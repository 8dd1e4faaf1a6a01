// storage/atomic_file.hpp: whole-file replacement that a crash cannot leave half-written. The
// implementation lives in core/file_io.hpp (policy needs it too and may not depend on storage);
// storage code keeps calling it by these names.
#pragma once

#include "core/file_io.hpp"

namespace crucible::storage {

using crucible::fsync_directory;
using crucible::read_file;
using crucible::write_file_atomic;

} // namespace crucible::storage
