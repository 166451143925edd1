#include "runtime/chat/jinja_eval.h"

#include <unordered_map>

#include "runtime/chat/jinja_builtins.h"

namespace specrun::chat::jinja {
namespace {

// The variables one block sees: its own, then its parent's.
struct Scope {
  std::unordered_map<std::string, Value> variables;
  const Scope* parent = nullptr;

  const Value* find(const std::string& name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent) {
      const auto found = scope->variables.find(name);
      if (found != scope->variables.end()) return &found->second;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  template <typename Json>
  std::string render(const std::vector<StmtPtr>& program, const Json& context) {
    if (!context.is_object()) throw RenderError{"the context must be a JSON object", 0};
    try {
      Scope root;
      for (const auto& [name, value] : context.items()) root.variables[name] = from_json(value);
      root_ = &root;
      std::string out;
      out_ = &out;
      exec_body(program, root);
      return out;
    } catch (const Failure& failure) {
      throw RenderError{failure.message, line_};
    }
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Bounds the recursion of statements, expressions and macro calls together.
  class Nesting {
   public:
    explicit Nesting(Renderer& renderer) : renderer_(renderer) {
      if (++renderer_.depth_ > kMaxEvaluationDepth) {
        throw Failure{"evaluation nests deeper than " + std::to_string(kMaxEvaluationDepth)};
      }
    }
    ~Nesting() { --renderer_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Renderer& renderer_;
  };

  // Sends output to a buffer of its own while alive (the body of a set, filter or macro).
  class Capture {
   public:
    Capture(Renderer& renderer, std::string& buffer) : renderer_(renderer), saved_(renderer.out_) {
      renderer_.out_ = &buffer;
    }
    ~Capture() { renderer_.out_ = saved_; }
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;

   private:
    Renderer& renderer_;
    std::string* saved_;
  };

  void emit(std::string_view text) {
    budget_.charge_bytes(text.size());
    out_->append(text);
    Budget::check_size(out_->size());
  }

  std::string capture(const std::vector<StmtPtr>& body, Scope& scope) {
    std::string buffer;
    Capture capture(*this, buffer);
    exec_body(body, scope);
    return buffer;
  }

  // ---- statements ----------------------------------------------------------------------------

  Flow exec_body(const std::vector<StmtPtr>& body, Scope& scope) {
    for (const StmtPtr& stmt : body) {
      const Flow flow = exec(*stmt, scope);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& stmt, Scope& scope) {
    Nesting nesting(*this);
    budget_.charge(1);
    line_ = stmt.line;
    switch (stmt.type) {
      case StmtType::kText:
        emit(stmt.text);
        break;
      case StmtType::kOutput: {
        const Value value = eval(*stmt.value, scope);
        line_ = stmt.line;
        append_str(*out_, value, budget_);
        Budget::check_size(out_->size());
        break;
      }
      case StmtType::kIf:
        for (const Branch& branch : stmt.branches) {
          if (!branch.test || truthy(eval(*branch.test, scope))) {
            return exec_body(branch.body, scope);
          }
        }
        break;
      case StmtType::kFor:
        return exec_for(stmt, scope);
      case StmtType::kSet: {
        Value value = eval(*stmt.value, scope);
        line_ = stmt.line;
        assign(stmt.target, std::move(value), scope);
        break;
      }
      case StmtType::kSetBlock: {
        Scope inner{{}, &scope};
        Value value = make_string(capture(stmt.body, inner));
        line_ = stmt.line;
        if (stmt.value) value = eval_on_block(*stmt.value, scope, std::move(value));
        assign(stmt.target, std::move(value), scope);
        break;
      }
      case StmtType::kMacro: {
        Function macro;
        macro.type = FunctionType::kMacro;
        macro.name = stmt.name;
        macro.macro = &stmt;
        scope.variables[stmt.name] = make_function(std::move(macro));
        break;
      }
      case StmtType::kWith: {
        Scope inner{{}, &scope};
        std::vector<Value> values;
        for (const auto& [target, expr] : stmt.assignments) values.push_back(eval(*expr, scope));
        line_ = stmt.line;
        for (size_t i = 0; i < values.size(); ++i) {
          assign(stmt.assignments[i].first, std::move(values[i]), inner);
        }
        return exec_body(stmt.body, inner);
      }
      case StmtType::kFilterBlock: {
        Scope inner{{}, &scope};
        Value text = make_string(capture(stmt.body, inner));
        line_ = stmt.line;
        const Value value = eval_on_block(*stmt.value, scope, std::move(text));
        append_str(*out_, value, budget_);
        Budget::check_size(out_->size());
        break;
      }
      case StmtType::kScope: {
        Scope inner{{}, &scope};
        return exec_body(stmt.body, inner);
      }
      case StmtType::kBreak:
        return Flow::kBreak;
      case StmtType::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& stmt, Scope& scope) {
    const Value iterable = eval(*stmt.value, scope);
    line_ = stmt.line;
    std::vector<Value> items = iterate(iterable, budget_);
    if (stmt.condition) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope probe{{}, &scope};
        assign(stmt.target, item, probe);
        if (truthy(eval(*stmt.condition, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Scope inner{{}, &scope};
      return exec_body(stmt.else_body, inner);
    }
    auto sequence = std::make_shared<Sequence>();
    sequence->items = std::move(items);
    auto loop = std::make_shared<LoopState>();
    loop->items = sequence;
    const Value loop_value{Kind::kLoop, loop};
    for (size_t i = 0; i < sequence->items.size(); ++i) {
      // An iteration makes a scope and binds the target and `loop` in it.
      budget_.charge(2 + stmt.target.names.size());
      loop->index0 = i;
      Scope iteration{{}, &scope};
      line_ = stmt.line;
      assign(stmt.target, sequence->items[i], iteration);
      iteration.variables["loop"] = loop_value;
      if (exec_body(stmt.body, iteration) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void assign(const Target& target, Value value, Scope& scope) {
    if (!target.attribute.empty()) {
      const Value* object = scope.find(target.names.front());
      if (object == nullptr || object->kind != Kind::kNamespace) {
        throw Failure{"cannot assign attribute on non-namespace object"};
      }
      if (target.attribute[0] == '_') {
        throw Failure{
            "Chat templates cannot store underscore-prefixed attributes on a "
            "namespace, but got '" +
            target.attribute + "'. Please rename the attribute."};
      }
      if (!is_plain_data(value)) {
        throw Failure{
            "a namespace attribute may hold only data (None, booleans, numbers, "
            "strings, and lists and dicts of them)"};
      }
      object->attributes().set(make_string(target.attribute), std::move(value), budget_);
      return;
    }
    if (!target.unpack) {
      scope.variables[target.names.front()] = std::move(value);
      return;
    }
    if (!value.is_undefined() && !value.is_string() && value.kind != Kind::kSequence &&
        value.kind != Kind::kDict) {
      throw Failure{"cannot unpack non-iterable " + type_name(value) + " object"};
    }
    std::vector<Value> items = iterate(value, budget_);
    const size_t expected = target.names.size();
    if (items.size() < expected) {
      throw Failure{"not enough values to unpack (expected " + std::to_string(expected) + ", got " +
                    std::to_string(items.size()) + ")"};
    }
    if (items.size() > expected) {
      throw Failure{"too many values to unpack (expected " + std::to_string(expected) + ")"};
    }
    for (size_t i = 0; i < expected; ++i) scope.variables[target.names[i]] = std::move(items[i]);
  }

  // ---- expressions ---------------------------------------------------------------------------

  // Evaluates the filters of a {% set %} or {% filter %} block on the text its body rendered.
  Value eval_on_block(const Expr& filters, Scope& scope, Value text) {
    std::optional<Value> saved = std::move(block_value_);
    block_value_ = std::move(text);
    Value result = eval(filters, scope);
    block_value_ = std::move(saved);
    return result;
  }

  Arguments eval_arguments(const Expr& expr, Scope& scope) {
    Arguments arguments;
    for (size_t i = 1; i < expr.children.size(); ++i) {
      arguments.positional.push_back(eval(*expr.children[i], scope));
    }
    for (const auto& [name, value] : expr.keywords) {
      arguments.keywords.emplace_back(name, eval(*value, scope));
    }
    return arguments;
  }

  Value lookup(const Expr& name, const Scope& scope) {
    if (const Value* found = scope.find(name.name)) return *found;
    if (std::optional<Value> function = global_function(name.name)) return *function;
    return name.value;
  }

  std::vector<Value> eval_children(const Expr& expr, Scope& scope) {
    std::vector<Value> values;
    values.reserve(expr.children.size());
    for (const ExprPtr& child : expr.children) values.push_back(eval(*child, scope));
    budget_.charge(values.size());
    return values;
  }

  Value eval(const Expr& expr, Scope& scope) {
    Nesting nesting(*this);
    budget_.charge(1);
    line_ = expr.line;
    switch (expr.type) {
      case ExprType::kLiteral:
        return expr.value;
      case ExprType::kName:
        return lookup(expr, scope);
      case ExprType::kList:
        return make_list(eval_children(expr, scope));
      case ExprType::kTuple:
        return make_sequence(SequenceType::kTuple, eval_children(expr, scope));
      case ExprType::kDict: {
        const std::vector<Value> parts = eval_children(expr, scope);
        line_ = expr.line;
        Dict dict;
        for (size_t i = 0; i + 1 < parts.size(); i += 2) dict.set(parts[i], parts[i + 1], budget_);
        return make_dict(std::move(dict));
      }
      case ExprType::kGetAttr: {
        const Value object = eval(*expr.children[0], scope);
        line_ = expr.line;
        return get_attribute(object, expr.name);
      }
      case ExprType::kGetItem: {
        const Value object = eval(*expr.children[0], scope);
        const Expr& key = *expr.children[1];
        if (key.type == ExprType::kSlice) {
          const auto bound = [&](size_t index) {
            return key.children[index] ? eval(*key.children[index], scope) : make_none();
          };
          const Value start = bound(0);
          const Value stop = bound(1);
          const Value step = bound(2);
          line_ = expr.line;
          return get_slice(object, start, stop, step, budget_);
        }
        const Value index = eval(key, scope);
        line_ = expr.line;
        return get_item(object, index, budget_);
      }
      case ExprType::kSlice:
        throw Failure{"a slice is only valid inside [ ]"};
      case ExprType::kCall: {
        const Value callee = eval(*expr.children[0], scope);
        const Arguments arguments = eval_arguments(expr, scope);
        line_ = expr.line;
        return call(callee, arguments);
      }
      case ExprType::kFilter: {
        const Value operand = eval(*expr.children[0], scope);
        const Arguments arguments = eval_arguments(expr, scope);
        line_ = expr.line;
        return apply_filter(expr.name, operand, arguments, budget_);
      }
      case ExprType::kTest: {
        const Value operand = eval(*expr.children[0], scope);
        const Arguments arguments = eval_arguments(expr, scope);
        line_ = expr.line;
        return make_bool(apply_test(expr.name, operand, arguments, budget_));
      }
      case ExprType::kNot:
        return make_bool(!truthy(eval(*expr.children[0], scope)));
      case ExprType::kNegate:
      case ExprType::kPlus: {
        const Value operand = eval(*expr.children[0], scope);
        line_ = expr.line;
        return unary_operation(expr.type == ExprType::kNegate ? "-" : "+", operand);
      }
      case ExprType::kBinary: {
        const Value left = eval(*expr.children[0], scope);
        const Value right = eval(*expr.children[1], scope);
        line_ = expr.line;
        return binary_operation(expr.name, left, right, budget_);
      }
      case ExprType::kConcat: {
        std::string out;
        for (const ExprPtr& part : expr.children) {
          append_str(out, eval(*part, scope), budget_);
          Budget::check_size(out.size());
        }
        return make_string(std::move(out));
      }
      case ExprType::kCompare: {
        Value left = eval(*expr.children[0], scope);
        for (size_t i = 0; i < expr.operators.size(); ++i) {
          Value right = eval(*expr.children[i + 1], scope);
          line_ = expr.line;
          if (!compare(expr.operators[i], left, right, budget_)) return make_bool(false);
          left = std::move(right);
        }
        return make_bool(true);
      }
      case ExprType::kAnd: {
        Value left = eval(*expr.children[0], scope);
        if (!truthy(left)) return left;
        return eval(*expr.children[1], scope);
      }
      case ExprType::kOr: {
        Value left = eval(*expr.children[0], scope);
        if (truthy(left)) return left;
        return eval(*expr.children[1], scope);
      }
      case ExprType::kConditional:
        if (truthy(eval(*expr.children[1], scope))) return eval(*expr.children[0], scope);
        if (expr.children[2]) return eval(*expr.children[2], scope);
        return make_undefined("the inline if-expression on line " + std::to_string(expr.line) +
                              " evaluated to false and no else section was defined.");
      case ExprType::kBlockValue:
        if (!block_value_) throw Failure{"no block text here"};
        return *block_value_;
    }
    throw Failure{"unknown expression"};
  }

  Value call(const Value& callee, const Arguments& arguments) {
    if (callee.is_undefined()) throw Failure{callee.undefined_message()};
    if (callee.kind != Kind::kFunction) {
      throw Failure{"'" + type_name(callee) + "' object is not callable"};
    }
    const Function& function = callee.function();
    if (function.type == FunctionType::kMacro) return call_macro(*function.macro, arguments);
    return call_function(function, arguments, budget_);
  }

  // A macro's body renders in a scope of its own over the template's top-level variables, with
  // the parameters bound; it returns what the body wrote.
  Value call_macro(const Stmt& macro, const Arguments& arguments) {
    if (macro_depth_ >= kMaxMacroDepth) {
      throw Failure{"macro calls nest deeper than " + std::to_string(kMaxMacroDepth)};
    }
    const std::vector<std::string>& parameters = macro.parameters;
    if (arguments.positional.size() > parameters.size()) {
      throw Failure{"macro '" + macro.name + "' takes not more than " +
                    std::to_string(parameters.size()) + " argument(s)"};
    }
    Scope local{{}, root_};
    for (size_t i = 0; i < arguments.positional.size(); ++i) {
      local.variables[parameters[i]] = arguments.positional[i];
    }
    for (const auto& [name, value] : arguments.keywords) {
      const auto found = std::find(parameters.begin(), parameters.end(), name);
      if (found == parameters.end()) {
        throw Failure{"macro '" + macro.name + "' takes no keyword argument '" + name + "'"};
      }
      if (local.variables.count(name) != 0) {
        throw Failure{"macro '" + macro.name + "' got multiple values for argument '" + name + "'"};
      }
      local.variables[name] = value;
    }
    const size_t first_default = parameters.size() - macro.defaults.size();
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (local.variables.count(parameters[i]) != 0) continue;
      local.variables[parameters[i]] =
          i >= first_default ? eval(*macro.defaults[i - first_default], local)
                             : make_undefined("parameter '" + parameters[i] + "' was not provided");
    }
    ++macro_depth_;
    std::string text;
    try {
      text = capture(macro.body, local);
    } catch (...) {
      --macro_depth_;
      throw;
    }
    --macro_depth_;
    return make_string(std::move(text));
  }

  Budget budget_;
  std::string* out_ = nullptr;
  const Scope* root_ = nullptr;
  std::optional<Value> block_value_;
  int line_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

std::string render_template(const std::vector<StmtPtr>& program,
                            const nlohmann::ordered_json& context) {
  return Renderer().render(program, context);
}

}  // namespace specrun::chat::jinja
