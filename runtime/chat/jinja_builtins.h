// What a chat template can do to values, with the semantics Jinja 2 running on Python gives it:
// attribute and item access (through transformers' immutable sandbox), Python's operators, and
// the filters, tests, functions and methods of the supported subset. Each throws Failure where
// Python would raise, with Python's message where a template could show it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/chat/jinja_value.h"

namespace specrun::chat::jinja {

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// `object.name` and `object[key]` as Jinja's sandboxed getattr/getitem: a dict key is reachable
// as an attribute and a method as an item; what is missing is an Undefined naming it.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key, Budget& budget);
// `object[start:stop:step]` (each may be None).
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step,
                Budget& budget);

// Python's binary + - * / // % ** on the operands.
Value binary_operation(std::string_view op, const Value& left, const Value& right, Budget& budget);
// Python's unary - and +.
Value unary_operation(std::string_view op, const Value& operand);
// Python's == != < <= > >= in and not in (op "notin").
bool compare(std::string_view op, const Value& left, const Value& right, Budget& budget);

Value apply_filter(const std::string& name, const Value& operand, const Arguments& arguments,
                   Budget& budget);
bool apply_test(const std::string& name, const Value& operand, const Arguments& arguments,
                Budget& budget);

// The global functions and bound methods (everything but macros, which the renderer calls).
Value call_function(const Function& function, const Arguments& arguments, Budget& budget);

// The globals Jinja and transformers define: range, namespace, dict, raise_exception,
// strftime_now. A name that is none of them yields nullopt.
std::optional<Value> global_function(const std::string& name);

}  // namespace specrun::chat::jinja
