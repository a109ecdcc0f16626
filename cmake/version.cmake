# Run at build time (cmake -P): writes ${OUT} with the project's version and the source tree's
# commit. configure_file rewrites it only when the text changes, so a build at the same commit
# recompiles nothing, and a new commit recompiles one file and relinks the four binaries.
find_program(GIT git)
set(SM_COMMIT "unknown")
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SRC} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE SM_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0 OR SM_COMMIT STREQUAL "")
    set(SM_COMMIT "unknown")
  else()
    execute_process(COMMAND ${GIT} -C ${SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT dirty STREQUAL "")
      string(APPEND SM_COMMIT "-dirty")
    endif()
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
