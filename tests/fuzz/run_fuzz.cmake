# Runs the plan-file fuzzer for a bounded time on a fresh corpus seeded with one real plan.
file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR}/corpus)
execute_process(COMMAND ${SEEDER} ${WORKDIR}/corpus/seed.plan RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not write the seed plan")
endif()
execute_process(COMMAND ${FUZZER} -max_total_time=20 -rss_limit_mb=2048 -max_len=65536
                        -artifact_prefix=${WORKDIR}/ ${WORKDIR}/corpus
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the plan-file fuzzer found a crash (artifacts in ${WORKDIR})")
endif()
file(REMOVE_RECURSE ${WORKDIR})
message("plan-file fuzzer: no crash in 20 s")
