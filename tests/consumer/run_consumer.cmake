# Builds and runs the tiny consumer project in tests/consumer/project, either through
# find_package on a temporary install of coupledqk (MODE=find_package) or through
# add_subdirectory (MODE=add_subdirectory). Run with cmake -P.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

set(consumer ${SOURCE_DIR}/tests/consumer/project)
if(MODE STREQUAL "find_package")
  # Install coupledqk alone (no tests, examples or benchmarks) into a temporary prefix.
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR}
      -DCOUPLEDQK_BUILD_TESTS=OFF -DCOUPLEDQK_BUILD_EXAMPLES=OFF -DCOUPLEDQK_BUILD_BENCHMARKS=OFF
      -DCOUPLEDQK_INSTALL=ON -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_MODE=find_package)
else()
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app -G ${GENERATOR}
      -DCONSUMER_MODE=add_subdirectory -DCOUPLEDQK_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/app)
run(${WORK_DIR}/app/consumer)
