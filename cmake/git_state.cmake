# Writes OUT, a header naming the commit the build is from and whether the
# work tree had changes to tracked files not yet committed. Run at every
# build (a value taken when CMake configures goes stale with the next edit);
# the file is rewritten only when its text changes, so an unchanged tree
# rebuilds nothing.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
endif()
if(NOT rc EQUAL 0)
  set(dirty -1)  # not a git work tree: unknown
elseif(changes)
  set(dirty 1)
else()
  set(dirty 0)
endif()
set(text "// Generated at build time by cmake/git_state.cmake.\n#pragma once\n#define STRATA_GIT_COMMIT \"${commit}\"\n#define STRATA_GIT_DIRTY ${dirty}  // 1: uncommitted changes to tracked files; 0: none; -1: unknown\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
