# SPDX-License-Identifier: Apache-2.0
# kvferry::hiredis, kvferry::yaml and kvferry::uring: the libraries behind the remote
# tier, config files and the file tier, as imported targets found by name on the machine at hand. The
# build links them (privately into the shared library, publicly through the
# static one), and the installed package config includes this file to find
# them again on the consumer's machine, so that no exported target carries
# a path from the machine that built it.

# kvf_import_library(TARGET NAME [HINTS dir...]): TARGET, an imported
# target for libNAME, unless it exists already; leaves TARGET undefined
# where libNAME is not found.
function(kvf_import_library target name)
  cmake_parse_arguments(arg "" "" "HINTS" ${ARGN})
  if(TARGET ${target})
    return()
  endif()
  string(TOUPPER "KVF_LIB_${name}" var)
  find_library(${var} NAMES ${name} HINTS ${arg_HINTS})
  if(${var})
    add_library(${target} UNKNOWN IMPORTED)
    set_target_properties(${target} PROPERTIES IMPORTED_LOCATION "${${var}}")
  endif()
endfunction()
