# Writes a C++ source file that holds a file's bytes, for the chat page that `specrun serve`
# serves (CMakeLists.txt): the bytes are written as numbers, so the file needs no escaping,
# whatever characters it holds.
#   cmake -DINPUT=page.html -DOUTPUT=page.cpp -DHEADER=runtime/server/page.h -DFUNCTION=page
#         -P embed_file.cmake
# OUTPUT defines `std::string_view specrun::server::FUNCTION()`, declared in HEADER.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" digits)
if(digits EQUAL 0)
  message(FATAL_ERROR "embed_file.cmake: ${INPUT} is empty")
endif()
# Sixteen bytes a line, each as 0xNN.
set(lines "")
math(EXPR last "${digits} - 1")
foreach(at RANGE 0 ${last} 32)
  string(SUBSTRING "${hex}" ${at} 32 line)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1, " line "${line}")
  string(STRIP "${line}" line)
  string(APPEND lines "    ${line}\n")
endforeach()
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp"
  "// Generated at build time from ${name} by embed_file.cmake: edit that file instead.\n"
  "#include \"${HEADER}\"\n\n"
  "namespace specrun::server {\n"
  "namespace {\n\n"
  "constexpr unsigned char kBytes[] = {\n${lines}};\n\n"
  "}  // namespace\n\n"
  "std::string_view ${FUNCTION}() {\n"
  "  return {reinterpret_cast<const char*>(kBytes), sizeof(kBytes)};\n"
  "}\n\n"
  "}  // namespace specrun::server\n")
# Rewritten only when it changed, so that an unchanged page compiles nothing again.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
