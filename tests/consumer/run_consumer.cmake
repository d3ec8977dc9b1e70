# Builds and runs the tiny consumer project in tests/consumer/project, either through
# find_package on a temporary install of coupledqk (MODE=find_package), through
# add_subdirectory (MODE=add_subdirectory), or (MODE=package) against the packages CPack makes:
# the .tar.gz and the .deb, each unpacked, used through find_package and through pkg-config alone
# (CXX: the compiler for the pkg-config build). Run with cmake -P.
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
set(lib_options -DCOUPLEDQK_BUILD_TESTS=OFF -DCOUPLEDQK_BUILD_EXAMPLES=OFF -DCOUPLEDQK_BUILD_BENCHMARKS=OFF
    -DCOUPLEDQK_PYTHON_PACKAGE=OFF -DCOUPLEDQK_INSTALL=ON)

if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR} ${lib_options})
  execute_process(COMMAND ${CMAKE_CPACK_COMMAND} -G "TGZ;DEB" WORKING_DIRECTORY ${WORK_DIR}/lib
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cpack failed (${rc}):\n${out}\n${err}")
  endif()
  file(GLOB tgz ${WORK_DIR}/lib/coupledqk-*.tar.gz)
  file(GLOB deb ${WORK_DIR}/lib/libcoupledqk-dev_*_all.deb)
  if(NOT tgz OR NOT deb)
    message(FATAL_ERROR "cpack made no coupledqk-*.tar.gz or libcoupledqk-dev_*_all.deb:\n${out}")
  endif()
  file(ARCHIVE_EXTRACT INPUT ${tgz} DESTINATION ${WORK_DIR}/tgz)
  file(GLOB tgz_prefix ${WORK_DIR}/tgz/coupledqk-*)
  run(dpkg-deb -x ${deb} ${WORK_DIR}/deb)
  set(deb_prefix ${WORK_DIR}/deb/usr)
  foreach(kind tgz deb)
    set(prefix ${${kind}_prefix})
    foreach(f include/coupledqk/attention.hpp include/coupledqk/registry.hpp share/pkgconfig/coupledqk.pc
              share/cmake/coupledqk/coupledqkConfig.cmake share/cmake/coupledqk/coupledqkConfigVersion.cmake)
      if(NOT EXISTS ${prefix}/${f})
        message(FATAL_ERROR "the ${kind} package has no ${f} (unpacked in ${prefix})")
      endif()
    endforeach()
    if(EXISTS ${prefix}/lib)
      message(FATAL_ERROR "the ${kind} package holds more than the headers: ${prefix}/lib")
    endif()
    # The .pc file is relocatable: its flags point into the unpacked folder.
    set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
    execute_process(COMMAND pkg-config --cflags coupledqk RESULT_VARIABLE rc OUTPUT_VARIABLE cflags
                    ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "pkg-config --cflags coupledqk failed for the ${kind} package: ${err}")
    endif()
    separate_arguments(cflags_${kind} UNIX_COMMAND "${cflags}")
    get_filename_component(include_dir ${prefix}/include REALPATH)
    set(found FALSE)
    foreach(flag ${cflags_${kind}})
      if(flag MATCHES "^-I(.*)$")
        get_filename_component(dir "${CMAKE_MATCH_1}" REALPATH)
        if(dir STREQUAL include_dir)
          set(found TRUE)
        endif()
      endif()
    endforeach()
    if(NOT found)
      message(FATAL_ERROR "pkg-config --cflags coupledqk gives '${cflags}', without -I${include_dir}")
    endif()
  endforeach()

  # Both packages hold the same files (checked above); one consumer build each, to keep the test
  # short: the .tar.gz through find_package, the .deb through pkg-config alone.
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app_tgz -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${tgz_prefix}
      -DCONSUMER_MODE=find_package -DCONSUMER_SOURCE=package_main.cpp)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/app_tgz)
  run(${WORK_DIR}/app_tgz/consumer)
  set(ENV{PKG_CONFIG_PATH} ${deb_prefix}/share/pkgconfig)
  execute_process(COMMAND pkg-config --modversion coupledqk OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE)
  run(${CXX} -std=c++17 -O1 ${cflags_deb} -DCOUPLEDQK_EXPECTED_VERSION="${version}" ${consumer}/package_main.cpp
      -o ${WORK_DIR}/consumer_pkg_config)
  run(${WORK_DIR}/consumer_pkg_config)

  # The version file refuses a version the package does not promise (SameMinorVersion).
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app_newer -G ${GENERATOR}
                  -DCMAKE_PREFIX_PATH=${tgz_prefix} -DCONSUMER_MODE=find_package -DCONSUMER_VERSION=0.2
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "version")
    message(FATAL_ERROR "find_package(coupledqk 0.2) accepted the 0.1 package (rc ${rc}): ${err}")
  endif()
  return()
endif()

if(MODE STREQUAL "find_package")
  # Install coupledqk alone (no tests, examples or benchmarks) into a temporary prefix.
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR} ${lib_options}
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_MODE=find_package)
else()
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/app -G ${GENERATOR}
      -DCONSUMER_MODE=add_subdirectory -DCOUPLEDQK_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/app)
run(${WORK_DIR}/app/consumer)
