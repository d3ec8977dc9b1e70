# `cmake --install` of the Python package alone (component python) into a temporary prefix; the
# installed package (not the build tree's) imports and runs a layer. Run with cmake -P:
#   -DBUILD_DIR=<build> -DWORK_DIR=<scratch> -DPYTHON=<interpreter> -DPACKAGE_DIR=<dir below prefix>
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR} --component python
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install --component python failed (${rc}):\n${out}\n${err}")
endif()
set(ENV{PYTHONPATH} ${WORK_DIR}/${PACKAGE_DIR})
execute_process(COMMAND ${PYTHON} -c [=[
import os, sys, torch, coupledqk
assert os.path.realpath(coupledqk.__file__).startswith(os.path.realpath(os.environ["PYTHONPATH"])), coupledqk.__file__
y = coupledqk.CoupledAttention(16, 4, "leapfrog", 2, dtype=torch.float64)(torch.randn(2, 3, 16, dtype=torch.float64))
assert y.shape == (2, 3, 16) and torch.isfinite(y).all()
print("installed package ok:", coupledqk.__file__)
]=] WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed package does not import (${rc}):\n${out}\n${err}")
endif()
message(STATUS "${out}")
