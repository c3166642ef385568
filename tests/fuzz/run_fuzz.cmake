# SPDX-License-Identifier: Apache-2.0
# Runs one libFuzzer target for SECONDS on a fresh copy of its seed corpus (ctest fuzz.NAME).
#   FUZZER   the fuzzer binary          WORKDIR  a scratch folder (removed when no crash)
#   NAME     for messages               SECONDS  how long
#   CORPUS   the committed seeds (tests/fuzz/corpus/NAME), optional
#   SEEDER   a program writing one more seed to its argument, optional (plan_file: a real plan)
# A crash, a leak, an input running over 10 s or over 2 GiB fails the test; the input is kept
# in WORKDIR (crash-*, timeout-*, ...) to be replayed with `FUZZER INPUT`.
file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR}/corpus)
if(CORPUS)
  file(GLOB seeds ${CORPUS}/*)
  if(NOT seeds)
    message(FATAL_ERROR "${NAME}: no seeds in ${CORPUS}")
  endif()
  file(COPY ${seeds} DESTINATION ${WORKDIR}/corpus)
endif()
if(SEEDER)
  execute_process(COMMAND ${SEEDER} ${WORKDIR}/corpus/seeder-output RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NAME}: the seeder ${SEEDER} failed")
  endif()
endif()
execute_process(COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
                        -max_len=65536 -artifact_prefix=${WORKDIR}/ ${WORKDIR}/corpus
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME} fuzzer: a finding (the input is in ${WORKDIR})")
endif()
file(REMOVE_RECURSE ${WORKDIR})
message("${NAME} fuzzer: no finding in ${SECONDS} s")
