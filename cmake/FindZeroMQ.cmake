# FindZeroMQ: libzmq and the header-only cppzmq binding (zmq.hpp).
# Defines ZeroMQ::zmq (libzmq with cppzmq's headers) and ZeroMQ_FOUND.
find_path(ZeroMQ_INCLUDE_DIR NAMES zmq.h PATH_SUFFIXES include)
find_path(ZeroMQ_CPP_INCLUDE_DIR NAMES zmq.hpp PATH_SUFFIXES include)
find_library(ZeroMQ_LIBRARY NAMES zmq libzmq PATH_SUFFIXES lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ZeroMQ REQUIRED_VARS ZeroMQ_LIBRARY ZeroMQ_INCLUDE_DIR ZeroMQ_CPP_INCLUDE_DIR)

if(ZeroMQ_FOUND AND NOT TARGET ZeroMQ::zmq)
  add_library(ZeroMQ::zmq UNKNOWN IMPORTED)
  set_target_properties(ZeroMQ::zmq PROPERTIES
    IMPORTED_LOCATION "${ZeroMQ_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZeroMQ_INCLUDE_DIR};${ZeroMQ_CPP_INCLUDE_DIR}")
endif()
mark_as_advanced(ZeroMQ_INCLUDE_DIR ZeroMQ_CPP_INCLUDE_DIR ZeroMQ_LIBRARY)
