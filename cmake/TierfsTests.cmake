# Test registration: the one way a *_test.cc becomes a test.
#
#   tierfs_add_tests(LIBS lib...)
#       Registers every *_test.cc in the calling directory: one GoogleTest
#       executable per file (named after the file), linked with LIBS, gtest_main
#       and the project's warning flags; its cases are discovered into ctest.
#
#   tierfs_check_all_tests_registered()
#       Called once at the end of the top-level CMakeLists: globs every *_test.cc
#       under the source tree and stops the configure step, naming the files, if
#       any was never registered. A test cannot be left out of the build silently.

find_package(GTest REQUIRED)
include(GoogleTest)
enable_testing()

function(tierfs_add_tests)
  cmake_parse_arguments(ARG "" "" "LIBS" ${ARGN})
  file(GLOB tests CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc")
  foreach(src IN LISTS tests)
    get_filename_component(stem ${src} NAME_WE)
    file(RELATIVE_PATH rel_dir ${TIERFS_ROOT} ${CMAKE_CURRENT_SOURCE_DIR})
    string(REPLACE "/" "_" prefix "${rel_dir}")
    set(target "${prefix}_${stem}")
    add_executable(${target} ${src})
    target_link_libraries(${target} PRIVATE ${ARG_LIBS} GTest::gtest_main tierfs_warnings)
    set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    gtest_discover_tests(${target} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${target}."
                         PROPERTIES TIMEOUT 300)
    set_property(GLOBAL APPEND PROPERTY TIERFS_REGISTERED_TESTS ${src})
  endforeach()
endfunction()

function(tierfs_check_all_tests_registered)
  file(GLOB_RECURSE all_tests CONFIGURE_DEPENDS "${TIERFS_ROOT}/*_test.cc")
  list(FILTER all_tests EXCLUDE REGEX "^${TIERFS_ROOT}/(build[^/]*|\\.git)/")
  get_property(registered GLOBAL PROPERTY TIERFS_REGISTERED_TESTS)
  set(missing "")
  foreach(t IN LISTS all_tests)
    if(NOT t IN_LIST registered)
      list(APPEND missing ${t})
    endif()
  endforeach()
  if(missing)
    list(JOIN missing "\n  " text)
    message(FATAL_ERROR "test files not registered with tierfs_add_tests():\n  ${text}")
  endif()
endfunction()
