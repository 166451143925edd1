// The values a chat template computes with, and the Python semantics Jinja gives them: str() and
// repr(), truth, equality and ordering, JSON (transformers' tojson), and Jinja's Undefined.
//
// Data (None, bools, numbers, strings, lists, tuples, dicts) is immutable once built, as in
// transformers' ImmutableSandboxedEnvironment, so values share it freely. The mutable exceptions
// are namespace() objects and loop state; a namespace may hold data only, so no reference cycle
// can form.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace specrun::chat::jinja {

// The bounds on what one template may make the renderer do.
inline constexpr size_t kMaxSourceBytes = 1 << 20;
inline constexpr int kMaxBlockNesting = 64;
inline constexpr int kMaxExpressionDepth = 128;
inline constexpr int kMaxValueDepth = 64;
inline constexpr size_t kMaxStringBytes = 16 << 20;  // the output and every string computed
inline constexpr uint64_t kMaxSteps = 5'000'000;
inline constexpr int kMaxMacroDepth = 32;
inline constexpr int kMaxEvaluationDepth = 512;
inline constexpr int64_t kMaxRange = 100'000;  // Jinja's sandbox MAX_RANGE

// What Python would raise while rendering; the renderer adds the origin and the line.
struct Failure {
  std::string message;
};

// Counts the work of one rendering: each evaluation step, each item visited or made, each 16
// bytes read or written. Every operation whose cost grows with the size of its operands charges
// for it, so that the step limit bounds both the time and the memory a template takes.
class Budget {
 public:
  explicit Budget(uint64_t limit = kMaxSteps) : limit_(limit) {}
  void charge(uint64_t units) {
    steps_ += units;
    if (steps_ > limit_) throw_exhausted();
  }
  void charge_bytes(size_t bytes) { charge(1 + bytes / 16); }
  // Refuses a string of `bytes` (the output, or any string computed on the way).
  static void check_size(size_t bytes) {
    if (bytes > kMaxStringBytes) throw_too_large(bytes);
  }

 private:
  [[noreturn]] void throw_exhausted() const;
  [[noreturn]] static void throw_too_large(size_t bytes);
  uint64_t limit_;
  uint64_t steps_ = 0;
};

// What creating one string value costs: its bytes, and the allocation itself, which is larger than
// a short string's bytes.
inline constexpr uint64_t kStringValueCost = 3;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kSequence,
  kDict,
  kNamespace,
  kLoop,
  kFunction,
};

// The Python types a sequence value stands for: they print and behave differently.
enum class SequenceType : uint8_t {
  kList,
  kTuple,
  kGenerator,        // select, map, unique, items...: no len(), no indexing, one pass
  kReverseIterator,  // reverse of a list
  kDictItems,        // dict.items() and friends: views with len() but no indexing
  kDictKeys,
  kDictValues,
  kRange,
};

struct Sequence;
struct Dict;
struct LoopState;
struct Function;

struct Value {
  Kind kind = Kind::kUndefined;
  // kUndefined: the message Jinja raises when the value is used; kString: the text.
  std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const Sequence>, std::shared_ptr<const Dict>, std::shared_ptr<Dict>,
               std::shared_ptr<LoopState>, std::shared_ptr<const Function>>
      data;

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }

  bool boolean() const { return std::get<bool>(data); }
  int64_t integer() const { return std::get<int64_t>(data); }
  double number() const { return std::get<double>(data); }
  const std::string& text() const { return *std::get<std::shared_ptr<const std::string>>(data); }
  const std::string& undefined_message() const { return text(); }
  const Sequence& sequence() const { return *sequence_ptr(); }
  const std::shared_ptr<const Sequence>& sequence_ptr() const {
    return std::get<std::shared_ptr<const Sequence>>(data);
  }
  const Dict& dict() const { return *std::get<std::shared_ptr<const Dict>>(data); }
  Dict& attributes() const { return *std::get<std::shared_ptr<Dict>>(data); }
  const std::shared_ptr<Dict>& namespace_ptr() const {
    return std::get<std::shared_ptr<Dict>>(data);
  }
  LoopState& loop() const { return *std::get<std::shared_ptr<LoopState>>(data); }
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(data); }
  const std::shared_ptr<const Function>& function_ptr() const {
    return std::get<std::shared_ptr<const Function>>(data);
  }
};

struct Sequence {
  SequenceType type = SequenceType::kList;
  std::vector<Value> items;
  int depth = 1;                        // nesting of sequences and dicts, this one included
  bool plain = true;                    // only data inside (see is_plain_data)
  std::array<int64_t, 3> range_args{};  // kRange: start, stop, step
  mutable size_t consumed = 0;          // kGenerator, kReverseIterator: items already taken
};

// A Python dict: insertion-ordered, keyed by hashable values (None, bools, numbers, strings).
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  std::unordered_map<std::string, size_t> positions;  // hash_key(key) -> index in entries
  int depth = 1;
  bool plain = true;  // only data inside (see is_plain_data)

  // The value under `key`, or nullptr; throws Failure for an unhashable key.
  const Value* find(const Value& key, Budget& budget) const;
  // Sets `key` (a new key goes last, an existing one keeps its place); throws Failure for an
  // unhashable key.
  void set(const Value& key, Value value, Budget& budget);
};

// One running for loop, as the template sees it through `loop`.
struct LoopState {
  std::shared_ptr<const Sequence> items;
  size_t index0 = 0;
  std::optional<std::vector<Value>> last_changed;  // what loop.changed() saw last
};

struct Stmt;  // jinja_ast.h

enum class FunctionType : uint8_t {
  kRange,
  kNamespace,
  kDict,
  kRaiseException,
  kStrftimeNow,
  kMacro,   // a {% macro %} of the template
  kMethod,  // a method bound to `receiver`: "abc".upper, loop.cycle, dict.items...
};

struct Function {
  FunctionType type = FunctionType::kRange;
  std::string name;             // kMacro: its name; kMethod: the method
  const Stmt* macro = nullptr;  // kMacro: its definition, owned by the compiled template
  Value receiver;               // kMethod
};

Value make_undefined(std::string message);
Value make_none();
Value make_bool(bool value);
Value make_int(int64_t value);
Value make_float(double value);
Value make_string(std::string text);
// Throws Failure when the sequence would nest deeper than kMaxValueDepth.
Value make_sequence(SequenceType type, std::vector<Value> items);
Value make_list(std::vector<Value> items);
Value make_dict(Dict dict);  // dict.depth must be set (see depth_of)
Value make_namespace(Dict attributes);
Value make_function(Function function);

// The nesting depth a container holding `value` adds to (0 for scalars).
int depth_of(const Value& value);

// Whether `value` is data only: no namespace, loop or function at any depth. A namespace may hold
// only data, so that no reference cycle can form.
bool is_plain_data(const Value& value);

// Jinja's message for a missing attribute or item: "'dict object' has no attribute 'x'", "list
// object has no element 3".
std::string missing_message(const Value& object, const Value& name);
// Python's name of the value's type: str, int, list, dict, NoneType, generator...
std::string type_name(const Value& value);

// Python's bool(value).
bool truthy(const Value& value);

// Python's str(value) (the empty string for Undefined) and repr(value), appended to `out`.
void append_str(std::string& out, const Value& value, Budget& budget);
void append_repr(std::string& out, const Value& value, Budget& budget);
std::string to_str(const Value& value, Budget& budget);
// Python's repr() of a string and of a float.
void append_string_repr(std::string& out, std::string_view text);
std::string float_repr(double value);

// Python's ==, and < <= > >= (`op`), which throw Failure for types Python cannot order.
bool equals(const Value& left, const Value& right, Budget& budget);
bool compare_order(const Value& left, const Value& right, std::string_view op, Budget& budget);
bool less_than(const Value& left, const Value& right, Budget& budget);

// The key a hashable value has in a Dict (1, 1.0 and True are one key, as in Python); nullopt
// when Python would call it unhashable. Costs the size of the value.
std::optional<std::string> hash_key(const Value& value);

// transformers' tojson filter: json.dumps(value, ensure_ascii, indent, separators, sort_keys).
struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // per level; none: everything on one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& value, const JsonStyle& style, Budget& budget);

// The template's view of a JSON value (objects become dicts, arrays lists). Throws Failure for
// nesting deeper than kMaxValueDepth or an integer beyond 64 bits. Object members keep their order,
// as Python dicts keep insertion order and templates can see it (printing a dict, tojson, items()).
Value from_json(const nlohmann::ordered_json& json);

// The items a for loop or list() sees: a string's characters, a dict's keys, a sequence's items
// (a generator's remaining ones, which it gives up). Undefined is empty; anything else throws
// Failure ("'int' object is not iterable").
std::vector<Value> iterate(const Value& value, Budget& budget);

}  // namespace specrun::chat::jinja
