# Writes OUTPUT: #define COUPLEDQK_CODE_VERSION "<git describe --always --dirty of SOURCE_DIR>"
# ("unknown" outside a git checkout). The file is rewritten only when the text changes, so the
# translation unit that includes it is recompiled only then.
execute_process(
  COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
  OUTPUT_VARIABLE _version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR _version STREQUAL "")
  set(_version "unknown")
endif()
set(_text "#pragma once\n#define COUPLEDQK_CODE_VERSION \"${_version}\"\n")
set(_old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" _old)
endif()
if(NOT _old STREQUAL _text)
  file(WRITE "${OUTPUT}" "${_text}")
endif()
