# ccache when present. Precompiled headers need ccache's pch sloppiness to be cacheable.
find_program(CRUCIBLE_CCACHE ccache)
if(CRUCIBLE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" ${CRUCIBLE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CRUCIBLE_CCACHE})
  message(STATUS "crucible: compiling through ${CRUCIBLE_CCACHE}")
endif()
