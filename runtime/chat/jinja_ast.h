// The parsed form of a chat template: statements holding expressions, each with its line for
// errors. Built by jinja_parser, walked by jinja_eval; immutable after parsing.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/chat/jinja_value.h"

namespace specrun::chat::jinja {

enum class ExprType : uint8_t {
  kLiteral,      // value
  kName,         // name; value: the Undefined it is when no scope defines it
  kList,         // children
  kTuple,        // children
  kDict,         // children: key, value, key, value...
  kGetAttr,      // children[0].name
  kGetItem,      // children[0][children[1]]
  kSlice,        // as the key of kGetItem: children start, stop, step (each may be null)
  kCall,         // children[0](children[1...], keywords)
  kFilter,       // children[0] | name(children[1...], keywords)
  kTest,         // children[0] is name(children[1...], keywords)
  kNot,          // children[0]
  kNegate,       // children[0]
  kPlus,         // children[0]
  kBinary,       // children[0] name children[1], name one of + - * / // % **
  kConcat,       // children joined with ~
  kCompare,      // children[0] operators[0] children[1] operators[1] children[2]...
  kAnd,          // children[0] and children[1]
  kOr,           // children[0] or children[1]
  kConditional,  // children[0] if children[1] else children[2] (null: no else)
  kBlockValue,   // the text a {% filter %} or {% set %} block rendered, as the filters' input
};

struct Expr {
  ExprType type = ExprType::kLiteral;
  int line = 0;
  int depth = 1;
  Value value;
  std::string name;
  std::vector<std::unique_ptr<Expr>> children;  // a null child is an omitted part
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> keywords;
  std::vector<std::string> operators;  // kCompare: == != < <= > >= in notin
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtType : uint8_t {
  kText,         // text
  kOutput,       // {{ value }}
  kIf,           // branches
  kFor,          // for target in value [if condition]: body [else: else_body]
  kSet,          // set target = value
  kSetBlock,     // set target [| value]: body
  kMacro,        // macro name(parameters = defaults): body
  kWith,         // with assignments: body
  kFilterBlock,  // filter value: body
  kScope,        // a body with its own scope ({% generation %})
  kBreak,
  kContinue,
};

// What a set or a for loop assigns: one name, several names to unpack, or a namespace
// attribute (names[0].attribute).
struct Target {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

struct Branch {
  ExprPtr test;  // null: else
  std::vector<StmtPtr> body;
};

struct Stmt {
  StmtType type = StmtType::kText;
  int line = 0;
  std::string text;
  ExprPtr value;      // kOutput, kSet, kFor (the iterable); kSetBlock, kFilterBlock: the filters
  ExprPtr condition;  // kFor: the filter
  Target target;
  std::vector<std::pair<Target, ExprPtr>> assignments;  // kWith
  std::vector<Branch> branches;                         // kIf
  std::vector<StmtPtr> body;
  std::vector<StmtPtr> else_body;
  std::string name;                     // kMacro
  std::vector<std::string> parameters;  // kMacro
  std::vector<ExprPtr> defaults;        // kMacro: for the last defaults.size() parameters
};

}  // namespace specrun::chat::jinja
