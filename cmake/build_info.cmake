# Regenerates core/build_info.h at build time (cmake -P), so the source
# revision a manifest records is the tree being built, not the tree at the
# last configure. The file is replaced only when its content changes, so an
# unchanged tree recompiles nothing.
#   inputs (-D): LS_SRC, LS_OUT, PROJECT_VERSION, CMAKE_BUILD_TYPE,
#   CMAKE_C_COMPILER_ID, CMAKE_C_COMPILER_VERSION, LS_FLAGS_STRING,
#   CMAKE_CUDA_COMPILER_ID, CMAKE_CUDA_COMPILER_VERSION
# A tree copied without its git metadata (a device run, a release tarball)
# names its revision through the environment variable LOCKSTEP_SOURCE_REVISION.
set(LS_SOURCE_REVISION "$ENV{LOCKSTEP_SOURCE_REVISION}")
if(LS_SOURCE_REVISION STREQUAL "")
  execute_process(COMMAND git -C ${LS_SRC} rev-parse HEAD
                  OUTPUT_VARIABLE LS_SOURCE_REVISION OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE LS_GIT_RESULT)
  if(NOT LS_GIT_RESULT EQUAL 0 OR LS_SOURCE_REVISION STREQUAL "")
    set(LS_SOURCE_REVISION "unknown")
  else()
    execute_process(COMMAND git -C ${LS_SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE LS_GIT_DIRTY OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT LS_GIT_DIRTY STREQUAL "")
      set(LS_SOURCE_REVISION "${LS_SOURCE_REVISION}-dirty")
    endif()
  endif()
endif()
configure_file(${LS_SRC}/src/core/build_info.h.in ${LS_OUT}.new @ONLY)
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${LS_OUT}.new ${LS_OUT})
file(REMOVE ${LS_OUT}.new)
