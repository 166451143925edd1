// Parses a chat template into statements with Jinja 2's grammar and precedence, and refuses what
// the renderer does not support (a tag, filter, test, method or function outside the subset) with
// a SyntaxError naming it and its line.
#pragma once

#include <string_view>
#include <vector>

#include "runtime/chat/jinja_ast.h"
#include "runtime/chat/jinja_lexer.h"

namespace specrun::chat::jinja {

// Throws SyntaxError.
std::vector<StmtPtr> parse_template(std::string_view source);

// The filters, tests and methods the renderer implements (jinja_eval.cpp), which the parser
// accepts.
bool is_supported_filter(std::string_view name);
bool is_supported_test(std::string_view name);

}  // namespace specrun::chat::jinja
