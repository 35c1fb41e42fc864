# cmake -DSPARQ_ROOT=<repo> -DSTAMP=<file> -P check_includes.cmake
# Fails when an #include (or a HWY_TARGET_INCLUDE) in the repository's code could leave the
# include roots that keep each room to itself (CMakeLists.txt, "one target per room"): a "../"
# path, or an absolute one. Repo-root-relative paths ("src/formats/nm_codec.h", "sparq/format.h")
# and names beside the including file ("nm_codec.h") are the only spellings.
file(GLOB_RECURSE files
     ${SPARQ_ROOT}/src/*.cc ${SPARQ_ROOT}/src/*.h ${SPARQ_ROOT}/src/*.cu ${SPARQ_ROOT}/include/*.h
     ${SPARQ_ROOT}/tools/*.cc ${SPARQ_ROOT}/tools/*.h ${SPARQ_ROOT}/tests/*.cc ${SPARQ_ROOT}/tests/*.h
     ${SPARQ_ROOT}/bench/*.cc ${SPARQ_ROOT}/bench/*.h ${SPARQ_ROOT}/fuzz/*.cc ${SPARQ_ROOT}/fuzz/*.h
     ${SPARQ_ROOT}/python/*.cc)
set(bad "")
foreach(f ${files})
  file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*(include|define[ \t]+HWY_TARGET_INCLUDE)[ \t]")
  foreach(line ${lines})
    if(line MATCHES "[\"<]([^\">]*)[\">]")
      set(path "${CMAKE_MATCH_1}")
      if(path MATCHES "(^|/)\\.\\.(/|$)" OR path MATCHES "^/")
        file(RELATIVE_PATH rel ${SPARQ_ROOT} ${f})
        string(APPEND bad "  ${rel}: ${line}\n")
      endif()
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "These includes leave their room's include root (spell them from the "
                      "repository root, e.g. \"src/formats/nm_codec.h\" or \"sparq/format.h\"):\n${bad}")
endif()
file(TOUCH ${STAMP})
