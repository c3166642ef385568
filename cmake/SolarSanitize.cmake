# SPDX-License-Identifier: Apache-2.0
# SOLAR_SANITIZE=address|thread|undefined: everything built with that sanitizer (scripts/sanitize
# configures build-asan, build-tsan or build-ubsan with it and runs the tests that can run under
# it). Empty (the default): no sanitizer.
#
# Not sanitized, whatever SOLAR_SANITIZE says:
# - interpose/ (libsolar_preload.so): LD_PRELOADed into unsanitized programs (the job's Python
#   ranks and DataLoader workers). An ASan-built preload library needs the ASan runtime loaded
#   before it and everything else ("ASan runtime does not come first in initial library list"),
#   and the TSan runtime cannot be loaded after a program has started at all; built plainly it
#   is the library every test of the transparent mode (integration.data_path) preloads.
# - spank/ (solar_spank.so) is not built: srun and root's slurmstepd load it with dlopen, and
#   neither can take a sanitizer runtime that way (nor is slurmstepd a place for one).
# - the plan-file fuzzer (tests/fuzz, clang's libFuzzer with its own ASan/UBSan) is not built.
# - the Debian package tests (tests/install) are not registered: a package of a sanitized build
#   is not what is shipped.
set(SOLAR_SANITIZE "" CACHE STRING
    "Build with a sanitizer: address, thread or undefined (empty: none); see scripts/sanitize")
set_property(CACHE SOLAR_SANITIZE PROPERTY STRINGS "" address thread undefined)

set(SOLAR_SANITIZE_COMPILE_FLAGS "")
set(SOLAR_SANITIZE_LINK_FLAGS "")
# Where the runtime lies (libasan.so for address): a test that loads libsolar into an unsanitized
# program (Python) preloads it (python/CMakeLists.txt).
set(SOLAR_SANITIZE_RUNTIME "")
if(SOLAR_SANITIZE)
  if(NOT SOLAR_SANITIZE MATCHES "^(address|thread|undefined)$")
    message(FATAL_ERROR "SOLAR_SANITIZE=${SOLAR_SANITIZE}: use address, thread, undefined or nothing")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "SOLAR_SANITIZE needs gcc or clang (${CMAKE_CXX_COMPILER_ID} found)")
  endif()
  set(SOLAR_SANITIZE_COMPILE_FLAGS -fsanitize=${SOLAR_SANITIZE} -fno-omit-frame-pointer -g)
  set(SOLAR_SANITIZE_LINK_FLAGS -fsanitize=${SOLAR_SANITIZE})
  if(SOLAR_SANITIZE STREQUAL "undefined")
    # Every finding is an error that ends the program (and fails its test), not a message.
    list(APPEND SOLAR_SANITIZE_COMPILE_FLAGS -fno-sanitize-recover=undefined)
    list(APPEND SOLAR_SANITIZE_LINK_FLAGS -fno-sanitize-recover=undefined)
  endif()
  set(runtime_name "")
  if(SOLAR_SANITIZE STREQUAL "address")
    set(runtime_name libasan.so)
  elseif(SOLAR_SANITIZE STREQUAL "thread")
    set(runtime_name libtsan.so)
  endif()
  if(runtime_name)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${runtime_name}
                    OUTPUT_VARIABLE SOLAR_SANITIZE_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
    get_filename_component(SOLAR_SANITIZE_RUNTIME "${SOLAR_SANITIZE_RUNTIME}" REALPATH)
    # Preloaded after the runtime: ASan intercepts __cxa_throw when it starts, which in a
    # program without libstdc++ (Python) finds nothing, and the first C++ exception thrown in
    # libsolar then stops the process ("CHECK failed ... real___cxa_throw").
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                    OUTPUT_VARIABLE SOLAR_SANITIZE_LIBSTDCXX OUTPUT_STRIP_TRAILING_WHITESPACE)
    get_filename_component(SOLAR_SANITIZE_LIBSTDCXX "${SOLAR_SANITIZE_LIBSTDCXX}" REALPATH)
  endif()
  add_compile_options(${SOLAR_SANITIZE_COMPILE_FLAGS})
  add_link_options(${SOLAR_SANITIZE_LINK_FLAGS})
  message(STATUS "SOLAR_SANITIZE=${SOLAR_SANITIZE}: ${SOLAR_SANITIZE_COMPILE_FLAGS} (not: "
                 "interpose/, spank/, the fuzzer, the package tests; see cmake/SolarSanitize.cmake)")
endif()

# Called by a directory whose targets must stay unsanitized (interpose/): takes the flags back
# out of its (inherited) directory properties.
macro(solar_no_sanitize)
  if(SOLAR_SANITIZE)
    get_directory_property(_solar_opts COMPILE_OPTIONS)
    list(REMOVE_ITEM _solar_opts ${SOLAR_SANITIZE_COMPILE_FLAGS})
    set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_solar_opts}")
    get_directory_property(_solar_opts LINK_OPTIONS)
    list(REMOVE_ITEM _solar_opts ${SOLAR_SANITIZE_LINK_FLAGS})
    set_directory_properties(PROPERTIES LINK_OPTIONS "${_solar_opts}")
  endif()
endmacro()
