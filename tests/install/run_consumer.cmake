# cmake -DEVENEP_BUILD_DIR=... -DCONSUMER_SOURCE_DIR=... -DWORK_DIR=... [-DGENERATOR=...] [-DCXX_COMPILER=...]
#       [-DCXX_LAUNCHER=...] -P run_consumer.cmake
# Installs the build's `evenep` component into WORK_DIR/prefix, checks that the private headers stayed out, then
# configures, builds and runs the consumer project against that prefix alone.
foreach(_var EVENEP_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT ${_var})
    message(FATAL_ERROR "run_consumer.cmake: ${_var} is not set")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${_rc}): ${ARGN}")
  endif()
endfunction()

set(_prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run_step("install" ${CMAKE_COMMAND} --install ${EVENEP_BUILD_DIR} --prefix ${_prefix} --component evenep)

# The contract is installed; what only src/ and the tests need (src/include) is not.
foreach(_header evenep/plan.hpp evenep/validate.hpp evenep/cpu/oracle.hpp evenep/detail/ep_layout.hpp)
  if(NOT EXISTS ${_prefix}/include/${_header})
    message(FATAL_ERROR "install_consumer: public header ${_header} was not installed")
  endif()
endforeach()
foreach(_header evenep/detail/plan_candidates.hpp evenep/detail/plan_sparse.hpp evenep/detail/gemm_cost.hpp
                evenep/cuda/detail/launchers.hpp evenep/cuda/detail/ep_hooks.hpp)
  if(EXISTS ${_prefix}/include/${_header})
    message(FATAL_ERROR "install_consumer: private header ${_header} was installed")
  endif()
endforeach()

set(_configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${_prefix}
               -DCMAKE_BUILD_TYPE=Release)
if(GENERATOR)
  list(APPEND _configure -G ${GENERATOR})
endif()
if(CXX_COMPILER)
  list(APPEND _configure -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(CXX_LAUNCHER)
  list(APPEND _configure -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
run_step("configure" ${_configure})
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run" ${WORK_DIR}/build/evenep_consumer)
