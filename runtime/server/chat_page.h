// The chat page that `specrun serve` serves at GET /: chat_page.html, compiled into the binary
// (CMakeLists.txt writes its bytes into a generated source file at build time).
#pragma once

#include <string_view>

namespace specrun::server {

// The page's HTML (UTF-8), whole.
std::string_view chat_page();

}  // namespace specrun::server
