#include "runtime/chat/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

namespace specrun::chat::jinja {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "first",
    "float",   "indent",     "int",    "items",  "join",       "last",     "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse",    "round",  "select", "selectattr", "sort",     "string",
    "sum",     "title",      "tojson", "trim",   "unique",     "upper",
};

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",          "equalto",
    "even",    "false",    "float",    "ge",          "greaterthan", "gt",
    "in",      "integer",  "iterable", "le",          "lessthan",    "lower",
    "lt",      "mapping",  "ne",       "none",        "number",      "odd",
    "sameas",  "sequence", "string",   "true",        "undefined",   "upper",
    "==",      "!=",       "<",        "<=",          ">",           ">=",
};

// Methods of Python's str, list and dict that the renderer does not implement (the sandbox makes
// the mutating ones unusable anyway): a call to one is refused when the template is compiled.
constexpr std::string_view kUnsupportedMethods[] = {
    "append",   "clear",  "encode",       "expandtabs",  "extend",  "format",    "format_map",
    "fromkeys", "insert", "isidentifier", "isprintable", "istitle", "maketrans", "pop",
    "popitem",  "remove", "reverse",      "setdefault",  "sort",    "translate", "update",
};

// Jinja globals the renderer does not provide.
constexpr std::string_view kUnsupportedFunctions[] = {"cycler", "joiner", "lipsum"};

// Tags of Jinja that the renderer does not implement.
constexpr std::string_view kUnsupportedTags[] = {"autoescape", "block",  "call",   "extends",
                                                 "from",       "import", "include"};

bool contains(std::initializer_list<std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

template <size_t N>
bool contains(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::vector<StmtPtr> parse() {
    std::vector<StmtPtr> body = parse_body({});
    return body;
  }

 private:
  // ---- tokens --------------------------------------------------------------------------------

  const Token& current() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  bool is_op(std::string_view op) const {
    return current().type == TokenType::kOperator && current().text == op;
  }
  bool is_name(std::string_view name) const {
    return current().type == TokenType::kName && current().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw SyntaxError{message, current().line};
  }
  [[noreturn]] void fail_at(const std::string& message, int line) const {
    throw SyntaxError{message, line};
  }

  static std::string describe(const Token& token) {
    switch (token.type) {
      case TokenType::kData:
        return "template text";
      case TokenType::kVariableBegin:
        return "'{{'";
      case TokenType::kVariableEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kString:
        return "a string";
      case TokenType::kEnd:
        return "the end of the template";
      default:
        return "'" + token.text + "'";
    }
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(current()));
  }
  void expect(TokenType type, std::string_view what) {
    if (current().type != type) {
      fail("expected " + std::string(what) + ", got " + describe(current()));
    }
    next();
  }
  std::string expect_identifier() {
    if (current().type != TokenType::kName) fail("expected a name, got " + describe(current()));
    return next().text;
  }

  // ---- statements ----------------------------------------------------------------------------

  // Statements until `{% tag` with tag one of `end_tags` (left as the current token), or the end
  // of the template when `end_tags` is empty.
  std::vector<StmtPtr> parse_body(std::initializer_list<std::string_view> end_tags,
                                  std::string_view opened_by = {}, int opened_at = 0) {
    std::vector<StmtPtr> body;
    while (true) {
      const Token& token = current();
      switch (token.type) {
        case TokenType::kData: {
          auto stmt = make_stmt(StmtType::kText, token.line);
          stmt->text = token.text;
          body.push_back(std::move(stmt));
          next();
          break;
        }
        case TokenType::kVariableBegin: {
          next();
          auto stmt = make_stmt(StmtType::kOutput, token.line);
          stmt->value = parse_tuple(false, true, {}, false);
          expect(TokenType::kVariableEnd, "'}}'");
          body.push_back(std::move(stmt));
          break;
        }
        case TokenType::kBlockBegin: {
          next();
          if (current().type == TokenType::kName && contains(end_tags, current().text)) {
            return body;
          }
          body.push_back(parse_statement());
          expect(TokenType::kBlockEnd, "'%}'");
          break;
        }
        case TokenType::kEnd:
          if (end_tags.size() > 0) {
            fail("unexpected end of template: the '" + std::string(opened_by) + "' on line " +
                 std::to_string(opened_at) + " is never closed (expected '{% " +
                 std::string(*end_tags.begin()) + " %}')");
          }
          return body;
        default:
          fail("unexpected " + describe(token));
      }
    }
  }

  // The `%}` closing a block's opening tag, then the block's body.
  std::vector<StmtPtr> body_after_tag(std::initializer_list<std::string_view> end_tags,
                                      std::string_view opened_by, int opened_at) {
    expect(TokenType::kBlockEnd, "'%}'");
    return parse_body(end_tags, opened_by, opened_at);
  }

  StmtPtr make_stmt(StmtType type, int line) {
    auto stmt = std::make_unique<Stmt>();
    stmt->type = type;
    stmt->line = line;
    return stmt;
  }

  // Counts the blocks open around the statement being parsed.
  class BlockGuard {
   public:
    explicit BlockGuard(Parser& parser) : parser_(parser) {
      if (++parser_.block_depth_ > kMaxBlockNesting) {
        parser_.fail("blocks nest deeper than " + std::to_string(kMaxBlockNesting));
      }
    }
    ~BlockGuard() { --parser_.block_depth_; }
    BlockGuard(const BlockGuard&) = delete;
    BlockGuard& operator=(const BlockGuard&) = delete;

   private:
    Parser& parser_;
  };

  // Loops and scopes around the statement being parsed, for break/continue and macros.
  struct Context {
    int loops = 0;
    int scopes = 0;
  };

  class ContextGuard {
   public:
    ContextGuard(Parser& parser, Context context) : parser_(parser), saved_(parser.context_) {
      parser_.context_ = context;
    }
    ~ContextGuard() { parser_.context_ = saved_; }
    ContextGuard(const ContextGuard&) = delete;
    ContextGuard& operator=(const ContextGuard&) = delete;

   private:
    Parser& parser_;
    Context saved_;
  };

  StmtPtr parse_statement() {
    if (current().type != TokenType::kName) fail("expected a tag name, got " + describe(current()));
    const Token& tag = current();
    const std::string name = tag.text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "with") return parse_with();
    if (name == "filter") return parse_filter_block();
    if (name == "print") return parse_print();
    if (name == "generation") return parse_generation();
    if (name == "break" || name == "continue") {
      if (context_.loops == 0) fail("'" + name + "' outside a loop");
      next();
      return make_stmt(name == "break" ? StmtType::kBreak : StmtType::kContinue, tag.line);
    }
    if (contains(kUnsupportedTags, name)) fail("unsupported tag '" + name + "'");
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      fail("unexpected '{% " + name + " %}'");
    }
    fail("unknown tag '" + name + "'");
  }

  StmtPtr parse_if() {
    BlockGuard guard(*this);
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kIf, line);
    ExprPtr test = parse_tuple(false, false, {}, false);
    while (true) {
      Branch branch;
      branch.test = std::move(test);
      branch.body = body_after_tag({"endif", "elif", "else"}, "if", line);
      stmt->branches.push_back(std::move(branch));
      const std::string tag = next().text;
      if (tag == "elif") {
        test = parse_tuple(false, false, {}, false);
        continue;
      }
      if (tag == "else") {
        Branch otherwise;
        otherwise.body = body_after_tag({"endif"}, "if", line);
        stmt->branches.push_back(std::move(otherwise));
        next();
      }
      return stmt;
    }
  }

  StmtPtr parse_for() {
    BlockGuard guard(*this);
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kFor, line);
    stmt->target = parse_target({"in"}, false);
    if (!skip_name("in")) fail("expected 'in', got " + describe(current()));
    stmt->value = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) stmt->condition = parse_expression(true);
    if (is_name("recursive")) fail("unsupported: recursive loops");
    {
      ContextGuard inside(*this, {context_.loops + 1, context_.scopes + 1});
      stmt->body = body_after_tag({"endfor", "else"}, "for", line);
    }
    if (next().text == "else") {
      stmt->else_body = body_after_tag({"endfor"}, "for", line);
      next();
    }
    return stmt;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    Target target = parse_target({}, true);
    if (skip_op("=")) {
      auto stmt = make_stmt(StmtType::kSet, line);
      stmt->target = std::move(target);
      stmt->value = parse_tuple(false, true, {}, false);
      return stmt;
    }
    BlockGuard guard(*this);
    auto stmt = make_stmt(StmtType::kSetBlock, line);
    stmt->target = std::move(target);
    if (is_op("|")) stmt->value = parse_filter(block_value(line), false);
    {
      ContextGuard inside(*this, {0, context_.scopes + 1});
      stmt->body = body_after_tag({"endset"}, "set", line);
    }
    next();
    return stmt;
  }

  StmtPtr parse_macro() {
    BlockGuard guard(*this);
    const int line = next().line;
    if (context_.scopes > 0) {
      fail(
          "macros may only be defined at the top level of the template (not inside a for, "
          "with, set, filter or macro block)");
    }
    auto stmt = make_stmt(StmtType::kMacro, line);
    stmt->name = expect_identifier();
    expect_op("(");
    while (!is_op(")")) {
      if (!stmt->parameters.empty()) expect_op(",");
      stmt->parameters.push_back(expect_identifier());
      if (skip_op("=")) {
        stmt->defaults.push_back(parse_expression(true));
      } else if (!stmt->defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
    {
      ContextGuard inside(*this, {0, context_.scopes + 1});
      stmt->body = body_after_tag({"endmacro"}, "macro", line);
    }
    next();
    return stmt;
  }

  StmtPtr parse_with() {
    BlockGuard guard(*this);
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kWith, line);
    while (current().type != TokenType::kBlockEnd) {
      if (!stmt->assignments.empty()) expect_op(",");
      Target target = parse_target({}, false);
      expect_op("=");
      stmt->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    {
      ContextGuard inside(*this, {context_.loops, context_.scopes + 1});
      stmt->body = body_after_tag({"endwith"}, "with", line);
    }
    next();
    return stmt;
  }

  StmtPtr parse_filter_block() {
    BlockGuard guard(*this);
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kFilterBlock, line);
    stmt->value = parse_filter(block_value(line), true);
    {
      ContextGuard inside(*this, {0, context_.scopes + 1});
      stmt->body = body_after_tag({"endfilter"}, "filter", line);
    }
    next();
    return stmt;
  }

  // {% print a, b %} writes each expression (in a scope of its own, which no expression can
  // assign to).
  StmtPtr parse_print() {
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kScope, line);
    while (current().type != TokenType::kBlockEnd) {
      if (!stmt->body.empty()) expect_op(",");
      auto output = make_stmt(StmtType::kOutput, current().line);
      output->value = parse_expression(true);
      stmt->body.push_back(std::move(output));
    }
    return stmt;
  }

  // transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body (the
  // tracking of assistant spans only matters with return_assistant_tokens_mask).
  StmtPtr parse_generation() {
    BlockGuard guard(*this);
    const int line = next().line;
    auto stmt = make_stmt(StmtType::kScope, line);
    {
      ContextGuard inside(*this, {0, context_.scopes + 1});
      stmt->body = body_after_tag({"endgeneration"}, "generation", line);
    }
    next();
    return stmt;
  }

  ExprPtr block_value(int line) {
    auto expr = std::make_unique<Expr>();
    expr->type = ExprType::kBlockValue;
    expr->line = line;
    return expr;
  }

  // A name, names to unpack (`k, v` or `(k, v)`), or with `namespace_attribute` `ns.attr`.
  Target parse_target(std::initializer_list<std::string_view> end_names, bool namespace_attribute) {
    Target target;
    const bool parenthesized = skip_op("(");
    while (true) {
      if (current().type != TokenType::kName ||
          contains({"true", "false", "True", "False", "none", "None"}, current().text)) {
        fail("cannot assign to " + describe(current()));
      }
      target.names.push_back(next().text);
      if (namespace_attribute && is_op(".")) {
        if (target.names.size() > 1 || parenthesized) {
          fail("unsupported: a namespace attribute inside a tuple assignment");
        }
        next();
        target.attribute = expect_identifier();
        if (is_op(",")) fail("unsupported: a namespace attribute inside a tuple assignment");
        return target;
      }
      if (!skip_op(",")) break;
      target.unpack = true;
      const bool at_end =
          is_op(")") || current().type == TokenType::kBlockEnd ||
          (current().type == TokenType::kName && contains(end_names, current().text));
      if (at_end) break;
    }
    if (parenthesized) {
      target.unpack = true;
      expect_op(")");
    }
    if (is_op("(") || is_op("[")) fail("unsupported: nested unpacking in an assignment");
    return target;
  }

  // ---- expressions ---------------------------------------------------------------------------

  // Bounds the recursion of the expression parser, which nesting in the source drives.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& parser) : parser_(parser) {
      if (++parser_.expression_depth_ > kMaxExpressionDepth) {
        parser_.fail("expression nests deeper than " + std::to_string(kMaxExpressionDepth));
      }
    }
    ~DepthGuard() { --parser_.expression_depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& parser_;
  };

  ExprPtr node(ExprType type, int line, std::vector<ExprPtr> children = {}) {
    auto expr = std::make_unique<Expr>();
    expr->type = type;
    expr->line = line;
    expr->children = std::move(children);
    finish(*expr);
    return expr;
  }

  // Sets the node's depth from its children; refuses trees deeper than the evaluator may walk.
  void finish(Expr& expr) {
    int depth = 0;
    for (const auto& child : expr.children) {
      if (child) depth = std::max(depth, child->depth);
    }
    for (const auto& [name, child] : expr.keywords) depth = std::max(depth, child->depth);
    expr.depth = depth + 1;
    if (expr.depth > kMaxExpressionDepth) {
      fail_at("expression nests deeper than " + std::to_string(kMaxExpressionDepth), expr.line);
    }
  }

  ExprPtr literal(Value value, int line) {
    auto expr = node(ExprType::kLiteral, line);
    expr->value = std::move(value);
    return expr;
  }

  bool is_tuple_end(std::initializer_list<std::string_view> end_names) const {
    const Token& token = current();
    if (token.type == TokenType::kVariableEnd || token.type == TokenType::kBlockEnd) return true;
    if (token.type == TokenType::kOperator && token.text == ")") return true;
    return token.type == TokenType::kName && contains(end_names, token.text);
  }

  // Jinja's parse_tuple: an expression, or several separated by commas as a tuple.
  ExprPtr parse_tuple(bool primary_only, bool with_conditional,
                      std::initializer_list<std::string_view> end_names,
                      bool explicit_parentheses) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(end_names)) break;
      items.push_back(primary_only ? parse_primary() : parse_expression(with_conditional));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!explicit_parentheses) fail("expected an expression, got " + describe(current()));
    }
    return node(ExprType::kTuple, line, std::move(items));
  }

  ExprPtr parse_expression(bool with_conditional) {
    return with_conditional ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    int line = current().line;
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) {
        DepthGuard guard(*this);
        otherwise = parse_conditional();
      }
      std::vector<ExprPtr> children;
      children.push_back(std::move(expr));
      children.push_back(std::move(test));
      children.push_back(std::move(otherwise));
      expr = node(ExprType::kConditional, line, std::move(children));
      line = current().line;
    }
    return expr;
  }

  ExprPtr binary(ExprType type, int line, ExprPtr left, ExprPtr right, std::string name = {}) {
    std::vector<ExprPtr> children;
    children.push_back(std::move(left));
    children.push_back(std::move(right));
    auto expr = node(type, line, std::move(children));
    expr->name = std::move(name);
    return expr;
  }

  ExprPtr parse_or() {
    int line = current().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      left = binary(ExprType::kOr, line, std::move(left), parse_and());
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = current().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      left = binary(ExprType::kAnd, line, std::move(left), parse_not());
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const int line = next().line;
      std::vector<ExprPtr> children;
      children.push_back(parse_not());
      return node(ExprType::kNot, line, std::move(children));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = current().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> operators;
    while (true) {
      const Token& token = current();
      if (token.type == TokenType::kOperator &&
          contains({"==", "!=", "<", "<=", ">", ">="}, token.text)) {
        operators.push_back(next().text);
      } else if (skip_name("in")) {
        operators.push_back("in");
      } else if (is_name("not") && look().type == TokenType::kName && look().text == "in") {
        next();
        next();
        operators.push_back("notin");
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (operators.empty()) return first;
    std::vector<ExprPtr> children;
    children.push_back(std::move(first));
    for (auto& operand : operands) children.push_back(std::move(operand));
    auto expr = node(ExprType::kCompare, line, std::move(children));
    expr->operators = std::move(operators);
    return expr;
  }

  ExprPtr parse_math1() {
    int line = current().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      left = binary(ExprType::kBinary, line, std::move(left), parse_concat(), std::move(op));
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = current().line;
    std::vector<ExprPtr> parts;
    parts.push_back(parse_math2());
    while (skip_op("~")) parts.push_back(parse_math2());
    if (parts.size() == 1) return std::move(parts.front());
    return node(ExprType::kConcat, line, std::move(parts));
  }

  ExprPtr parse_math2() {
    int line = current().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      left = binary(ExprType::kBinary, line, std::move(left), parse_pow(), std::move(op));
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = current().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      left = binary(ExprType::kBinary, line, std::move(left), parse_unary(true), "**");
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const int line = current().line;
    ExprPtr expr;
    if (is_op("-") || is_op("+")) {
      const bool negate = next().text == "-";
      std::vector<ExprPtr> children;
      children.push_back(parse_unary(false));
      expr = node(negate ? ExprType::kNegate : ExprType::kPlus, line, std::move(children));
    } else {
      expr = parse_primary();
    }
    expr = parse_postfix(std::move(expr));
    if (with_filter) expr = parse_filter_expr(std::move(expr));
    return expr;
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    switch (token.type) {
      case TokenType::kName: {
        next();
        if (token.text == "true" || token.text == "True")
          return literal(make_bool(true), token.line);
        if (token.text == "false" || token.text == "False") {
          return literal(make_bool(false), token.line);
        }
        if (token.text == "none" || token.text == "None") return literal(make_none(), token.line);
        auto expr = node(ExprType::kName, token.line);
        expr->name = token.text;
        expr->value = make_undefined("'" + token.text + "' is undefined");
        return expr;
      }
      case TokenType::kString: {
        std::string text = next().text;
        while (current().type == TokenType::kString) text += next().text;
        if (text.size() > kMaxSourceBytes) fail("string literal too long");
        return literal(make_string(std::move(text)), token.line);
      }
      case TokenType::kInteger:
        next();
        return literal(make_int(token.integer), token.line);
      case TokenType::kFloat:
        next();
        return literal(make_float(token.number), token.line);
      case TokenType::kOperator:
        if (token.text == "(") {
          next();
          ExprPtr expr = parse_tuple(false, true, {}, true);
          expect_op(")");
          return expr;
        }
        if (token.text == "[") return parse_list();
        if (token.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail("unexpected " + describe(token));
  }

  ExprPtr parse_list() {
    const int line = next().line;
    std::vector<ExprPtr> items;
    while (!is_op("]")) {
      if (!items.empty()) expect_op(",");
      if (is_op("]")) break;
      items.push_back(parse_expression(true));
    }
    expect_op("]");
    return node(ExprType::kList, line, std::move(items));
  }

  ExprPtr parse_dict() {
    const int line = next().line;
    std::vector<ExprPtr> items;
    while (!is_op("}")) {
      if (!items.empty()) expect_op(",");
      if (is_op("}")) break;
      items.push_back(parse_expression(true));
      expect_op(":");
      items.push_back(parse_expression(true));
    }
    expect_op("}");
    return node(ExprType::kDict, line, std::move(items));
  }

  ExprPtr parse_postfix(ExprPtr expr) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        expr = parse_subscript(std::move(expr));
      } else if (is_op("(")) {
        expr = parse_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr expr) {
    while (true) {
      if (is_op("|")) {
        expr = parse_filter(std::move(expr), false);
      } else if (is_name("is")) {
        expr = parse_test(std::move(expr));
      } else if (is_op("(")) {
        expr = parse_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Token& token = next();
    std::vector<ExprPtr> children;
    children.push_back(std::move(object));
    if (token.text == ".") {
      const Token& attribute = next();
      if (attribute.type == TokenType::kName) {
        auto expr = node(ExprType::kGetAttr, token.line, std::move(children));
        expr->name = attribute.text;
        return expr;
      }
      if (attribute.type != TokenType::kInteger) {
        fail_at("expected a name or a number after '.'", attribute.line);
      }
      children.push_back(literal(make_int(attribute.integer), attribute.line));
      return node(ExprType::kGetItem, token.line, std::move(children));
    }
    std::vector<ExprPtr> keys;
    while (!is_op("]")) {
      if (!keys.empty()) expect_op(",");
      keys.push_back(parse_subscribed());
    }
    expect_op("]");
    if (keys.size() == 1) {
      children.push_back(std::move(keys.front()));
    } else {
      children.push_back(node(ExprType::kTuple, token.line, std::move(keys)));
    }
    return node(ExprType::kGetItem, token.line, std::move(children));
  }

  ExprPtr parse_subscribed() {
    const int line = current().line;
    std::vector<ExprPtr> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr expr = parse_expression(true);
      if (!skip_op(":")) return expr;
      parts.push_back(std::move(expr));
    }
    if (is_op(":") || is_op("]") || is_op(",")) {
      parts.push_back(nullptr);
    } else {
      parts.push_back(parse_expression(true));
    }
    if (skip_op(":")) {
      if (is_op("]") || is_op(",")) {
        parts.push_back(nullptr);
      } else {
        parts.push_back(parse_expression(true));
      }
    } else {
      parts.push_back(nullptr);
    }
    return node(ExprType::kSlice, line, std::move(parts));
  }

  // Positional and keyword arguments, into `expr`'s children (after the first) and keywords.
  void parse_arguments(Expr& expr) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail("unsupported: *args and **kwargs in calls");
      if (current().type == TokenType::kName && look().type == TokenType::kOperator &&
          look().text == "=") {
        std::string key = next().text;
        next();
        expr.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!expr.keywords.empty()) fail("positional argument follows keyword argument");
        expr.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
    finish(expr);
  }

  ExprPtr parse_call(ExprPtr callee) {
    const int line = current().line;
    if (callee->type == ExprType::kGetAttr && contains(kUnsupportedMethods, callee->name)) {
      fail("unsupported method '" + callee->name + "'");
    }
    if (callee->type == ExprType::kName && contains(kUnsupportedFunctions, callee->name)) {
      fail("unsupported function '" + callee->name + "'");
    }
    std::vector<ExprPtr> children;
    children.push_back(std::move(callee));
    auto expr = node(ExprType::kCall, line, std::move(children));
    parse_arguments(*expr);
    return expr;
  }

  // A filter name given as a literal to map(), or a test name to select() and friends, must be
  // one the renderer knows.
  void check_named_argument(const Expr& expr, size_t index, bool filter) {
    if (expr.children.size() <= index || !expr.children[index]) return;
    const Expr& argument = *expr.children[index];
    if (argument.type != ExprType::kLiteral || !argument.value.is_string()) return;
    const std::string& name = argument.value.text();
    if (filter ? !is_supported_filter(name) : !is_supported_test(name)) {
      fail_at(std::string(filter ? "unsupported filter '" : "unsupported test '") + name + "'",
              argument.line);
    }
  }

  ExprPtr parse_filter(ExprPtr operand, bool first_without_pipe) {
    while (is_op("|") || first_without_pipe) {
      if (!first_without_pipe) next();
      first_without_pipe = false;
      const Token& token = current();
      std::string name = expect_identifier();
      if (is_op(".")) fail("unsupported filter '" + name + "." + look().text + "'");
      if (!is_supported_filter(name)) fail_at("unsupported filter '" + name + "'", token.line);
      std::vector<ExprPtr> children;
      children.push_back(std::move(operand));
      auto expr = node(ExprType::kFilter, token.line, std::move(children));
      expr->name = std::move(name);
      if (is_op("(")) parse_arguments(*expr);
      if (expr->name == "map") {
        const bool by_attribute =
            expr->children.size() == 1 &&
            std::any_of(expr->keywords.begin(), expr->keywords.end(),
                        [](const auto& keyword) { return keyword.first == "attribute"; });
        if (!by_attribute) check_named_argument(*expr, 1, true);
      } else if (expr->name == "select" || expr->name == "reject") {
        check_named_argument(*expr, 1, false);
      } else if (expr->name == "selectattr" || expr->name == "rejectattr") {
        check_named_argument(*expr, 2, false);
      }
      operand = std::move(expr);
    }
    return operand;
  }

  ExprPtr parse_test(ExprPtr operand) {
    const int line = next().line;
    const bool negated = skip_name("not");
    const Token& token = current();
    if (token.type != TokenType::kName) fail("expected a test name, got " + describe(token));
    std::string name = next().text;
    if (is_op(".")) fail("unsupported test '" + name + "." + look().text + "'");
    if (!is_supported_test(name)) fail_at("unsupported test '" + name + "'", token.line);
    std::vector<ExprPtr> children;
    children.push_back(std::move(operand));
    auto expr = node(ExprType::kTest, line, std::move(children));
    expr->name = std::move(name);
    const Token& after = current();
    if (is_op("(")) {
      parse_arguments(*expr);
    } else if ((after.type == TokenType::kName || after.type == TokenType::kString ||
                after.type == TokenType::kInteger || after.type == TokenType::kFloat ||
                (after.type == TokenType::kOperator &&
                 (after.text == "(" || after.text == "[" || after.text == "{"))) &&
               !(after.type == TokenType::kName && contains({"else", "or", "and"}, after.text))) {
      if (is_name("is")) fail("cannot chain tests with 'is'");
      expr->children.push_back(parse_postfix(parse_primary()));
      finish(*expr);
    }
    if (!negated) return expr;
    std::vector<ExprPtr> wrapped;
    wrapped.push_back(std::move(expr));
    return node(ExprType::kNot, line, std::move(wrapped));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int block_depth_ = 0;
  int expression_depth_ = 0;
  Context context_;
};

}  // namespace

bool is_supported_filter(std::string_view name) {
  return contains(kFilters, name);
}
bool is_supported_test(std::string_view name) {
  return contains(kTests, name);
}

std::vector<StmtPtr> parse_template(std::string_view source) {
  if (source.size() > kMaxSourceBytes) {
    throw SyntaxError{"the template has " + std::to_string(source.size()) +
                          " bytes, over the limit of " + std::to_string(kMaxSourceBytes),
                      1};
  }
  return Parser(tokenize(source)).parse();
}

}  // namespace specrun::chat::jinja
