#include "runtime/chat/chat_template.h"

#include <cstdio>
#include <vector>

#include "runtime/chat/jinja_ast.h"
#include "runtime/chat/jinja_eval.h"
#include "runtime/chat/jinja_parser.h"
#include "specrun/error.hpp"

namespace specrun::chat {

struct ChatTemplate::Program {
  std::string origin;
  std::vector<jinja::StmtPtr> statements;
};

namespace {

// Errors are one line: control characters in a message (a template's raise_exception text may
// hold newlines) are written as escapes.
std::string one_line(const std::string& message) {
  std::string out;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

std::string where(const std::string& origin, int line) {
  if (line <= 0) return origin + ": chat_template: ";
  return origin + ": chat_template line " + std::to_string(line) + ": ";
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}

ChatTemplate ChatTemplate::compile(const std::string& source, const std::string& origin) {
  auto program = std::make_shared<Program>();
  program->origin = origin;
  try {
    program->statements = jinja::parse_template(source);
  } catch (const jinja::SyntaxError& error) {
    throw Error(where(origin, error.line) + one_line(error.message));
  }
  return ChatTemplate(std::move(program));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  try {
    return jinja::render_template(program_->statements, context);
  } catch (const jinja::RenderError& error) {
    throw Error(where(program_->origin, error.line) + one_line(error.message));
  }
}

}  // namespace specrun::chat
