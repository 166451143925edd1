// Renders a parsed chat template: statements and expressions evaluated with Jinja's scoping
// (a for loop's body and a macro's body get scopes of their own, an if's does not), bounded by the
// limits of jinja_value.h.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/chat/jinja_ast.h"

namespace specrun::chat::jinja {

// Why a rendering failed, and the template line it was at.
struct RenderError {
  std::string message;
  int line = 0;
};

// `context` must be an object; its members are the template's variables, in their order (Python
// dicts keep insertion order, and templates can see it). Throws RenderError.
std::string render_template(const std::vector<StmtPtr>& program,
                            const nlohmann::ordered_json& context);

}  // namespace specrun::chat::jinja
