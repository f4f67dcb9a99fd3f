# `cmake --install <build> [--prefix P]` (component `evenep`): the public headers (include/evenep: the contract; the
# private ones live in src/include and stay out), the static libraries and a CMake package, so that a C++ project
# consumes EvenEP with
#
#   find_package(evenep CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE evenep::core)  # or evenep::cpu, evenep::cuda (CUDA builds), evenep::evenep
#
# Their dependencies are found again by the package (evenepConfig.cmake: fmt, nlohmann_json, Threads, CBC through
# pkg-config where core links it, CUDAToolkit for cuda; the NCCL library is linked by its absolute path).
# The Python wheel installs only its own component (`python`, pyproject.toml), none of this.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(_evenep_install_targets evenep_core evenep_pipeline)
set_target_properties(evenep_core PROPERTIES EXPORT_NAME core)
set_target_properties(evenep_pipeline PROPERTIES EXPORT_NAME pipeline)
foreach(_backend cpu cuda)
  if(TARGET evenep_${_backend})
    list(APPEND _evenep_install_targets evenep_${_backend})
    set_target_properties(evenep_${_backend} PROPERTIES EXPORT_NAME ${_backend})
  endif()
endforeach()
list(APPEND _evenep_install_targets evenep_all)
set_target_properties(evenep_all PROPERTIES EXPORT_NAME evenep)

install(TARGETS ${_evenep_install_targets} EXPORT evenepTargets COMPONENT evenep
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The CUDA backend's headers (include/evenep/cuda) only with its library.
set(_evenep_header_filter)
if(NOT TARGET evenep_cuda)
  set(_evenep_header_filter PATTERN cuda EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/evenep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT evenep
        ${_evenep_header_filter})

set(_evenep_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/evenep)
install(EXPORT evenepTargets NAMESPACE evenep:: DESTINATION ${_evenep_cmake_dir} COMPONENT evenep)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/evenepConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/evenepConfig.cmake INSTALL_DESTINATION ${_evenep_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/evenepConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/evenepConfig.cmake ${PROJECT_BINARY_DIR}/evenepConfigVersion.cmake
        DESTINATION ${_evenep_cmake_dir} COMPONENT evenep)
